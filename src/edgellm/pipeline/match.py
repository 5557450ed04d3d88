"""The route: which handler serves the request (else a 404, or a 405 with `Allow`, before any
credential is read), its path parameters, and the route's template for usage and metrics: never
the raw path, whose ids would make every request its own value."""

from __future__ import annotations

from typing import Awaitable

from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


def match(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Awaitable[Response]:
    path = request.path
    route, ctx.params = ctx.router.resolve(request.method, path)
    ctx.endpoint = route.handler
    ctx.handler = route.name
    ctx.route = "workers-ai" if path.startswith("/client/v4/") else route.template
    return call_next(request, deps, ctx)
