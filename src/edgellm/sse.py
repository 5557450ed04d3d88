"""Server-sent events framing (pure functions), for both the OpenAI and Workers AI streams."""

from __future__ import annotations

import codecs
import json
from typing import Any, AsyncIterator, Iterator

from .http import json_bytes
from .stream import owns

DONE = "[DONE]"


def encode_event(data: Any) -> bytes:
    """One `data:` event. Dicts are compact JSON; `[DONE]` is sent verbatim."""
    text = data.encode() if isinstance(data, str) else json_bytes(data)
    return b"data: " + text + b"\n\n"


def encode_done() -> bytes:
    return encode_event(DONE)


MAX_LINE_CHARS = 1024 * 1024  # one SSE line: a token event is ~200 bytes; a tool call's arguments fit many times
MAX_EVENT_CHARS = 1024 * 1024  # one event's data lines together


class SSEFrameTooLarge(ValueError):
    """A line or an event over the cap: the stream is not SSE the edge takes (a peer sending an
    endless line would otherwise be buffered without bound)."""


class SSEDecoder:
    """Incremental decoder: feed bytes as they arrive, get complete `data` payloads back.

    Handles events split across chunks (a chunk may even end inside a multi-byte UTF-8
    character: a network read does not respect them), CRLF line endings and multi-line data.
    Each byte is scanned once (the unfinished line is kept apart and only the new bytes are
    searched for a newline), and a line or an event over its cap raises `SSEFrameTooLarge`, so
    one peer's bytes cost time and memory in proportion to what it sent, up to the caps.
    """

    def __init__(self, max_line: int = MAX_LINE_CHARS, max_event: int = MAX_EVENT_CHARS) -> None:
        self._partial: list[str] = []  # the pieces of the unfinished line
        self._partial_size = 0
        self._data: list[str] = []
        self._data_size = 0
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self.max_line, self.max_event = max_line, max_event

    def feed(self, chunk: bytes | str) -> Iterator[str]:
        text = self._utf8.decode(chunk) if isinstance(chunk, (bytes, bytearray)) else chunk
        if "\n" not in text:
            self._keep(text)
            return
        *lines, rest = text.split("\n")
        if self._partial:
            lines[0] = "".join(self._partial) + lines[0]
            self._partial, self._partial_size = [], 0
        for line in lines:
            if len(line) > self.max_line + 1:
                raise SSEFrameTooLarge(f"an SSE line exceeds {self.max_line} characters")
            line = line.rstrip("\r")
            if line == "":
                if self._data:
                    data = "\n".join(self._data)
                    self._data, self._data_size = [], 0
                    yield data
            elif line.startswith("data:"):
                value = line[5:].removeprefix(" ")
                self._data_size += len(value) + 1
                if self._data_size > self.max_event:
                    raise SSEFrameTooLarge(f"an SSE event exceeds {self.max_event} characters")
                self._data.append(value)
        self._keep(rest)

    def _keep(self, text: str) -> None:
        if text:
            self._partial.append(text)
            self._partial_size += len(text)
            if self._partial_size > self.max_line + 1:
                raise SSEFrameTooLarge(f"an SSE line exceeds {self.max_line} characters")

    def flush(self) -> Iterator[str]:
        if "".join(self._partial).strip():
            yield from self.feed("\n\n")
        elif self._data:
            data = "\n".join(self._data)
            self._data, self._data_size = [], 0
            yield data


class IncompleteStream(ValueError):
    """The stream ended without `[DONE]`: the answer is incomplete and must not be passed off
    (or cached) as a finished one. (Framing only: the adapter says which binding it was.)"""


@owns("chunks")
async def decode_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[dict[str, Any]]:
    """Stream bytes -> event dicts, up to `[DONE]`; a stream cut before it raises.

    The source is closed whatever happens (at `[DONE]`, on an error, or when this is closed,
    read or not: `owns`): left to the garbage collector, a JS reader is never cancelled nor released."""
    decoder = SSEDecoder()
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
