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
    refuse_oversized(request, deps.config.max_body_bytes)
    return call_next(request, deps, ctx)
