"""One structured log record per request, written when it ends (a stream: when its body ends):
its request id (the operator's: Cloudflare's `cf-ray`, else the isolate's own), the client's own
`x-request-id` beside it, its trace id, who asked (tenant, key), what served it (model, route, cache status),
its status, tokens, time to first token and duration. Never the prompt or the answer, unless the
operator asks for prompts (`LOG_PROMPTS`, `edgellm dev --log-prompts`). The local edge formats the
same record as a readable line or writes it as JSON (`edgellm_local.emulator.access_log`)."""

from __future__ import annotations

import json
import logging
import re
from functools import lru_cache
from typing import Any

from ..context import RequestContext
from ..http import Request, Response
from ..deps import Deps
from ..guardrails.dlp import MAX_SPAN, redact
from ..ids import RequestIds
from ..telemetry.tracing import parse_traceparent

# a client's own id is kept when it is one a log search can hold (W3C and most tracers' ids fit)
_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
PROMPT_CHARS = 4096  # the most of a prompt a log line carries (`log_prompts`)


# A scrape of `/metrics` that was answered is logged at DEBUG: Prometheus asks every few seconds,
# and exporters (prometheus_client's handler, Go's promhttp) write no line per scrape. A refused
# scrape is an access attempt like any other, logged at INFO.
SCRAPE_ROUTE = "/metrics"


def request_id(request: Request, ids: RequestIds) -> str:
    """The id the operator's logs key on and the answer's `x-request-id` carries: Cloudflare's
    `cf-ray` (set by Cloudflare's edge, never by the client), else a new one of the isolate's
    (`IsolateState.request_ids`). A client's `x-request-id` never takes its place, or a caller
    could choose, or collide with, the id of another's log line: it is kept beside it
    (`client_request_id`)."""
    value = request.headers.get("cf-ray")
    if value and _ID.match(value):
        return value
    return ids.new()


def client_request_id(request: Request) -> str | None:
    """The client's own `x-request-id`, when it is one a log search can hold."""
    value = request.headers.get("x-request-id")
    return value if value and _ID.match(value) else None


class _AsJson:
    """The record's JSON, made when a handler formats the line (the local edge formats in a
    thread of its own, off the request's path), not when the request logs it."""

    __slots__ = ("record",)

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    def __str__(self) -> str:
        return json.dumps(self.record, separators=(",", ":"), ensure_ascii=False)


def prompt_of(request: Request) -> Any:
    """What the request asked (its `messages`, `prompt` or `input`), cut to `PROMPT_CHARS`, its
    secrets and personal data redacted (`guardrails.dlp.redact`): only for an operator who turned
    `log_prompts` on."""
    try:
        body = json.loads(request.body or b"{}")
    except ValueError:
        return None
    if not isinstance(body, dict):
        return None
    asked = next((body[k] for k in ("messages", "prompt", "input") if k in body), None)
    if asked is None:
        return None
    text = asked if isinstance(asked, str) else json.dumps(asked, ensure_ascii=False)
    # findings redacted whatever the policy (a secret or a card never reaches a log): read with
    # the longest finding's room past the cut, so none is cut in two and missed
    return redact(text[:PROMPT_CHARS + MAX_SPAN])[:PROMPT_CHARS]


def trace_id(request: Request, ctx: RequestContext, deps: Deps) -> str:
    """The request's W3C trace id: its span's when it has one, else the client's `traceparent`'s,
    else a new one (the isolate's ids: no span is made for a line alone)."""
    if ctx.span is not None:
        return ctx.span.context.trace_id
    sent = parse_traceparent(request.headers.get("traceparent"))
    return sent.trace_id if sent is not None else deps.state.ids.hex(16)


@lru_cache(maxsize=16)  # a logger per runtime (and per test): never more than a few
def access_logger(log: logging.Logger) -> logging.Logger:
    """`log`'s `access` child, where the lines go: looked up once, not per request (`getChild`
    takes the logging module's lock and builds the name each time)."""
    return log.getChild("access")


def log_request(request: Request, ctx: RequestContext, response: Response, deps: Deps, now: float | None = None) -> dict[str, Any] | None:
    """The request's line: what `ctx` learned of it (its id, route, handler, caller, observation),
    its answer's status and cache status, and its time from `ctx.started` to `now` (the clock's
    time when the caller has read it)."""
    logger = access_logger(deps.log)
    level = logging.DEBUG if ctx.route == SCRAPE_ROUTE and response.status < 400 else logging.INFO
    if not logger.isEnabledFor(level):
        return None
    principal, seen, started, handler = ctx.principal, ctx.observed, ctx.started, ctx.handler
    if now is None:
        now = deps.clock.now()
    record = {
        "request_id": ctx.id or request_id(request, deps.state.request_ids),
        "client_request_id": client_request_id(request),
        "trace_id": trace_id(request, ctx, deps),
        "method": request.method, "path": request.path[:256], "status": response.status,
        "cache": response.headers.get("cf-aig-cache-status", "-"), "route": ctx.route, "handler": handler,
        "ms": round(max(0.0, now - started) * 1000, 1),
        "ttft_ms": round(max(0.0, seen.first_token_at - started) * 1000, 1) if seen is not None and seen.first_token_at else None,
        "tenant": principal.tenant if principal else None, "key_id": principal.key_id if principal else None,
        "model": seen.model if seen is not None else response.headers.get("x-edgellm-model"),
        "prompt_tokens": seen.prompt_tokens if seen is not None else None,
        "completion_tokens": seen.completion_tokens if seen is not None else None,
    }
    if deps.config.log_prompts:
        record["prompt"] = prompt_of(request)
    logger.log(level, "%s", _AsJson(record), extra={"edgellm": record})
    return record
