"""Usage: the request's record and its tokens charged, when it is answered (a stream: when its
body ends, however it ends), or when its client left before its answer (`access.usage`)."""

from __future__ import annotations

import asyncio

from ..access.usage import account, departed
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


async def usage(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    try:
        response = await call_next(request, deps, ctx)
    except asyncio.CancelledError:  # the client left: still a usage row, with what it generated
        departed(ctx, deps)
        raise
    return account(ctx, response, deps)
