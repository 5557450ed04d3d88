"""CORS headers on every answer (`access.cors`: the API only to allowed origins, artifacts to all)."""

from __future__ import annotations

from ..access.cors import cors_headers, is_artifact_path
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


async def cors(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    response = await call_next(request, deps, ctx)
    headers = response.headers
    if "origin" not in request.headers and not is_artifact_path(request.path):
        # no origin to allow (not a browser's cross-origin call): what `cors_headers` says then, without its call
        headers.setdefault("vary", "Origin")
        return response
    for name, value in cors_headers(request, deps.config).items():
        headers.setdefault(name, value)
    return response
