"""A CORS preflight (`OPTIONS`) is answered here, for any route that exists (else its 404 or 405),
without authentication: a browser sends no credentials with it."""

from __future__ import annotations

from typing import Awaitable

from ..access.cors import cors_headers
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next, only_for


@only_for("OPTIONS")
def preflight(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Awaitable[Response]:
    if request.method != "OPTIONS":
        return call_next(request, deps, ctx)
    ctx.handler = "preflight"
    return _answer(request, deps, ctx)


async def _answer(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    asked = request.header("access-control-request-method")
    ctx.router.resolve("GET" if asked in (None, "HEAD") else asked or "GET", request.path)
    return Response(204, {
        **cors_headers(request, deps.config),
        "access-control-allow-methods": "GET, HEAD, POST, DELETE, OPTIONS",
        "access-control-allow-headers": request.header("access-control-request-headers") or "*",
        "access-control-max-age": "86400",
    })
