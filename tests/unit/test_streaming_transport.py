"""`StreamingTransport` against a real socket server with canned HTTP/1.1 responses: body
framings (Content-Length, chunked, close-delimited, none), keep-alive reuse and a stale kept-alive
connection, and failures surfacing as httpx's own exceptions."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import AsyncIterator

import httpx
import pytest

from edgellm_local.hub.streaming_transport import StreamingTransport

BIG = os.urandom(3 * 1024 * 1024 + 17)


def canned(path: str) -> tuple[bytes, bool]:
    """(raw response, close the connection afterwards) for a request path."""
    if path == "/big":
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BIG) + BIG, False
    if path == "/chunked":
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n", False
    if path == "/until-close":
        return b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", True
    if path == "/short":
        return b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nonly this", True
    if path == "/not-modified":
        return b"HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nContent-Length: 55\r\n\r\n", False
    if path == "/continue":
        return b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", False
    if path.startswith("/length/"):  # a hostile or odd Content-Length, given in the path
        value = bytes.fromhex(path.removeprefix("/length/"))
        return b"HTTP/1.1 200 OK\r\n" + b"".join(b"Content-Length: " + v + b"\r\n" for v in value.split(b"|")) + b"\r\nabc", True
    if path.startswith("/chunk/"):
        size = bytes.fromhex(path.removeprefix("/chunk/"))
        return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\nabc\r\n0\r\n\r\n", True
    if path == "/garbage":
        return b"SPDY/9 what\r\n\r\n", True
    if path == "/then-close":  # answers, then drops the kept-alive connection
        return b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\none", True
    return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n", False


@dataclass
class Server:
    port: int = 0
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    closed: int = 0  # connections this server has closed (its socket shut), counted once they are
    closing: asyncio.Condition = field(default_factory=asyncio.Condition)
    drop: asyncio.Event = field(default_factory=asyncio.Event)  # /then-close drops its connection once this is set

    async def wait_closed(self, count: int) -> None:
        """Until this server has closed `count` connections: what a test waits on instead of a sleep."""
        async with self.closing:
            await asyncio.wait_for(self.closing.wait_for(lambda: self.closed >= count), 10)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                self.requests.append(head)
                method, path = head.split(b" ")[:2]
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if path == b"/hang":
                    await asyncio.sleep(5)
                    return
                raw, close = canned(path.decode())
                if method == b"HEAD":
                    raw = raw.split(b"\r\n\r\n")[0] + b"\r\n\r\n"
                if method == b"POST":
                    raw = b"HTTP/1.1 201 Created\r\nContent-Length: 7\r\n\r\nposted!"
                writer.write(raw)
                await writer.drain()
                if path == b"/then-close":
                    await self.drop.wait()
                if close:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except ConnectionError:
                pass
            async with self.closing:
                self.closed += 1
                self.closing.notify_all()


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    state = Server()
    srv = await asyncio.start_server(state.handle, "127.0.0.1", 0)
    state.port = srv.sockets[0].getsockname()[1]
    yield state
    srv.close()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=StreamingTransport(), timeout=2.0) as c:
        yield c


async def test_a_large_body_arrives_whole_in_big_pieces_and_the_connection_is_reused(server: Server, client: httpx.AsyncClient) -> None:
    url = f"http://127.0.0.1:{server.port}/big"
    pieces: list[int] = []
    received = bytearray()
    async with client.stream("GET", url) as response:
        assert response.status_code == 200 and response.headers["content-length"] == str(len(BIG))
        async for chunk in response.aiter_raw():
            pieces.append(len(chunk))
            received += chunk
    assert bytes(received) == BIG
    assert max(pieces) > 64 * 1024  # not httpx's default 64 KiB reads
    assert (await client.get(url)).content == BIG
    assert server.connections == 1


@pytest.mark.parametrize(
    "path, status, body",
    [
        ("/chunked", 200, b"hello world"),
        ("/until-close", 200, b"all of it"),
        ("/not-modified", 304, b""),
        ("/continue", 200, b"ok"),
        ("/missing", 404, b""),
    ],
)
async def test_body_framings(server: Server, client: httpx.AsyncClient, path: str, status: int, body: bytes) -> None:
    response = await client.get(f"http://127.0.0.1:{server.port}{path}")
    assert (response.status_code, response.content) == (status, body)


async def test_head_has_no_body_even_with_a_content_length(server: Server, client: httpx.AsyncClient) -> None:
    response = await client.head(f"http://127.0.0.1:{server.port}/big")
    assert response.headers["content-length"] == str(len(BIG)) and response.content == b""
    assert (await client.get(f"http://127.0.0.1:{server.port}/chunked")).content == b"hello world"
    assert server.connections == 1


async def test_a_kept_alive_connection_the_server_closed_is_replaced(server: Server, client: httpx.AsyncClient) -> None:
    base = f"http://127.0.0.1:{server.port}"
    assert (await client.get(base + "/then-close")).content == b"one"
    assert server.closed == 0 and client._transport.idle  # type: ignore[attr-defined]  # kept alive, in the pool
    server.drop.set()
    await server.wait_closed(1)  # the pooled connection is now stale: its server end is shut
    assert (await client.get(base + "/chunked")).content == b"hello world"
    assert server.connections == 2 and server.requests[-1].startswith(b"GET /chunked")


async def test_a_body_cut_short_is_a_protocol_error(server: Server, client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="991 bytes short"):
        await client.get(f"http://127.0.0.1:{server.port}/short")


async def test_a_malformed_status_line_is_a_protocol_error(server: Server, client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="malformed status line"):
        await client.get(f"http://127.0.0.1:{server.port}/garbage")


async def test_a_silent_server_times_out(server: Server) -> None:
    async with httpx.AsyncClient(transport=StreamingTransport(), timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(f"http://127.0.0.1:{server.port}/hang")


async def test_a_refused_connection_is_a_connect_error(client: httpx.AsyncClient) -> None:
    with pytest.raises(httpx.ConnectError):
        await client.get("http://127.0.0.1:9/")  # discard port: nothing listens


async def test_requests_with_a_body_go_through_httpx_own_transport(server: Server, client: httpx.AsyncClient) -> None:
    response = await client.post(f"http://127.0.0.1:{server.port}/anything", content=b"payload")
    assert (response.status_code, response.content) == (201, b"posted!")
    assert server.requests[-1].startswith(b"POST /anything HTTP/1.1")


@pytest.mark.parametrize("value, body", [(b"3", b"abc"), (b" 3 ", b"abc"), (b"3, 3", b"abc"), (b"3|3", b"abc"), (b"0", b"")])
async def test_content_lengths_that_are_one_number_frame_the_body(server: Server, client: httpx.AsyncClient, value: bytes, body: bytes) -> None:
    response = await client.get(f"http://127.0.0.1:{server.port}/length/{value.hex()}")
    assert response.content == body


@pytest.mark.parametrize("value", [b"abc", b"-1", b"+3", b"0x3", b"3 3", b"3, 4", b"3|4", b"", b"1" * 20, "\u0663".encode(), b"3_0", b"3.0"])
async def test_a_hostile_content_length_is_a_protocol_error_not_a_traceback(server: Server, client: httpx.AsyncClient, value: bytes) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="malformed Content-Length"):
        await client.get(f"http://127.0.0.1:{server.port}/length/{value.hex()}")


@pytest.mark.parametrize("size", [b"0x3", b"-3", b"+3", b"3_0", b"", b"g", b"1" * 16])
async def test_a_hostile_chunk_size_is_a_protocol_error(server: Server, client: httpx.AsyncClient, size: bytes) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="malformed chunk size"):
        await client.get(f"http://127.0.0.1:{server.port}/chunk/{size.hex()}")
