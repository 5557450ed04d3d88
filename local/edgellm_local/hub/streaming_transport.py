"""An httpx transport for large downloads: HTTP/1.1 on an asyncio `BufferedProtocol`, so the
kernel copies body bytes straight into big buffers that are handed to the reader whole.

Why: httpx's default async transport reads 64 KiB at a time through anyio and h11. Profiling a
512 MiB pull on 2 cores showed ~16,000 reads, and those layers, not the network or the hashing,
set the pace. This transport does only what a pull needs (GET and HEAD without a request body;
Content-Length, chunked and close-delimited responses; keep-alive; http and https) and hands any
other request to httpx's own transport. Failures surface as httpx's exceptions (`ConnectError`,
`ReadTimeout`, `RemoteProtocolError`), translated here and nowhere else.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from typing import AsyncIterator, Callable

import httpx

BUFFER_SIZE = 1 << 20
LOW_WATER = 256 * 1024  # hand bytes over once this many are waiting (or the body is complete)
MAX_HEAD = 64 * 1024
_DIGITS = re.compile(rb"[0-9]{1,19}")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")


def parse_content_length(value: bytes) -> int:
    """RFC 9110 8.6: 1*DIGIT. A list of equal values (`5, 5`) is one length; anything else (a
    sign, `0x`, spaces inside, differing values, 20 digits) is a protocol error, never a ValueError."""
    values = {v.strip() for v in value.split(b",")}
    if len(values) != 1 or not _DIGITS.fullmatch(next(iter(values))):
        raise httpx.RemoteProtocolError(f"malformed Content-Length {value[:40]!r}")
    return int(next(iter(values)))


def parse_chunk_size(line: bytes) -> int:
    """RFC 9112 7.1: 1*HEXDIG, then optional `;extensions`. `int(x, 16)` alone would take
    `0x10`, `-1`, `+5` and `1_0`."""
    size = line.split(b";", 1)[0].strip(b" \t")
    if not _HEX.fullmatch(size):
        raise httpx.RemoteProtocolError(f"malformed chunk size {line[:40]!r}")
    return int(size, 16)


class _Connection(asyncio.BufferedProtocol):
    """One socket. Bytes land in `buf[:filled]`; the reader takes them with `take`/`read_line`."""

    def __init__(self) -> None:
        self.buf = bytearray(BUFFER_SIZE)
        self.filled = 0
        self.eof = False
        self.paused = False
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[None] | None = None

    # protocol side (called by the event loop)
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return memoryview(self.buf)[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        if self.filled == len(self.buf) and self.transport is not None:
            self.transport.pause_reading()  # the reader is behind: let TCP push back
            self.paused = True
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    # reader side
    async def wait(self, timeout: float | None) -> None:
        """Wait for more bytes (or EOF)."""
        if self.eof:
            raise httpx.RemoteProtocolError("the server closed the connection before the response was complete")
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(self.waiter, timeout)
        except asyncio.TimeoutError:
            raise httpx.ReadTimeout("timed out waiting for the server") from None
        finally:
            self.waiter = None

    def take(self, limit: int) -> bytearray | memoryview:
        """Up to `limit` received bytes. A full handover swaps in a fresh buffer: no copy."""
        n = min(self.filled, limit)
        if n == self.filled:
            data, self.buf, self.filled = memoryview(self.buf)[:n], bytearray(BUFFER_SIZE), 0
        else:
            data = bytes(self.buf[:n])  # framing bytes follow: rare (chunk ends) and small
            del self.buf[:n]
            self.buf.extend(bytes(n))
            self.filled -= n
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        return data

    async def read_line(self, timeout: float | None) -> bytes:
        while (end := self.buf.find(b"\r\n", 0, self.filled)) < 0:
            if self.filled >= MAX_HEAD:
                raise httpx.RemoteProtocolError("response head is too long")
            await self.wait(timeout)
        return bytes(self.take(end + 2))[:-2]

    async def body(self, length: int | None, timeout: float | None) -> AsyncIterator[bytearray | memoryview]:
        """`length` bytes (None: until the server closes), in pieces of up to BUFFER_SIZE."""
        left = length
        while left is None or left > 0:
            want = BUFFER_SIZE if left is None else min(left, LOW_WATER)
            while self.filled < want and not self.eof:
                await self.wait(timeout)
            if self.filled == 0:
                if left is None:
                    return
                raise httpx.RemoteProtocolError(f"the server closed the connection {left} bytes short of the body")
            data = self.take(self.filled if left is None else left)
            if left is not None:
                left -= len(data)
            yield data

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _ResponseBody(httpx.AsyncByteStream):
    def __init__(self, chunks: AsyncIterator[bytearray | memoryview], release: Callable[[bool], None]) -> None:
        self.chunks, self.release, self.complete = chunks, release, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.chunks:
            yield chunk  # type: ignore[misc]  # bytes-like: pwrite and hashlib take it as is
        self.complete = True

    async def aclose(self) -> None:
        self.release(self.complete)


class StreamingTransport(httpx.AsyncBaseTransport):
    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ssl_context = ssl_context
        self.idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self.fallback = httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        has_body = request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers
        if request.method not in ("GET", "HEAD") or has_body or request.url.scheme not in ("http", "https"):
            return await self.fallback.handle_async_request(request)
        timeouts = request.extensions.get("timeout", {})
        key = (request.url.scheme, request.url.host, request.url.port or (443 if request.url.scheme == "https" else 80))
        while True:
            conn, reused = await self._connection(key, timeouts.get("connect"))
            head = b"".join([f"{request.method} ".encode(), request.url.raw_path, b" HTTP/1.1\r\n"]
                            + [name + b": " + value + b"\r\n" for name, value in request.headers.raw] + [b"\r\n"])
            conn.transport.write(head)  # type: ignore[union-attr]
            try:
                status, reason, headers = await self._read_head(conn, timeouts.get("read"))
                break
            except httpx.RemoteProtocolError:
                conn.close()
                if not reused:  # a kept-alive connection the server had closed: try a fresh one
                    raise
        return self._response(request, key, conn, status, reason, headers, timeouts.get("read"))

    def _response(self, request: httpx.Request, key: tuple[str, str, int], conn: _Connection, status: int,
                  reason: bytes, headers: list[tuple[bytes, bytes]], timeout: float | None) -> httpx.Response:
        fields: dict[bytes, bytes] = {}
        for name, value in headers:  # repeated fields are one comma-separated list (RFC 9110 5.3)
            name = name.lower()
            fields[name] = fields[name] + b", " + value if name in fields else value
        keep_alive = fields.get(b"connection", b"").lower() != b"close"
        if request.method == "HEAD" or status in (204, 304):
            chunks, length = _nothing(), 0
        elif b"chunked" in fields.get(b"transfer-encoding", b"").lower():
            chunks, length = _chunked(conn, timeout), -1
        elif b"content-length" in fields:
            length = parse_content_length(fields[b"content-length"])
            chunks = conn.body(length, timeout)
        else:
            chunks, length, keep_alive = conn.body(None, timeout), -1, False

        def release(complete: bool) -> None:
            if complete and keep_alive and not conn.eof:
                self.idle.setdefault(key, []).append(conn)
            else:
                conn.close()

        stream = _ResponseBody(chunks, release)
        return httpx.Response(status, headers=headers, stream=stream, extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason})

    async def _connection(self, key: tuple[str, str, int], timeout: float | None) -> tuple[_Connection, bool]:
        pool = self.idle.get(key, [])
        while pool:
            conn = pool.pop()
            if not conn.eof:
                return conn, True
            conn.close()
        scheme, host, port = key
        context = None
        if scheme == "https":
            context = self.ssl_context or ssl.create_default_context()
        try:
            _, conn = await asyncio.wait_for(
                asyncio.get_running_loop().create_connection(_Connection, host, port, ssl=context), timeout
            )
        except asyncio.TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {host}:{port}: {exc}") from None
        return conn, False

    async def _read_head(self, conn: _Connection, timeout: float | None) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        while True:
            status_line = await conn.read_line(timeout)
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise httpx.RemoteProtocolError(f"malformed status line {status_line[:100]!r}")
            headers = []
            while line := await conn.read_line(timeout):
                name, sep, value = line.partition(b":")
                if not sep:
                    raise httpx.RemoteProtocolError(f"malformed header line {line[:100]!r}")
                headers.append((name.strip(), value.strip()))
            if int(parts[1]) >= 200 or int(parts[1]) == 101:
                return int(parts[1]), parts[2] if len(parts) > 2 else b"", headers

    async def aclose(self) -> None:
        for pool in self.idle.values():
            for conn in pool:
                conn.close()
        self.idle.clear()
        await self.fallback.aclose()


async def _nothing() -> AsyncIterator[bytearray | memoryview]:
    return
    yield  # an empty async generator


async def _chunked(conn: _Connection, timeout: float | None) -> AsyncIterator[bytearray | memoryview]:
    while True:
        size = parse_chunk_size(await conn.read_line(timeout))
        if size == 0:
            while await conn.read_line(timeout):  # trailers, then the blank line
                pass
            return
        async for piece in conn.body(size, timeout):
            yield piece
        if await conn.read_line(timeout) != b"":
            raise httpx.RemoteProtocolError("chunk not followed by CRLF")
