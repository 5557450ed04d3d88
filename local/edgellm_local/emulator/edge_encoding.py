"""What Cloudflare's edge adds to every response, done the same way on the local edge.

Text responses (JSON, HTML, SSE, JS, CSS) are gzip-compressed when the client sends
`Accept-Encoding: gzip`, and `Content-Length` is then dropped (a stream is flushed chunk by chunk,
so tokens still arrive as they are made); other fixed bodies carry `Content-Length`.
"""

from __future__ import annotations

import zlib
from dataclasses import replace
from typing import AsyncIterator

from edgellm.http import Request, Response
from edgellm.stream import close_source

TEXT_TYPES = ("application/json", "text/", "application/javascript", "application/x-ndjson", "image/svg+xml")


def accepts_gzip(request: Request) -> bool:
    codings = [part.split(";")[0].strip().lower() for part in (request.header("accept-encoding") or "").split(",")]
    return "gzip" in codings


def _compressible(request: Request, response: Response) -> bool:
    kind = (response.headers.get("content-type") or "").lower()
    return (
        request.method != "HEAD" and response.status not in (204, 304) and 200 <= response.status
        and "content-encoding" not in response.headers and "content-range" not in response.headers
        and kind.startswith(TEXT_TYPES) and accepts_gzip(request)
    )


def _window_for(size: int) -> tuple[int, int]:
    """gzip window bits and memLevel for a whole body of `size` bytes: a window no larger than
    the body compresses it to the same bytes, and setting up zlib's default 32 KiB window and
    hash (~90 us) cost more than compressing a cached answer of a few hundred bytes (~15 us)."""
    bits = min(15, max(9, size.bit_length()))
    return 16 + bits, min(8, max(2, bits - 6))


def encoded(response: Response, request: Request, compress: bool = True) -> Response:
    """The response as the platform sends it (see the module doc)."""
    if not compress or not _compressible(request, response):
        if not response.is_streaming and request.method != "HEAD" and response.status not in (204, 304):
            response.headers.setdefault("content-length", str(len(response.body)))
        return response
    headers = {k: v for k, v in response.headers.items() if k != "content-length"}
    headers["content-encoding"] = "gzip"
    headers["vary"] = "accept-encoding" if "vary" not in headers else headers["vary"] + ", accept-encoding"
    if not response.is_streaming:
        body = bytes(response.body)
        compressor = zlib.compressobj(6, zlib.DEFLATED, *_window_for(len(body)))
        return replace(response, headers=headers, body=compressor.compress(body) + compressor.flush())
    return replace(response, headers=headers, body=GzipStream(response.body))  # type: ignore[arg-type]


# A stream's gzip window (4 KiB) and memLevel: an SSE event is a few hundred bytes and repeats the
# one before it, so a small window compresses a whole answer to the same size (736 bytes for 60
# events of 247), and setting it up costs ~14 us where zlib's default 32 KiB window cost ~60 us,
# paid before the first token reaches the client.
STREAM_WINDOW = (16 + 12, 5)


class GzipStream:
    """A streamed body compressed on the fly, each chunk flushed so the client sees it at once."""

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        self.body = body
        self.compressor = zlib.compressobj(6, zlib.DEFLATED, *STREAM_WINDOW)
        self.finished = False

    def __aiter__(self) -> "GzipStream":
        return self

    async def __anext__(self) -> bytes:
        if self.finished:
            raise StopAsyncIteration
        try:
            chunk = await anext(self.body)
        except StopAsyncIteration:
            self.finished = True
            return self.compressor.flush(zlib.Z_FINISH)
        return self.compressor.compress(chunk) + self.compressor.flush(zlib.Z_SYNC_FLUSH)

    async def aclose(self) -> None:
        await close_source(self.body)
