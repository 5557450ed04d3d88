"""The end of a request, told once to everything that watches: its metrics, its span and its log
line. `app.handle` calls `request_ended` when the answer is whole, or has it called when a
streamed body ends (however it ends), so a stream's tokens and duration are its own."""

from __future__ import annotations

from ..access.logs import log_request
from ..deps import Deps
from ..http import Request, Response
from ..stream import Stream
from . import tracing
from .metrics import served_by


def request_ended(request: Request, response: Response, deps: Deps, started: float, route: str, handler: str) -> None:
    now = deps.clock.now()
    telemetry = deps.state.telemetry
    principal, seen, span = request.principal, request.observed, request.span
    tenant = telemetry.tenant_label(principal.tenant if principal is not None else None)
    model = seen.model if seen is not None else ""
    telemetry.count_request(route, model, tenant, response.status)
    if seen is not None:
        where = served_by(seen.route, seen.cache_status)
        if seen.cache_status != "HIT":
            telemetry.count_tokens(model, tenant, seen.prompt_tokens, seen.completion_tokens)
            telemetry.count_routed(where)
        latency = max(0.0, now - started)
        if seen.first_token_at is not None:
            ttft: float | None = max(0.0, seen.first_token_at - started)
        else:  # an answer replayed from its kept JSON (no event read): its first token came with it
            ttft = latency if seen.finished and seen.generated else None
        telemetry.observe_times(model, where, ttft, latency)
    if span is not None and deps.tracer.recording:
        span.set("http.route", route)
        span.set("http.response.status_code", response.status)
        span.set("edgellm.request_id", request.id)
        if principal is not None:
            span.set("edgellm.tenant", principal.tenant)
        if seen is not None:
            span.set(tracing.GEN_AI_RESPONSE_MODEL, seen.model)
            span.set(tracing.GEN_AI_INPUT_TOKENS, seen.prompt_tokens)
            span.set(tracing.GEN_AI_OUTPUT_TOKENS, seen.completion_tokens)
            span.set("edgellm.cache_status", seen.cache_status)
            span.set("edgellm.served_by", served_by(seen.route, seen.cache_status))
        span.end(f"HTTP {response.status}" if response.status >= 500 else None)
    log_request(request, response, deps, started, handler, route)


def when_ended(request: Request, response: Response, deps: Deps, started: float, route: str, handler: str) -> None:
    """`request_ended` now, or when the streamed body ends: a body the core streams is a `Stream`,
    whose close runs after the usage record's (registered first, by `access.account`). A body it
    hands over unread (an R2 file) ends, for these counts, when its headers go."""
    body = response.body
    if isinstance(body, Stream) and not body.closed:
        body.on_close(lambda: request_ended(request, response, deps, started, route, handler))
    else:
        request_ended(request, response, deps, started, route, handler)
