"""A minimal keep-alive HTTP/1.1 client on asyncio streams, for benchmarks that compare servers.

httpx spends more per request than a fast server does (its request and response objects, its
connection pool, header normalisation): behind it a HIT and `/healthz` look alike because both are
mostly the client. This client writes a request prepared once as bytes and reads the answer by its
Content-Length (or chunks), so what is timed is mostly the server. `client_floor` measures what
it costs on its own, against a socket server that answers from memory, for the bench to print.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator
from urllib.parse import urlsplit


@dataclass(frozen=True)
class Prepared:
    """One request, rendered to bytes once; sent again and again on a kept-alive connection."""

    host: str
    port: int
    data: bytes

    @classmethod
    def build(cls, url: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> "Prepared":
        parts = urlsplit(url)
        payload = b"" if body is None else json.dumps(body).encode()
        lines = [f"{method} {path} HTTP/1.1", f"Host: {parts.hostname}:{parts.port}", "Connection: keep-alive"]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        return cls(parts.hostname or "127.0.0.1", parts.port or 80, ("\r\n".join(lines) + "\r\n\r\n").encode() + payload)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


class Connection:
    """One kept-alive connection; `send` writes a prepared request and reads its whole answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> "Connection":
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def send(self, request: Prepared) -> Answer:
        self.writer.write(request.data)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status_line, *lines = head[:-4].decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await self.reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
                chunk = await self.reader.readexactly(size + 2)
                if size == 0:
                    break
                chunks.append(chunk[:-2])
            body = b"".join(chunks)
        else:
            raise ValueError(f"an answer without a length: {headers}")
        return Answer(int(status_line.split(" ", 2)[1]), headers, body)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


@contextlib.asynccontextmanager
async def connections(host: str, port: int, n: int) -> AsyncIterator[list[Connection]]:
    opened = [await Connection.open(host, port) for _ in range(n)]
    try:
        yield opened
    finally:
        for c in opened:
            await c.close()


def _check(answer: Answer, expect: tuple[str, str | None] | None) -> None:
    if answer.status != 200:
        raise RuntimeError(f"status {answer.status}: {answer.body[:300]!r}")
    if expect is None:
        return
    name, value = expect  # value None: the header must be there, whatever it says
    if name not in answer.headers or (value is not None and answer.headers[name] != value):
        raise RuntimeError(f"expected {name}: {value or '(any)'}, got {answer.headers}")


async def latencies(conns: list[Connection], request: Prepared, total: int,
                    expect: tuple[str, str | None] | None = None) -> tuple[list[float], float]:
    """`total` requests spread over `conns` (one client each, back to back): every request's
    latency and the requests per second of the whole run."""
    remaining, samples = [total], []

    async def client(c: Connection) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            start = time.perf_counter()
            answer = await c.send(request)
            samples.append(time.perf_counter() - start)
            _check(answer, expect)

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in conns))
    return samples, total / (time.perf_counter() - start)


_FLOOR_ANSWER = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n"
                 b'{"status":"ok"}')


async def _floor_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answers every request from memory with no parsing beyond its end: the cheapest server this
    client can meet, so timing it measures the client (and the loopback) alone."""
    with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            writer.write(_FLOOR_ANSWER)
    writer.close()


async def _serve_floor(port: int) -> None:
    server = await asyncio.start_server(_floor_server, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":  # `python -m bench.raw_http PORT`: the floor server, in its own process
    import sys

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_floor(int(sys.argv[1])))
