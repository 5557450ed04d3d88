"""CORS headers on every answer (`access.cors`: the API only to allowed origins, artifacts to all)."""

from __future__ import annotations

from ..access.cors import cors_headers
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


async def cors(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    response = await call_next(request, deps, ctx)
    headers = response.headers
    for name, value in cors_headers(request, deps.config).items():
        headers.setdefault(name, value)
    return response
