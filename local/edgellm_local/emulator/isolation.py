"""Request isolation, enforced the way workerd enforces it.

On Cloudflare an I/O object (a promise, a task, a stream, a queue fed by one) belongs to the
request that created it: when another request awaits it, workerd cancels that request ("A
promise was resolved or rejected from a different request context than the one it was created
in", "Cannot perform I/O on behalf of a different request"). Work shared between requests
lives in a Durable Object, whose requests may share what the object owns.

The local edge runs its event loop as an `IsolatingEventLoop`: every future and task it makes
is tagged with the `RequestContext` current when it was created (a contextvar the server sets
per request, and the Durable Object emulation per object), and awaiting it, adding a callback
to it or resolving it from another request's context fails with `CrossRequestIOError`. Code
running outside any request (the server itself, sockets, threads, the test driving it) is the
runtime and may resolve anything. So a regression that shares I/O across requests fails in
every local test, as it would on Cloudflare, instead of passing here and breaking there.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Coroutine, Generator, Iterator, TypeVar

from edgellm.stream import close_source

T = TypeVar("T")

_serial = itertools.count(1)


@dataclass(eq=False)
class RequestContext:
    """One request being served (or one Durable Object instance, which owns what its requests share)."""

    label: str
    serial: int = field(default_factory=lambda: next(_serial))

    def __repr__(self) -> str:
        return f"<request {self.serial}: {self.label}>"


CURRENT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("edgellm_request_context", default=None)


class CrossRequestIOError(RuntimeError):
    """I/O created while serving one request was used while serving another."""


def current_request() -> RequestContext | None:
    return CURRENT.get()


def check_owner(owner: RequestContext | None, what: str) -> None:
    """Raise unless the current request may use an object `owner` created (the runtime may use anything)."""
    here = CURRENT.get()
    if owner is not None and here is not None and here is not owner:
        raise CrossRequestIOError(
            f"Cannot perform I/O on behalf of a different request: {what} was created while serving "
            f"{owner!r} and used while serving {here!r}. Share work between requests through a Durable Object."
        )


@contextlib.contextmanager
def request_context(label: str) -> Iterator[RequestContext]:
    """Serve one request: futures and tasks made inside belong to it."""
    context = RequestContext(label)
    token = CURRENT.set(context)
    try:
        yield context
    finally:
        CURRENT.reset(token)


class IsolatedFuture(asyncio.Future):  # type: ignore[type-arg]
    """A future that belongs to the request that created it."""

    def __init__(self, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop=loop)
        self._owner = CURRENT.get()

    def __await__(self) -> Generator[Any, None, Any]:
        check_owner(self._owner, "a future")
        return (yield from super().__await__())

    __iter__ = __await__

    def add_done_callback(self, fn: Callable[..., Any], *, context: contextvars.Context | None = None) -> None:
        check_owner(self._owner, "a future")
        super().add_done_callback(fn, context=context)

    def set_result(self, result: Any) -> None:
        try:
            check_owner(self._owner, "a future")
        except CrossRequestIOError as error:  # the waiter fails, as workerd fails the awaiting request
            super().set_exception(error)
            return
        super().set_result(result)

    def set_exception(self, exception: Any) -> None:
        try:
            check_owner(self._owner, "a future")
        except CrossRequestIOError as error:
            exception = error
        super().set_exception(exception)


class IsolatedTask(asyncio.Task):  # type: ignore[type-arg]
    """A task that belongs to the request whose context it runs in."""

    def __init__(self, coro: Any, *, loop: asyncio.AbstractEventLoop, name: str | None = None,
                 context: contextvars.Context | None = None) -> None:
        super().__init__(coro, loop=loop, name=name, context=context)
        self._owner = context.get(CURRENT) if context is not None else CURRENT.get()

    def __await__(self) -> Generator[Any, None, Any]:
        check_owner(self._owner, "a task")
        return (yield from super().__await__())

    __iter__ = __await__

    def add_done_callback(self, fn: Callable[..., Any], *, context: contextvars.Context | None = None) -> None:
        check_owner(self._owner, "a task")
        super().add_done_callback(fn, context=context)


class _Isolating:
    """What makes a loop isolating: the futures and tasks it hands out carry their request."""

    def create_future(self) -> asyncio.Future[Any]:
        return IsolatedFuture(loop=self)  # type: ignore[arg-type]

    def create_task(self, coro: Any, *, name: str | None = None, context: contextvars.Context | None = None) -> asyncio.Task[Any]:
        if self.is_closed():  # type: ignore[attr-defined]
            coro.close()
            raise RuntimeError("Event loop is closed")
        return IsolatedTask(coro, loop=self, name=name, context=context)  # type: ignore[arg-type]


class IsolatingEventLoop(_Isolating, asyncio.SelectorEventLoop):
    """The local edge's asyncio event loop: futures and tasks carry their request (see the module doc)."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    return IsolatingEventLoop()


