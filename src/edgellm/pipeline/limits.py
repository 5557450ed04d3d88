"""Every keyed answer says its key's limits (`x-ratelimit-*`), errors included: after the usage
record (an inner layer) has charged a whole answer's tokens, so the figures are this request's."""

from __future__ import annotations

from ..access.guard import key_ratelimit_headers
from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from . import Next


async def key_limits(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
    response = await call_next(request, deps, ctx)
    principal = ctx.principal
    if principal is not None and principal.record is not None:
        for name, value in key_ratelimit_headers(deps, principal.record).items():
            response.headers.setdefault(name, value)
    return response
