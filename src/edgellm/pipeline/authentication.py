"""Who calls (`access.guard.authenticate`: an API key, the admin token, open mode) and the key's
request limits; a 401 or 429 before any handler runs. Public routes have no caller.

What needs no key's record (a public route, the admin token, open mode) is settled without an
await of this layer's own; only a key to check costs one."""

from __future__ import annotations

from typing import Awaitable

from ..access.guard import KeyToCheck, check_key, settle
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


def authentication(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Awaitable[Response]:
    settled = settle(request, deps)
    if isinstance(settled, KeyToCheck):
        return _keyed(call_next, request, deps, ctx, settled)
    ctx.principal = settled
    return call_next(request, deps, ctx)


async def _keyed(call_next: Next, request: Request, deps: Deps, ctx: RequestContext, key: KeyToCheck) -> Response:
    ctx.principal = await check_key(request, deps, key)
    return await call_next(request, deps, ctx)
