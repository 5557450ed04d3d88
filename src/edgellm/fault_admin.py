"""`GET|POST /admin/faults`: read or replace the plan of the fault injector in front of the AI
binding (bearer ADMIN_TOKEN). A core route over the `FaultControl` port, so it holds to the
edge's own guards, authentication and error JSON; only the local edge has an injector
(`edgellm dev --fault`), so on Cloudflare (`Deps.faults` None) the route is a 404."""

from __future__ import annotations

from .cache.admin import require_admin
from .deps import Deps
from .errors import ErrorKind, GatewayError, invalid
from .context import RequestContext
from .http import Request, Response, json_response
from .ports import FaultControl
from .validation import loads_bounded


def _faults(request: Request, deps: Deps, ctx: RequestContext) -> FaultControl:
    if deps.faults is None:  # no injector here: the route is not there (as the router says of any unknown path)
        raise GatewayError(ErrorKind.NOT_FOUND, f"No route for {request.method} {request.path}.", code="route_not_found")
    require_admin(request, deps, ctx)
    return deps.faults


def _answer(faults: FaultControl) -> Response:
    return json_response({"object": "faults", **faults.state()})


async def faults(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """One route entry for both methods (the OpenAPI document is checked against the router's
    table, one row per path): GET (and HEAD) reads the plan, POST replaces it."""
    return await (set_faults if request.method == "POST" else get_faults)(request, deps, ctx)


async def get_faults(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    return _answer(_faults(request, deps, ctx))


async def set_faults(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    """Replace the plan; an empty body puts the default (no faults) back."""
    faults = _faults(request, deps, ctx)
    plan = loads_bounded(request.body) if request.body.strip() else {}
    if not isinstance(plan, dict):
        raise invalid("Bad fault plan: send a JSON object of rates and options.")
    try:
        faults.replace_plan(plan)
    except (ValueError, TypeError) as exc:
        raise invalid(f"Bad fault plan: {exc}") from exc
    return _answer(faults)
