"""The request's id (`x-request-id` on every answer, named in error bodies and the log line) and,
when something reads one, its span: under the client's W3C trace when it sent a `traceparent`."""

from __future__ import annotations

from ..access.logs import request_id as id_of
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from ..telemetry import tracing
from . import Next


async def request_id(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    ctx.id = id_of(request, deps.state.request_ids)
    if deps.tracer.recording or deps.config.routing.origins:
        # a span only when a tracer records it or an origin may be sent its trace (origins are
        # the only calls that carry one): current for what the request calls. Otherwise none:
        # the log line works out the trace id it names itself.
        ctx.span = tracing.request_span(deps.tracer, deps.state.ids, request.method, request.headers.get("traceparent"))
        tracing.enter(ctx.span)
    response = await call_next(request, deps, ctx)
    response.headers["x-request-id"] = ctx.id
    return response
