"""The one place a `GatewayError`, or any unexpected exception, becomes an answer: the OpenAI error
JSON (or the route's own envelope, Cloudflare's on the REST route) naming the request id; never a
traceback, never a bare 500. Inside the usage and telemetry layers, so errors are counted and
recorded as answers; outside authentication and the router, whose refusals it renders."""

from __future__ import annotations

from ..caller import Observation
from ..context import RequestContext
from ..deps import Deps
from ..errors import ErrorKind, GatewayError
from ..http import Request, Response
from . import Next


async def errors(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    try:
        return await call_next(request, deps, ctx)
    except GatewayError as error:
        if error.detail:  # a binding's own text: for the operator, never the client
            deps.log.warning("%s %s: %s", request.method, request.path, error.detail)
        if error.binding == "r2":
            deps.state.telemetry.r2_errors += 1
        if error.spent and ctx.reservation is not None and ctx.observed is None:
            # the generation may have run to its end (a whole answer past its deadline): its usage
            # is settled as for a client that left before its JSON answer, at its reservation
            ctx.observed = Observation(ctx.reservation.model, "")
        return error_response(request, ctx, error)
    except Exception as exc:  # the last line of defence (a client that left is a CancelledError: not caught)
        deps.log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(request, ctx, GatewayError(ErrorKind.SERVER, f"Internal error: {type(exc).__name__}.", code="internal_error"))


def error_response(request: Request, ctx: RequestContext, error: GatewayError) -> Response:
    error.request_id = ctx.id  # the body names it: the id a client quotes to find the log line
    render = ctx.router.error_renderer(request.path)  # the route says how its errors render; else OpenAI's `error`
    return render(error) if render else error.to_response()
