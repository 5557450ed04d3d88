"""Every keyed answer says its key's limits (`x-ratelimit-*`), errors included: after the usage
record (an inner layer) has charged a whole answer's tokens, so the figures are this request's.
Only a key's record has limits (`access.guard.check_key`), and only a request that presents a key
(`Authorization`, `x-api-key`) is checked against one: the others pass this layer at no cost."""

from __future__ import annotations

from typing import Awaitable

from ..access.guard import key_ratelimit_headers
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


def key_limits(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Awaitable[Response]:
    headers = request.headers
    if "authorization" not in headers and "x-api-key" not in headers:
        return call_next(request, deps, ctx)  # no key presented, so no key's limits to say: no coroutine of its own
    return _saying_limits(call_next, request, deps, ctx)


async def _saying_limits(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    response = await call_next(request, deps, ctx)
    principal = ctx.principal
    if principal is not None and principal.record is not None:
        for name, value in key_ratelimit_headers(deps, principal.record).items():
            response.headers.setdefault(name, value)
    return response
