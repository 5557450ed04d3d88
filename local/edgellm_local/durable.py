"""Durable Objects on the local edge, behind the core's `DurableObjectNamespace` port.

As on Cloudflare: one instance per name, created on first use and kept; it is single-threaded
(one event loop), so concurrent requests to it interleave at await points; the requests it
serves run in the object's own request context (`isolation`), so they may share what it owns,
while the Worker request that called it shares nothing with it: the stub relays the answer and
each chunk of a streamed body across, as the runtime pipes a Durable Object's response stream.
Closing the body the caller got closes the object's body (the object learns its client left).

Not emulated: the input gate's hold during storage operations (these objects use no storage),
eviction of idle instances, and placement.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

from edgellm.cache.coalescing import FlightObject
from edgellm.durable import DurableObject
from edgellm.http import Request, Response
from edgellm.ports import Deps

from .isolation import RequestContext, call_in, context_of

_END = object()


@dataclass
class RelayedBody:
    """A body produced inside a Durable Object, read from the calling request: each step runs in
    the object's context, its outcome is relayed back (the two never share an awaitable)."""

    body: AsyncIterator[bytes]
    owner: RequestContext
    closed: bool = False

    def __aiter__(self) -> "RelayedBody":
        return self

    async def __anext__(self) -> bytes:
        if self.closed:
            raise StopAsyncIteration

        async def step() -> Any:
            try:
                return await anext(self.body)
            except StopAsyncIteration:
                return _END

        chunk = await call_in(self.owner, step)
        if chunk is _END:
            self.closed = True
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        close = getattr(self.body, "aclose", None)
        if close is not None:
            await call_in(self.owner, close)


@dataclass
class LocalDurableObjectStub:
    object: DurableObject
    owner: RequestContext

    async def fetch(self, request: Request) -> Response:
        response = await call_in(self.owner, lambda: self.object.fetch(request))
        if response.is_streaming:
            return replace(response, headers=dict(response.headers), body=RelayedBody(response.body, self.owner))  # type: ignore[arg-type]
        return replace(response, headers=dict(response.headers))


@dataclass
class LocalDurableObjectNamespace:
    """`factory(name)` builds the object for a name the first time it is used."""

    factory: Callable[[str], DurableObject]
    class_name: str = "DurableObject"
    _instances: dict[str, LocalDurableObjectStub] = field(default_factory=dict, init=False, repr=False)

    def get(self, name: str) -> LocalDurableObjectStub:
        stub = self._instances.get(name)
        if stub is None:
            owner = RequestContext(f"{self.class_name} {name[:48]}")
            stub = self._instances[name] = LocalDurableObjectStub(context_of(owner).run(self.factory, name), owner)
        return stub

    @property
    def names(self) -> list[str]:
        """The objects created so far (tests look at what a run created)."""
        return list(self._instances)


def local_flights(deps: Deps | Callable[[], Deps], wait_until: Callable[[Any], None]) -> LocalDurableObjectNamespace:
    """The `FLIGHTS` binding of the local edge: one `FlightObject` per flight name. The objects
    use the edge's bindings (`deps`, or a callable giving them as they are when an object is
    created) and its `waitUntil` (so a drain waits for their KV writes), and count into the same
    stats: on the local edge, as under Miniflare, Worker and objects share a process."""

    def build(name: str) -> DurableObject:
        current = deps() if callable(deps) else deps
        return FlightObject(replace(current, wait_until=wait_until, flights=None))

    return LocalDurableObjectNamespace(build, class_name="Flight")
