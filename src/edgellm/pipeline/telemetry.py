"""The end of a request, told once to everything that watches: its metrics, its span and its log
line. When the answer is whole, or when a streamed body ends (however it ends), so a stream's
tokens and duration are its own; a client that left is told as a 499."""

from __future__ import annotations

import asyncio

from ..access.logs import log_request
from ..access.usage import CLIENT_LEFT
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from ..stream import Stream
from ..telemetry import tracing
from ..telemetry.metrics import served_by
from . import Next


async def telemetry(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    ctx.started = deps.clock.now()
    try:
        response = await call_next(request, deps, ctx)
    except asyncio.CancelledError:  # the client left before its answer: still its metrics and its log line
        request_ended(request, ctx, Response(CLIENT_LEFT), deps)
        raise
    body = response.body
    if isinstance(body, Stream) and not body.closed:
        # told when the body ends: registered after the usage record's (an inner layer), so it runs after it
        body.on_close(lambda: request_ended(request, ctx, response, deps))
    else:  # a whole answer, or a body handed over unread (an R2 file): it ends, for these counts, when its headers go
        request_ended(request, ctx, response, deps)
    return response


def request_ended(request: Request, ctx: RequestContext, response: Response, deps: Deps) -> None:
    now = ctx.ended if ctx.ended is not None else deps.clock.now()  # the usage record's time, when it read one
    telemetry = deps.state.telemetry
    principal, seen, span, started, route = ctx.principal, ctx.observed, ctx.span, ctx.started, ctx.route
    tenant = principal.tenant if principal is not None else ""
    if tenant and tenant not in telemetry.tenants:  # a tenant already labelled is its own label
        tenant = telemetry.tenant_label(tenant)
    model = seen.model if seen is not None else ""
    telemetry.count_request(route, model, tenant, response.status)
    if seen is not None:
        where = "cache" if seen.cache_status == "HIT" else served_by(seen.route, seen.cache_status)
        if seen.cache_status != "HIT":
            telemetry.count_tokens(model, tenant, seen.prompt_tokens, seen.completion_tokens)
            telemetry.count_routed(where)
        latency = now - started if now > started else 0.0
        if seen.first_token_at is not None:
            ttft: float | None = max(0.0, seen.first_token_at - started)
        else:  # an answer replayed from its kept JSON (no event read): its first token came with it
            ttft = latency if seen.finished and seen.generated else None
        telemetry.observe_times(model, where, ttft, latency)
    if span is not None and deps.tracer.recording:
        span.set("http.route", route)
        span.set("http.response.status_code", response.status)
        span.set("edgellm.request_id", ctx.id)
        if principal is not None:
            span.set("edgellm.tenant", principal.tenant)
        if seen is not None:
            span.set(tracing.GEN_AI_RESPONSE_MODEL, seen.model)
            span.set(tracing.GEN_AI_INPUT_TOKENS, seen.prompt_tokens)
            span.set(tracing.GEN_AI_OUTPUT_TOKENS, seen.completion_tokens)
            span.set("edgellm.cache_status", seen.cache_status)
            span.set("edgellm.served_by", served_by(seen.route, seen.cache_status))
        span.end(f"HTTP {response.status}" if response.status >= 500 else None)
    log_request(request, ctx, response, deps, now)
