"""Server-sent events framing (pure functions), for both the OpenAI and Workers AI streams."""

from __future__ import annotations

import codecs
import json
from contextlib import aclosing
from typing import Any, AsyncIterator, Iterator

from .http import json_bytes

DONE = "[DONE]"


def encode_event(data: Any) -> bytes:
    """One `data:` event. Dicts are compact JSON; `[DONE]` is sent verbatim."""
    text = data.encode() if isinstance(data, str) else json_bytes(data)
    return b"data: " + text + b"\n\n"


def encode_done() -> bytes:
    return encode_event(DONE)


class SSEDecoder:
    """Incremental decoder: feed bytes as they arrive, get complete `data` payloads back.

    Handles events split across chunks (a chunk may even end inside a multi-byte UTF-8
    character: a network read does not respect them), CRLF line endings and multi-line data.
    """

    def __init__(self) -> None:
        self._buffer = ""
        self._data: list[str] = []
        self._utf8 = codecs.getincrementaldecoder("utf-8")()

    def feed(self, chunk: bytes | str) -> Iterator[str]:
        self._buffer += self._utf8.decode(chunk) if isinstance(chunk, (bytes, bytearray)) else chunk
        while True:
            newline = self._buffer.find("\n")
            if newline < 0:
                return
            line, self._buffer = self._buffer[:newline].rstrip("\r"), self._buffer[newline + 1 :]
            if line == "":
                if self._data:
                    yield "\n".join(self._data)
                    self._data = []
            elif line.startswith("data:"):
                self._data.append(line[5:].removeprefix(" "))

    def flush(self) -> Iterator[str]:
        if self._buffer.strip():
            yield from self.feed("\n\n")
        elif self._data:
            yield "\n".join(self._data)
            self._data = []


class IncompleteStream(ValueError):
    """The stream ended without `[DONE]`: the answer is incomplete and must not be passed off
    (or cached) as a finished one. (Framing only: the adapter says which binding it was.)"""


async def decode_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """Stream bytes -> event dicts, up to `[DONE]`; a stream cut before it raises.

    The source is closed explicitly whatever happens (at `[DONE]`, on an error, or when this is
    closed): left to the garbage collector, a JS reader is never cancelled nor released."""
    decoder = SSEDecoder()
    async with aclosing(chunks):  # type: ignore[type-var]
        async for chunk in chunks:
            for data in decoder.feed(chunk):
                if data == DONE:
                    return
                yield json.loads(data)
        for data in decoder.flush():
            if data == DONE:
                return
            yield json.loads(data)
    raise IncompleteStream("the stream ended before [DONE]")


def encode_named_event(name: str, data: Any) -> bytes:
    """An `event:` + `data:` pair, as the OpenAI Responses stream frames each event."""
    return b"event: " + name.encode() + b"\n" + encode_event(data)
