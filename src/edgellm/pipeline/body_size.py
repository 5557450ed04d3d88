"""A body over `MAX_BODY_BYTES`, read or only declared, is a 413 on every route, once, here
(`validation.refuse_oversized`); handlers that parse a body rely on it."""

from __future__ import annotations

from typing import Awaitable

from ..context import RequestContext
from ..deps import Deps
from ..http import Request, Response
from ..validation import refuse_oversized
from . import Next


def body_size(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Awaitable[Response]:
    limit = deps.config.max_body_bytes
    declared = request.headers.get("content-length")
    # `refuse_oversized`'s rule, read here: every request passes this layer, and few are refused
    if len(request.body) > limit or (declared and declared.isdigit() and int(declared) > limit):
        refuse_oversized(request, limit)  # the 413
    return call_next(request, deps, ctx)
