"""Durable Objects on the local edge, behind the core's `DurableObjectNamespace` port.

As on Cloudflare: one instance per name, created on first use; it is single-threaded
(one event loop), so concurrent requests to it interleave at await points; the requests it
serves run in the object's own request context (`isolation`), so they may share what it owns,
while the Worker request that called it shares nothing with it: the stub relays the answer and
each chunk of a streamed body across, as the runtime pipes a Durable Object's response stream.
Closing the body the caller got closes the object's body (the object learns its client left).

Idle instances are evicted, as Cloudflare evicts idle objects from memory and rebuilds them from
storage on their next request: a namespace keeps at most `max_live` instances and, past that,
drops the least recently used idle ones (no request being served inside, no body it streams still
open), calling the object's optional `close()` (a conversation closes its SQLite connection; its
data stays on disk). Without it every name ever looked up (a random response id, a cache-miss
key) would keep an instance, and its file descriptor, for the life of the process. A busy
instance is never evicted, so a namespace holds more than `max_live` only while that many are busy.

Not emulated: the input gate's hold during storage operations, eviction after a time idle
(it is by count here), and placement.
"""

from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

from edgellm.cache.coalescing import FlightObject
from edgellm.routing.router import RouterObject
from edgellm.durable import DurableObject
from edgellm.http import Request, Response
from edgellm.deps import Deps
from edgellm.state import IsolateState
from edgellm.stream import close_source

from edgellm_local.emulator.isolation import RequestContext, call_in, context_of

_END = object()
DEFAULT_MAX_LIVE = 256
_log = logging.getLogger("edgellm")


@dataclass
class RelayedBody:
    """A body produced inside a Durable Object, read from the calling request: each step runs in
    the object's context, its outcome is relayed back (the two never share an awaitable)."""

    body: AsyncIterator[bytes]
    owner: RequestContext
    closed: bool = False
    # called once when the body ends, is closed, or is dropped unclosed: the object is idle again
    on_close: Callable[[], None] | None = None
    _finalizer: weakref.finalize | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.on_close is not None:
            self._finalizer = weakref.finalize(self, self.on_close)
            self._finalizer.atexit = False

    def _release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs `on_close` the first time only

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
            self._release()
            raise StopAsyncIteration
        return chunk

    async def aclose(self) -> None:
        if self.closed:
            self._release()
            return
        self.closed = True
        try:
            await call_in(self.owner, lambda: close_source(self.body))
        finally:
            self._release()


@dataclass(eq=False)
class LocalDurableObjectStub:
    """A handle on one live instance, as the namespace hands it out. It counts what the instance
    is still doing (`busy`: requests being served inside it, bodies it streams still open), which
    is what keeps the namespace from evicting it. A stub kept past its instance's eviction still
    works: its next request goes to the instance rebuilt for the name, as a stub does on Cloudflare."""

    object: DurableObject
    owner: RequestContext
    namespace: "LocalDurableObjectNamespace | None" = field(default=None, repr=False)
    name: str = ""
    busy: int = 0
    evicted: bool = False

    def _idle_again(self) -> None:
        self.busy -= 1

    async def fetch(self, request: Request) -> Response:
        if self.evicted and self.namespace is not None:
            return await self.namespace.get(self.name).fetch(request)
        self.busy += 1  # from now, not from when the object's task first runs: no eviction in between
        entered = False

        async def serve() -> Response:
            nonlocal entered
            entered = True
            try:
                return await self.object.fetch(request)
            finally:  # the object's own work is over (a cancel unwound inside it too), not just the caller's wait
                self._idle_again()

        try:
            response = await call_in(self.owner, serve)
        except BaseException:
            if not entered:  # the call failed before its task ran (cancelled first, it never will)
                self._idle_again()
            raise
        if response.is_streaming:
            self.busy += 1  # until the caller has read it to the end or closed it
            body = RelayedBody(response.body, self.owner, on_close=self._idle_again)  # type: ignore[arg-type]
            return replace(response, headers=dict(response.headers), body=body)
        return replace(response, headers=dict(response.headers))


@dataclass
class LocalDurableObjectNamespace:
    """`factory(name)` builds the object for a name when it is used and has no live instance
    (the first time, or after its eviction); at most `max_live` idle instances are kept."""

    factory: Callable[[str], DurableObject]
    class_name: str = "DurableObject"
    max_live: int = DEFAULT_MAX_LIVE
    evictions: int = 0  # instances evicted so far (tests wait on it)
    _live: OrderedDict[str, LocalDurableObjectStub] = field(default_factory=OrderedDict, init=False, repr=False)

    def get(self, name: str) -> LocalDurableObjectStub:
        stub = self._live.get(name)
        if stub is not None:
            self._live.move_to_end(name)  # most recently used
            return stub
        owner = RequestContext(f"{self.class_name} {name[:48]}")
        stub = LocalDurableObjectStub(context_of(owner).run(self.factory, name), owner, self, name)
        self._live[name] = stub
        self._evict_idle(keep=stub)
        return stub

    def _evict_idle(self, keep: LocalDurableObjectStub) -> None:
        """Drop least recently used idle instances until at most `max_live` are live (busy ones
        stay, whatever the count: evicting one would break the requests it serves)."""
        excess = len(self._live) - self.max_live
        if excess <= 0:
            return
        idle = [name for name, stub in self._live.items() if stub is not keep and not stub.busy]
        for name in idle[:excess]:
            stub = self._live.pop(name)
            stub.evicted = True
            self.evictions += 1
            close = getattr(stub.object, "close", None)
            if close is not None:
                try:  # in the object's own context: closing is the object's I/O, not the caller's
                    context_of(stub.owner).run(close)
                except Exception:  # the request that happened to evict it must not fail for it
                    _log.exception("closing the evicted %s %r failed", self.class_name, name)

    @property
    def names(self) -> list[str]:
        """The live instances, least recently used first (tests look at what a run created)."""
        return list(self._live)


def local_flights(deps: Deps | Callable[[], Deps], wait_until: Callable[[Any], None]) -> LocalDurableObjectNamespace:
    """The `FLIGHTS` binding of the local edge: one `FlightObject` per flight name. The objects
    use the edge's bindings (`deps`, or a callable giving them as they are when an object is
    created) and its `waitUntil` (so a drain waits for their KV writes). Each gets a fresh
    `IsolateState`, as on Cloudflare, where an object runs in an isolate of its own: nothing the
    Worker keeps per isolate (breaker, routing counters, tokenizer, admission) is the object's,
    so code that leaned on sharing it fails here too."""

    def build(name: str) -> DurableObject:
        current = deps() if callable(deps) else deps
        return FlightObject(replace(current, wait_until=wait_until, flights=None, state=IsolateState(config=current.config)))

    return LocalDurableObjectNamespace(build, class_name="Flight")


def local_routers(deps: Deps | Callable[[], Deps], wait_until: Callable[[Any], None]) -> LocalDurableObjectNamespace:
    """The `ROUTER` binding of the local edge: one `RouterObject` per pool of origin replicas,
    with a fresh `IsolateState` as on Cloudflare (the object sees only what requests tell it and
    what it probes itself, never the isolate's own view of the pool)."""

    def build(name: str) -> DurableObject:
        current = deps() if callable(deps) else deps
        return RouterObject(replace(current, wait_until=wait_until, flights=None, routers=None,
                                    state=IsolateState(config=current.config)))

    return LocalDurableObjectNamespace(build, class_name="Router")
