"""Who calls (`access.guard.authenticate`: an API key, the admin token, open mode) and the key's
request limits; a 401 or 429 before any handler runs. Public routes have no caller."""

from __future__ import annotations

from ..access.guard import authenticate
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


async def authentication(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    ctx.principal = await authenticate(request, deps)
    return await call_next(request, deps, ctx)
