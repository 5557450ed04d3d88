"""What Cloudflare's edge adds to every response, done the same way on the local edge.

Text responses (JSON, HTML, SSE, JS, CSS) are gzip-compressed when the client sends
`Accept-Encoding: gzip`, and `Content-Length` is then dropped (a stream is flushed chunk by chunk,
so tokens still arrive as they are made); other fixed bodies carry `Content-Length`.
"""

from __future__ import annotations

import struct
import zlib
from functools import lru_cache
from typing import AsyncIterator

from edgellm.http import Request, Response
from edgellm.kept_json import KeptBytes
from edgellm.stream import close_source

TEXT_TYPES = ("application/json", "text/", "application/javascript", "application/x-ndjson", "image/svg+xml")


def accepts_gzip(request: Request) -> bool:
    return _names_gzip(request.header("accept-encoding") or "")


@lru_cache(maxsize=64)  # a client sends the same few values on every request (`gzip, deflate`)
def _names_gzip(accept_encoding: str) -> bool:
    return "gzip" in (part.split(";")[0].strip().lower() for part in accept_encoding.split(","))


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
    vary = headers.get("vary")
    headers["vary"] = "accept-encoding" if vary is None else vary + ", accept-encoding"
    body = response.body
    if isinstance(body, KeptBytes) and body.head_size <= STORED_BLOCK_MAX:
        return Response(response.status, headers, gzip_kept(body))
    if not response.is_streaming:
        body = bytes(body)
        compressor = zlib.compressobj(6, zlib.DEFLATED, *_window_for(len(body)))
        return Response(response.status, headers, compressor.compress(body) + compressor.flush())
    return Response(response.status, headers, GzipStream(body))  # type: ignore[arg-type]


# gzip's member header (RFC 1952): magic, deflate, no flags, no mtime, no extra flags, OS unknown
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
STORED_BLOCK_MAX = 0xFFFF  # a stored deflate block's LEN is 16 bits (RFC 1951 3.2.4)


def gzip_kept(body: KeptBytes) -> bytes:
    """gzip of a HIT's kept answer (`kept_json`) without compressing it per answer: its own
    leading fields as a stored deflate block (not final), then the kept rest's deflate, made
    once per entry and kept with it. A stored block ends on a byte boundary and a fresh
    deflate stream refers back only into its own bytes, so the two make one valid stream (as
    pigz joins its parts); the trailer's CRC-32 runs over the whole body. Compressing a few
    hundred bytes again per answer (zlib's set-up included) cost 130k instructions a HIT, more
    than everything else a HIT does beyond `/healthz`."""
    kept, size = body.kept, body.head_size
    tail = kept.derived.get("gzip")
    if tail is None:
        gzip_bits, mem_level = _window_for(len(kept.rest))
        compressor = zlib.compressobj(6, zlib.DEFLATED, 16 - gzip_bits, mem_level)  # raw deflate: no header of its own
        tail = kept.derived["gzip"] = compressor.compress(kept.rest) + compressor.flush()
    head = body[:size]
    stored = b"\x00" + struct.pack("<HH", size, size ^ 0xFFFF) + head if size else b""  # BFINAL 0, BTYPE 00
    trailer = struct.pack("<II", zlib.crc32(kept.rest, zlib.crc32(head)), len(body) & 0xFFFFFFFF)
    return b"".join((GZIP_HEADER, stored, tail, trailer))


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
