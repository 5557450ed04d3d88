"""HEAD: a GET's answer without its body, saying the length the body would have had."""

from __future__ import annotations

from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


async def head(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    response = await call_next(request, deps, ctx)
    if request.method == "HEAD" and not response.is_streaming:  # a streamed body (an R2 file) says its own length
        response.headers.setdefault("content-length", str(len(response.body)))
        response.body = b""
    return response
