"""llama.cpp's own HTTP API on the in-process server's loopback port, spoken from the event loop.

The slot pool's actions (save, restore, erase: `POST /slots/{id}?action=...`) exist only there
(xllamacpp's Python API has none), and a sessionless request whose tenant's prompt was kept waits
for a restore before its first token. Through `urllib` in a thread that wait was 2-4 ms on this
machine for a 0.4 ms load inside llama.cpp: a thread hop, a new TCP connection and urllib's
opener per call, and the thread reacquiring the GIL behind the state's hashing thread. Here the
request is written and read with the loop's own socket calls over kept-alive connections: no
thread, no reconnect, and the loop is idle (holding no GIL) while llama.cpp works.

Each call runs within the awaiting request (its futures are that request's, as the isolating loop
requires); the idle connections are the binding's, like the SQLite handles of the emulator's
bindings, and are never used by two calls at once (a call takes one out of the idle list, or
opens a new one, and puts it back only after a complete answer that lets it stay open).
"""

from __future__ import annotations

import asyncio
import json
import socket
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from edgellm.ports import BindingError

MAX_HEAD = 64 * 1024  # a status line and headers of llama.cpp's server: a few hundred bytes
MAX_IDLE = 4  # kept-alive connections (one per concurrent slot action is all a 2-slot pool uses)


class _Closed(ConnectionError):
    """The server closed the connection before a whole answer."""


@dataclass
class Loopback:
    """An HTTP/1.1 client for one llama.cpp server's loopback address (`http://host:port`)."""

    url: str
    _idle: list[socket.socket] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80

    async def post(self, path: str, payload: dict[str, Any], what: str) -> dict[str, Any]:
        """POST `payload` as JSON, return the JSON answer; a non-2xx status is a `BindingError`
        naming `what` (its body's start goes to the error, which callers log, never to a client)."""
        body = json.dumps(payload).encode()
        request = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body
        loop = asyncio.get_running_loop()
        while True:
            sock = self._take()
            reused = sock is not None
            if sock is None:
                sock = await self._connect(loop)
            try:
                status, keep, data = await _exchange(loop, sock, request)
            except _Closed:
                sock.close()
                if reused:  # the server dropped an idle connection (its keep-alive timeout): a fresh one
                    continue
                raise
            except BaseException:  # cancelled or failed mid-exchange: the connection's state is unknown
                sock.close()
                raise
            if keep and len(self._idle) < MAX_IDLE:
                self._idle.append(sock)
            else:
                sock.close()
            break
        if not 200 <= status < 300:
            raise BindingError(f"llama.cpp {what} failed: {status} {data[:200]!r}")
        return json.loads(data or b"{}")

    def _take(self) -> socket.socket | None:
        """An idle connection the server has not closed (a closed one reads as end of file)."""
        while self._idle:
            sock = self._idle.pop()
            try:
                if sock.recv(1, socket.MSG_PEEK) == b"":
                    sock.close()
                    continue
            except BlockingIOError:  # nothing to read: open
                return sock
            except OSError:
                sock.close()
                continue
            sock.close()  # bytes nobody asked for: not a connection to trust
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await loop.sock_connect(sock, (self.host, self.port))
        except BaseException:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        for sock in self._idle:
            sock.close()
        self._idle.clear()


async def _exchange(loop: asyncio.AbstractEventLoop, sock: socket.socket, request: bytes) -> tuple[int, bool, bytes]:
    """Send `request`, read one answer: (status, whether the connection may be kept, body)."""
    try:
        await loop.sock_sendall(sock, request)
    except (BrokenPipeError, ConnectionResetError) as exc:
        raise _Closed(str(exc)) from exc
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = await _recv(loop, sock, not buffer)
        buffer += chunk
        if len(buffer) > MAX_HEAD:
            raise BindingError("llama.cpp's loopback answer has an oversized head")
    head, _, rest = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        version, status_text = lines[0].split(" ", 2)[:2]
        status = int(status_text)
    except ValueError:
        raise BindingError(f"llama.cpp's loopback answer is not HTTP: {lines[0][:80]!r}") from None
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return status, keep, await _chunked(loop, sock, rest)
    if "content-length" in headers:
        length = int(headers["content-length"])
        while len(rest) < length:
            rest += await _recv(loop, sock, False)
        return status, keep and len(rest) == length, rest[:length]
    while chunk := await loop.sock_recv(sock, 65536):  # no length: the body ends with the connection
        rest += chunk
    return status, False, rest


async def _recv(loop: asyncio.AbstractEventLoop, sock: socket.socket, first: bool) -> bytes:
    try:
        chunk = await loop.sock_recv(sock, 65536)
    except ConnectionResetError as exc:
        if first:
            raise _Closed(str(exc)) from exc
        raise
    if not chunk:
        if first:
            raise _Closed("the server closed the connection")
        raise BindingError("llama.cpp's loopback answer was cut short")
    return chunk


async def _chunked(loop: asyncio.AbstractEventLoop, sock: socket.socket, rest: bytes) -> bytes:
    body = b""
    while True:
        while b"\r\n" not in rest:
            rest += await _recv(loop, sock, False)
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        while len(rest) < size + 2:
            rest += await _recv(loop, sock, False)
        if size == 0:
            return body
        body, rest = body + rest[:size], rest[size + 2:]
