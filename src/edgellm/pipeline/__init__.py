"""The request's way through the edge: an ordered list of layers around the router's handler.

A layer is `layer(call_next, request, deps, ctx) -> Awaitable[Response]`: it does its one thing on
the way in, calls `call_next(request, deps, ctx)` (the rest of the pipeline, itself a handler), and
where it needs to, one thing on the way out; or it answers without calling it (a preflight). As
Starlette's middleware and Hono's `app.use`, with two differences: what a layer learns goes into
the typed `RequestContext`, never onto the request; and a layer that only acts on the way in may be
a plain function returning `call_next(...)`'s awaitable, which costs a request no coroutine of its
own (a HIT passes every layer). A layer that acts on a streamed body does so by registering on its
`Stream` (closable before its first step), never by reading it.

The list itself is `app.LAYERS`, beside the routes; `compose` makes it one handler, once.
"""

from __future__ import annotations

from types import MethodType
from typing import TYPE_CHECKING, Awaitable, Callable, Sequence

if TYPE_CHECKING:
    from ..context import RequestContext
    from ..deps import Deps
    from ..http import Request, Response

Next = Callable[["Request", "Deps", "RequestContext"], Awaitable["Response"]]
Layer = Callable[[Next, "Request", "Deps", "RequestContext"], Awaitable["Response"]]


def compose(layers: Sequence[Layer], endpoint: Next) -> Next:
    """`layers[0]` outermost, `endpoint` innermost: each layer bound to the rest, once (not per
    request), as Starlette builds its middleware stack. Bound as a method is to its `self` (hence
    `call_next` first): CPython calls a bound method's function straight from its eval loop,
    where a `functools.partial` is a C call in between (a third of a pass-through layer's cost)."""
    app = endpoint
    for layer in reversed(layers):
        app = MethodType(layer, app)
    return app


def dispatch(request: Request, deps: Deps, ctx: RequestContext) -> Awaitable[Response]:
    """The innermost step: the handler the match layer found."""
    assert ctx.endpoint is not None, "the match layer runs before dispatch"
    return ctx.endpoint(request, deps, ctx)  # type: ignore[return-value]
