"""`Stream`: closing is idempotent, works before the first read, closes every source and runs
`on_close` exactly once however the stream ends (its end, its source failing, a close mid-way)."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass, field
from typing import AsyncIterator

import pytest

from edgellm.stream import Stream, close_source


@dataclass
class Source:
    """A class source (as a binding's stream is): `closes` counts its `aclose` calls."""

    items: list[int] = field(default_factory=lambda: [1, 2, 3])
    fail_at: int | None = None  # raise this many items in
    fail_close: bool = False
    closes: int = 0
    given: int = 0

    def __aiter__(self) -> "Source":
        return self

    async def __anext__(self) -> int:
        if self.fail_at is not None and self.given == self.fail_at:
            raise ValueError("source failed")
        if self.given == len(self.items):
            raise StopAsyncIteration
        self.given += 1
        return self.items[self.given - 1]

    async def aclose(self) -> None:
        self.closes += 1
        if self.fail_close:
            raise OSError("close failed")


def counted(stream: Stream[int]) -> list[str]:
    calls: list[str] = []
    stream.on_close(lambda: calls.append("closed"))
    return calls


async def test_closed_before_its_first_read_it_closes_its_sources_and_runs_on_close() -> None:
    """An async generator closed unstarted skips its `finally`: the stream over it must still
    close what sits beside it and run its callbacks."""
    behind = Source()
    finally_ran: list[bool] = []

    async def renderer() -> AsyncIterator[int]:
        try:
            yield 1
        finally:
            finally_ran.append(True)

    stream = Stream(renderer(), behind)
    calls = counted(stream)
    await stream.aclose()
    assert finally_ran == []  # Python's own rule, which is why the stream exists
    assert behind.closes == 1 and calls == ["closed"]
    assert stream.closed and not stream.started
    with pytest.raises(StopAsyncIteration):
        await anext(stream)


async def test_closed_twice_closes_once_and_runs_on_close_once() -> None:
    source, behind = Source(), Source()
    stream = Stream(source, behind)
    calls = counted(stream)
    await stream.aclose()
    await stream.aclose()
    assert (source.closes, behind.closes, calls) == (1, 1, ["closed"])


async def test_closed_mid_iteration_runs_the_generators_finally_and_on_close() -> None:
    finally_ran: list[bool] = []

    async def generator() -> AsyncIterator[int]:
        try:
            for i in range(10):
                yield i
        finally:
            finally_ran.append(True)

    stream = Stream(generator())
    calls = counted(stream)
    assert [await anext(stream), await anext(stream)] == [0, 1]
    await stream.aclose()
    assert finally_ran == [True] and calls == ["closed"]


async def test_its_end_closes_its_sources_and_runs_on_close_once() -> None:
    source, behind = Source(), Source()
    stream = Stream(source, behind)
    calls = counted(stream)
    assert [item async for item in stream] == [1, 2, 3]
    assert (source.closes, behind.closes, calls) == (1, 1, ["closed"])  # at its end, before any close
    await stream.aclose()  # a server closes the body it finished: nothing more
    assert (source.closes, behind.closes, calls) == (1, 1, ["closed"])


async def test_a_failing_source_fails_the_stream_closed_and_on_close_run_once() -> None:
    source, behind = Source(fail_at=1), Source()
    stream = Stream(source, behind)
    calls = counted(stream)
    assert await anext(stream) == 1
    with pytest.raises(ValueError, match="source failed"):
        await anext(stream)
    assert (source.closes, behind.closes, calls) == (1, 1, ["closed"])
    with pytest.raises(StopAsyncIteration):  # read again: ended, not failing again
        await anext(stream)
    await stream.aclose()
    assert calls == ["closed"]


async def test_a_cancelled_read_closes_the_stream() -> None:
    gate, waiting_now = asyncio.Event(), asyncio.Event()
    behind = Source()

    async def waiting() -> AsyncIterator[int]:
        waiting_now.set()
        await gate.wait()
        yield 1

    stream = Stream(waiting(), behind)
    calls = counted(stream)
    reader = asyncio.ensure_future(anext(stream))
    await waiting_now.wait()
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert behind.closes == 1 and calls == ["closed"]


async def test_a_source_whose_close_fails_still_closes_the_others_and_runs_on_close() -> None:
    source, behind = Source(fail_close=True), Source()
    stream = Stream(source, behind)
    calls = counted(stream)
    with pytest.raises(OSError, match="close failed"):
        await stream.aclose()
    assert (source.closes, behind.closes, calls) == (1, 1, ["closed"])
    await stream.aclose()
    assert (source.closes, calls) == (1, ["closed"])


async def test_a_failing_close_callback_still_runs_the_others_and_the_first_failure_is_raised() -> None:
    source = Source(fail_close=True)
    stream = Stream(source)
    calls: list[str] = []

    def fails() -> None:
        calls.append("fails")
        raise RuntimeError("callback failed")

    stream.on_close(fails).on_close(lambda: calls.append("after"))
    with pytest.raises(OSError, match="close failed"):  # the source's failure came first
        await stream.aclose()
    assert calls == ["fails", "after"]

    alone = Stream(Source())
    alone.on_close(fails)
    with pytest.raises(RuntimeError, match="callback failed"):  # a callback's own failure is not swallowed
        await alone.aclose()


async def test_tap_sees_each_item_before_the_reader_and_a_failing_tap_fails_the_stream() -> None:
    seen: list[int] = []
    stream = Stream(Source()).tap(seen.append)
    assert [item async for item in stream] == [1, 2, 3] and seen == [1, 2, 3]

    def refuse(item: int) -> None:
        if item == 2:
            raise RuntimeError("refused")

    source = Source()
    failing = Stream(source).tap(refuse)
    calls = counted(failing)
    assert await anext(failing) == 1
    with pytest.raises(RuntimeError, match="refused"):
        await anext(failing)
    assert source.closes == 1 and calls == ["closed"]


async def test_on_close_may_be_async_and_callbacks_run_in_order_after_the_sources() -> None:
    order: list[str] = []
    source = Source()

    async def later() -> None:
        order.append(f"async (source closed {source.closes})")

    stream = Stream(source).on_close(lambda: order.append("first")).on_close(later)
    await stream.aclose()
    assert order == ["first", "async (source closed 1)"]
    with pytest.raises(RuntimeError):
        stream.on_close(lambda: None)  # too late: it could never run


async def test_close_source_closes_what_can_be_closed_and_ignores_the_rest() -> None:
    source = Source()
    await close_source(source)
    await close_source(b"bytes")
    await close_source([1, 2])
    assert source.closes == 1


async def test_in_blocks_joins_chunks_into_blocks_of_the_same_bytes() -> None:
    from edgellm.stream import in_blocks

    async def source(chunks: list[bytes]):  # type: ignore[no-untyped-def]
        for chunk in chunks:
            yield chunk

    chunks = [bytes([65 + i % 26]) * (i % 7 + 1) for i in range(100)]
    blocks = [block async for block in in_blocks(source(chunks), limit=32)]
    assert b"".join(blocks) == b"".join(chunks)
    assert all(32 <= len(block) < 32 + 7 for block in blocks[:-1]) and 0 < len(blocks[-1]) < 32 + 7
    assert [block async for block in in_blocks(source([]))] == []  # nothing: no empty block
    assert [block async for block in in_blocks(source([b"a", b"b"]))] == [b"ab"]  # under the limit: one block at the end


async def test_in_blocks_sends_what_it_gathered_before_its_source_failed() -> None:
    """A replay that breaks mid-block still sends the chunks it had, then fails: the same bytes
    a chunk-per-token stream would have sent before the failure."""
    from edgellm.stream import in_blocks

    async def breaks_after(chunks: list[bytes]):  # type: ignore[no-untyped-def]
        for chunk in chunks:
            yield chunk
        raise RuntimeError("the replay broke")

    read: list[bytes] = []
    with pytest.raises(RuntimeError, match="the replay broke"):
        async for block in in_blocks(breaks_after([b"x" * 20, b"y" * 20, b"z" * 5]), limit=32):
            read.append(block)
    assert read == [b"x" * 20 + b"y" * 20, b"z" * 5]
    with pytest.raises(RuntimeError):  # nothing gathered yet: the failure alone
        async for block in in_blocks(breaks_after([])):
            raise AssertionError(f"an empty block was sent: {block!r}")


# --- `owns`: a generator that reads a source, closable before its first step --------------------


async def test_an_owning_generator_closed_before_its_first_step_closes_its_source() -> None:
    """A plain async generator closed unread never starts, so its `finally` (its only way to close
    what it reads) never runs; `owns` makes it a `Stream` that closes the source anyway, and a
    source the generator closed itself is not closed twice in effect (a class source counts)."""
    from edgellm.stream import owns

    @owns("source")
    async def doubled(source: AsyncIterator[int], by: int = 2) -> AsyncIterator[int]:
        async for item in source:
            yield item * by

    unread = Source()
    stream = doubled(unread)
    assert isinstance(stream, Stream)
    await stream.aclose()
    assert unread.closes == 1
    partly = Source()
    stream = doubled(partly, by=3)
    assert await anext(stream) == 3
    await stream.aclose()
    await stream.aclose()
    assert partly.closes == 1
    whole = Source()
    assert [item async for item in doubled(source=whole)] == [2, 4, 6] and whole.closes == 1
    with pytest.raises(TypeError, match="names the parameters"):
        owns("missing")(doubled.__wrapped__)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="names the parameters"):
        owns()(doubled.__wrapped__)  # type: ignore[attr-defined]