def new_uvloop() -> asyncio.AbstractEventLoop:
    """The isolating loop on libuv (`edgellm dev`'s fast server). uvloop's own internal futures
    (socket reads and writes) bypass `create_future`: they are the runtime's I/O, no request's."""
    import uvloop  # only the fast server needs it

    class IsolatingUVLoop(_Isolating, uvloop.Loop):  # type: ignore[misc]
        pass

    IsolatingUVLoop.__qualname__ = "IsolatingUVLoop"
    return IsolatingUVLoop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on an isolating loop (tests, the CLI)."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def _runtime_context() -> contextvars.Context:
    return contextvars.Context()  # no request: the runtime itself


def context_of(owner: RequestContext) -> contextvars.Context:
    """A context in which code runs while serving `owner`: a new one, never a copy of the
    caller's. A Durable Object runs in an isolate of its own on Cloudflare, where nothing the
    calling request set (its span, its admitted tenant) exists: what it needs is sent with the
    request, so code that leaned on the caller's context variables fails here too."""
    context = contextvars.Context()
    context.run(CURRENT.set, owner)
    return context


async def call_in(owner: RequestContext, make: Callable[[], Awaitable[T]]) -> T:
    """Run `make()` while serving `owner` and hand its outcome to the calling request.

    This is what the runtime does between a Worker and a Durable Object: the two never share an
    awaitable; the runtime relays the result (here through callbacks run outside any request).
    Cancelling the caller cancels the call.
    """
    loop = asyncio.get_running_loop()

    async def body() -> T:
        return await make()

    task = loop.create_task(body(), context=context_of(owner))
    relayed = loop.create_future()

    def relay(done: asyncio.Future[T]) -> None:
        if relayed.done():
            return
        if done.cancelled():
            relayed.cancel()
        elif done.exception() is not None:
            relayed.set_exception(done.exception())  # type: ignore[arg-type]
        else:
            relayed.set_result(done.result())

    _runtime_context().run(task.add_done_callback, relay, context=_runtime_context())
    try:
        return await relayed
    except asyncio.CancelledError:
        task.cancel()
        raise


class OwnedStream:
    """A binding's stream, owned by the request that opened it (like a JS ReadableStream): reading
    or closing it while serving another request fails, whatever it awaits underneath."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self._owner = CURRENT.get()

    def __aiter__(self) -> "OwnedStream":
        return self

    async def __anext__(self) -> Any:
        check_owner(self._owner, "a binding stream")
        return await anext(self._source)

    async def aclose(self) -> None:
        check_owner(self._owner, "a binding stream")
        await close_source(self._source)


def _call(function: Callable[..., Any], *args: Any) -> Any:
    return function(*args)


class InTask:
    """Awaiting this runs `coro` in the awaiting task, step by step: each step inside `context`
    when one is given (what a task of its own in that context would do, without the task), and
    `on_first_wait` called the first time `coro` waits. A task costs about as much as a
    `/healthz`'s whole answer, and the server's I/O is called once per streamed token."""

    __slots__ = ("_coro", "_context", "_on_first_wait")

    def __init__(self, coro: Coroutine[Any, Any, T], context: contextvars.Context | None = None,
                 on_first_wait: Callable[[], None] | None = None) -> None:
        self._coro, self._context, self._on_first_wait = coro, context, on_first_wait

    def __await__(self) -> Generator[Any, Any, Any]:
        coro = self._coro
        step = self._context.run if self._context is not None else _call
        try:
            signal = step(coro.send, None)
            if self._on_first_wait is not None:
                self._on_first_wait()
            while True:  # what the coroutine waits on goes to the task, and the task's answer back in
                try:
                    answer = yield signal
                except BaseException as thrown:  # a cancellation (or a close) reaches the coroutine
                    signal = step(coro.throw, thrown)
                else:
                    signal = step(coro.send, answer)
        except StopIteration as done:
            return done.value


async def as_runtime(function: Callable[..., Awaitable[T]], *args: Any) -> T:
    """Run runtime I/O (the HTTP server's own `receive`/`send`) outside any request, as workerd's
    own I/O is: what it creates or resolves belongs to no request (a keep-alive connection's next
    request is started from inside the previous one's `send`). It runs in the calling task, in
    a context of its own (`InTask`)."""
    return await InTask(function(*args), _runtime_context())  # type: ignore[arg-type]
