"""One way to pass a stream on and close it: `Stream`, and `close_source` for anything else.

Every layer between a client and a generation (the usage recorder, the Finish tap, the renderer,
the admission ticket, the binding's stream) must pass a close on, or a client that leaves keeps
a llama.cpp slot, an admission place or a Durable Object busy. The protocol has three traps, each
a past bug here:

- an async generator closed before its first read skips its `finally` (Python never started
  its frame), so a generator cannot be the layer that owes its sources a close;
- a layer that forgets to close on its own end or failure leaves the close to the garbage
  collector;
- a second close must change nothing (a server closes a body the handler already closed).

`Stream` is a class, so closing it works unread; it closes its sources when it ends, fails or is
closed, once, and then runs its `on_close` callbacks, once. An async generator that reads a
source is made with `@owns("source")`, which returns it as a `Stream` owning that source: so no
generator of the core is ever the layer that owes a close (a test scans the core for one that
is not). Leaf module: imports nothing of the core, so every module may use it.
"""

from __future__ import annotations

import functools
import inspect
import sys
from typing import AsyncIterator, Awaitable, Callable, Generic, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")
OnClose = Callable[[], "Awaitable[None] | None"]


async def close_source(source: object) -> None:
    """Close `source` if it can be closed (has `aclose`): bytes, lists and plain iterators cannot."""
    close = getattr(source, "aclose", None)
    if close is not None:
        await close()


def owns(*params: str) -> Callable[[Callable[P, AsyncIterator[T]]], Callable[P, "Stream[T]"]]:
    """Make an async generator function that reads the sources passed as `params` return a
    `Stream` over the generator that owns them: closing it closes them, read or not (the
    generator's own `finally` never runs if it was closed before its first step). A source is
    anything with `aclose` (a stream, a binding's stream, a `Generation`); the generator need
    not close them itself."""

    def wrap(make: Callable[P, AsyncIterator[T]]) -> Callable[P, Stream[T]]:
        signature = inspect.signature(make)
        unknown = [name for name in params if name not in signature.parameters]
        if not params or unknown:
            raise TypeError(f"owns() names the parameters {make.__qualname__} reads from; got {params or 'none'}")

        # where each source sits, found once: binding the signature per call cost every stream
        # (and every HIT's replay) more than the Stream it makes
        positional = [name for name, p in signature.parameters.items()
                      if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        places = tuple((positional.index(name) if name in positional else sys.maxsize, name) for name in params)

        @functools.wraps(make)
        def owning(*args: P.args, **kwargs: P.kwargs) -> Stream[T]:
            sources = [args[at] if at < len(args) else kwargs[name] for at, name in places
                       if at < len(args) or name in kwargs]
            return Stream(make(*args, **kwargs), *sources)

        return owning

    return wrap


# A replayed body's largest block: a client's first byte waits for at most this much rendering
# (~70 tokens of OpenAI chunks, well under a millisecond), and it is a quarter of uvicorn's write buffer.
REPLAY_BLOCK_BYTES = 16 * 1024


@owns("chunks")
async def in_blocks(chunks: AsyncIterator[bytes], limit: int = REPLAY_BLOCK_BYTES) -> AsyncIterator[bytes]:
    """`chunks` joined into blocks of up to about `limit` bytes, for a body that never waits (a
    cache HIT's replay): one chunk per token costs a write, a socket send (and a gzip flush, a JS
    hop on Workers) each, though every token is there at once. The bytes, and so the SSE events,
    are the same.

    If `chunks` fails, what it gave before the failure still goes out, then the failure: a
    client of a broken replay gets every byte a chunk-per-token stream would have sent it."""
    block: list[bytes] = []
    size = 0
    try:
        async for chunk in chunks:
            block.append(chunk)
            size += len(chunk)
            if size >= limit:
                yield b"".join(block)
                block, size = [], 0
    except Exception:  # not a close or a cancellation (BaseException): nobody reads after those
        if block:
            yield b"".join(block)
        raise
    if block:
        yield b"".join(block)


class Stream(Generic[T]):
    """An async iterator over `source` that owns it and the `also` sources beside it (what the
    source was rendered from: closing a renderer must stop the generation behind it).

    It closes them all when it ends, fails or is closed (`aclose` is idempotent and works before
    the first read), then runs the `on_close` callbacks once, whatever closing raised. `tap`
    callbacks see each item as it passes; one that raises fails the stream like its source would.
    """

    __slots__ = ("_source", "_also", "_taps", "_on_close", "started", "closed")

    def __init__(self, source: AsyncIterator[T], *also: object) -> None:
        self._source, self._also = source, also
        self._taps: list[Callable[[T], None]] = []
        self._on_close: list[OnClose] = []
        self.started = False  # read at least once: a generator below now runs its own `finally`
        self.closed = False

    def tap(self, fn: Callable[[T], None]) -> "Stream[T]":
        """Call `fn(item)` on each item as it passes (before the reader gets it)."""
        self._taps.append(fn)
        return self

    def on_close(self, fn: OnClose) -> "Stream[T]":
        """Run `fn()` (sync, or returning an awaitable) once, when the stream ends, fails or is
        closed. Registered before the stream is handed on: a closed stream cannot run it."""
        if self.closed:
            raise RuntimeError("on_close on a stream already closed")
        self._on_close.append(fn)
        return self

    def __aiter__(self) -> "Stream[T]":
        return self

    async def __anext__(self) -> T:
        if self.closed:
            raise StopAsyncIteration
        self.started = True
        try:
            item = await anext(self._source)
            for fn in self._taps:
                fn(item)
        except BaseException:  # its end, its failure, a cancelled read: the sources are done
            await self.aclose()
            raise
        return item

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        error: BaseException | None = None
        for source in (self._source, *self._also):
            try:
                await close_source(source)
            except BaseException as exc:  # every source is still closed, every callback still run
                error = error or exc
        for fn in self._on_close:
            try:
                result = fn()
                if inspect.isawaitable(result):
                    await result
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error