SOURCE_TYPE = re.compile(r"\b(AsyncIterator|AsyncIterable|AsyncGenerator|Generation|Stream)\b")


def _own_yields(fn: "ast.AsyncFunctionDef") -> bool:
    """Whether `fn` itself yields (a yield in a function nested inside it is that function's)."""
    import ast

    todo: list[ast.AST] = list(fn.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            todo.extend(ast.iter_child_nodes(node))
    return False


def test_every_async_generator_of_the_core_that_reads_a_source_owns_it() -> None:
    """An async generator taking a stream (a parameter typed as an async iterator, a `Generation`
    or a `Stream`) is the layer that owes it a close: it must be made with `@owns(...)` naming
    that parameter, or a client gone before its first step leaks what the stream holds (an
    admission place, a llama.cpp slot, an origin's connection)."""
    import ast
    from pathlib import Path

    import edgellm

    root = Path(edgellm.__file__).parent
    found, missing = [], []
    for path in sorted(root.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(fn, ast.AsyncFunctionDef) or not _own_yields(fn):
                continue
            arguments = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
            sources = {a.arg for a in arguments if a.annotation is not None
                       and SOURCE_TYPE.search(ast.unparse(a.annotation))}
            if not sources:
                continue
            owned: set[str] = set()
            for decorator in fn.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("owns"):
                    owned |= {a.value for a in decorator.args if isinstance(a, ast.Constant)}
            where = f"{path.relative_to(root)}:{fn.lineno} {fn.name}"
            found.append(where)
            if sources - owned:
                missing.append(f"{where} reads {sorted(sources - owned)} without @owns")
    assert not missing, "\n".join(missing)
    assert len(found) >= 10, found  # the scan sees the generators it is about (renderers, inference, sse, routing)
