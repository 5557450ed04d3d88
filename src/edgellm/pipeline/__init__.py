"""The request's way through the edge: an ordered list of layers around the router's handler.

A layer is `layer(call_next, request, deps, ctx) -> Awaitable[Response]`: it does its one thing on
the way in, calls `call_next(request, deps, ctx)` (the rest of the pipeline, itself a handler), and
where it needs to, one thing on the way out; or it answers without calling it (a preflight). As
Starlette's middleware and Hono's `app.use`, with two differences: what a layer learns goes into
the typed `RequestContext`, never onto the request; and a layer that only acts on the way in may be
a plain function returning `call_next(...)`'s awaitable, which costs a request no coroutine of its
own (a HIT passes every layer). A layer that acts on a streamed body does so by registering on its
`Stream` (closable before its first step), never by reading it.

A layer whose work is for some methods only (a HEAD's body, an OPTIONS preflight) says so with
`@only_for(...)`: `stacks` composes the list once per such method and once for all the others,
and leaves the layer out of the stacks of methods it has no work for. Every other layer is in
every stack; a declared layer still passes any other method on untouched, so it is right in a
stack built without the declaration too (`compose`).

The list itself is `app.LAYERS`, beside the routes; `stacks` makes it a handler per method, once.
"""

from __future__ import annotations

from types import MethodType
from typing import TYPE_CHECKING, Awaitable, Callable, Mapping, Sequence, TypeVar

if TYPE_CHECKING:
    from ..context import RequestContext
    from ..deps import Deps
    from ..http import Request, Response

Next = Callable[["Request", "Deps", "RequestContext"], Awaitable["Response"]]
Layer = Callable[[Next, "Request", "Deps", "RequestContext"], Awaitable["Response"]]
L = TypeVar("L", bound=Layer)

# the methods a stack is composed for ahead of the first request; another (WebDAV's, a typo) gets `other`'s
METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def only_for(*methods: str) -> Callable[[L], L]:
    """Declares that `layer` has work only on requests of `methods` (it passes the others on as
    they are): `stacks` leaves it out of the other methods' stacks, so they pay no call for it."""

    def declare(layer: L) -> L:
        layer.methods = frozenset(methods)  # type: ignore[attr-defined]
        return layer

    return declare


def works_on(layer: Layer, method: str) -> bool:
    """Whether `layer` has work on a request of `method`: always, unless it declared its methods."""
    methods = getattr(layer, "methods", None)
    return methods is None or method in methods


def stacks(layers: Sequence[Layer], endpoint: Next) -> tuple[Mapping[str, Next], Next]:
    """`layers` composed around `endpoint` for each method of `METHODS` and the methods the
    layers declare, each stack with the layers that work on its method (`works_on`), in the
    list's order; and the stack of any other method (`other`: no declared layer)."""
    named = set(METHODS).union(*(getattr(layer, "methods", ()) for layer in layers))
    by_method = {method: compose([layer for layer in layers if works_on(layer, method)], endpoint) for method in sorted(named)}
    return by_method, compose([layer for layer in layers if getattr(layer, "methods", None) is None], endpoint)


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
