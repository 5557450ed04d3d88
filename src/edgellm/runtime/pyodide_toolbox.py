"""The toolbox every Pyodide binding adapter uses: JS values to and from Python, as the runtime
behaves (../shared/docs/workers-runtime.md): a miss is `jsnull`, not `None`; options objects and
bytes must go through `to_js`; a streamed body must be a JS ReadableStream of `Uint8Array`
chunks; errors arrive as `JsException` with the JS message.

A leaf of `runtime/`: it imports nothing of the core but the leaf `stream`, and each binding's module
(`pyodide_ai`, `pyodide_kv`, `pyodide_r2`, ...) imports it, never the other way round.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Mapping

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, create_proxy, jsnull, to_js  # type: ignore[import-not-found]

from ..stream import Stream, close_source, owns


def js_options(data: Mapping[str, Any]) -> Any:
    """A plain dict is silently wrong for bindings (R2 ranges, nested AI inputs): convert it."""
    return to_js(dict(data), dict_converter=js.Object.fromEntries)


def is_missing(value: Any) -> bool:
    """A KV/R2 miss is `jsnull` (falsy, but `is None` is False); JS `undefined` arrives as None."""
    return value is None or value is jsnull


def js_message(exc: BaseException) -> str:
    return str(getattr(exc, "message", None) or exc)


def read_stream(stream: Any) -> Stream[bytes]:
    """A JS ReadableStream's chunks. Closed explicitly (a `Stream`): once read, the reader is
    cancelled and released, which the garbage collector cannot do ("async generator ignored
    GeneratorExit"); closed before its first read, no reader was taken and the stream itself is
    cancelled (what tells the producer, the AI binding or R2 or an origin, to stop)."""
    chunks = Stream(_read(stream))

    async def if_unread() -> None:
        if not chunks.started:
            try:
                await stream.cancel()
            except JsException:
                pass

    return chunks.on_close(if_unread)


async def _read(stream: Any) -> AsyncIterator[bytes]:
    reader = stream.getReader()
    finished = False
    try:
        while True:
            result = await reader.read()
            if result.done:
                finished = True
                return
            yield result.value.to_bytes()
    finally:
        try:
            if not finished:
                await reader.cancel()  # tells the producer (the AI binding, R2) to stop
        except JsException:
            pass
        try:
            reader.releaseLock()
        except JsException:
            pass


@owns("body")
async def _js_chunks(body: AsyncIterator[bytes]) -> AsyncIterator[Any]:
    """The core's body as JS chunks. When the client leaves, this receives GeneratorExit: closing
    the core's body then is what stops the generation behind it."""
    try:
        async for chunk in body:
            yield to_js(chunk)
    finally:
        await close_source(body)


def to_native_body(body: AsyncIterator[bytes], length: int | None = None) -> Any:
    """A core body as a JS ReadableStream: an R2 or AI stream passes straight through. One made in
    Python has no length workerd knows, so a Response over it would go out chunked, its
    Content-Length dropped; given `length`, it goes through a `FixedLengthStream`, whose readable
    half has that length (and which fails a body that is not exactly that long)."""
    native = getattr(body, "js_stream", None)
    if native is None:
        native = js.ReadableStream.from_(create_proxy(_js_chunks(body)))
        if length is not None:
            native = native.pipeThrough(js.FixedLengthStream.new(length))
    return native
