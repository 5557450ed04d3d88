"""HEAD: a GET's answer without its body, saying the length the body would have had."""

from __future__ import annotations

from typing import Awaitable

from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next, only_for


@only_for("HEAD")
def head(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Awaitable[Response]:
    if request.method != "HEAD":  # nothing to do (in a stack composed without its declaration)
        return call_next(request, deps, ctx)
    return _without_body(call_next, request, deps, ctx)


async def _without_body(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    response = await call_next(request, deps, ctx)
    if not response.is_streaming:  # a streamed body (an R2 file) says its own length
        response.headers.setdefault("content-length", str(len(response.body)))
        response.body = b""
    return response
