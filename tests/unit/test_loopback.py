"""The slot pool's client of llama.cpp's loopback HTTP API (loopback.py): one kept-alive
connection serves call after call, a connection the server dropped while idle is replaced
without failing the call, an error status is a BindingError, and a call cut short never leaves
its connection to the next one. Against a scripted HTTP server, then llama.cpp's own."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgellm.ports import BindingError
from edgellm_local.llama.loopback import Loopback
from edgellm_local.llama.runner import LlamaCppRunner


@dataclass
class Scripted:
    """An HTTP/1.1 server answering each request with `answer(path, body)` -> raw response bytes
    (or None: close the connection without answering)."""

    answer: Callable[[str, bytes], bytes | None]
    connections: int = 0
    requests: list[tuple[str, bytes]] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
                body = await reader.readexactly(length)
                path = lines[0].split(" ")[1]
                self.requests.append((path, body))
                self.arrived.set()
                response = self.answer(path, body)
                if response is None:
                    break
                writer.write(response)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"


def ok(body: dict[str, object], extra: str = "") -> bytes:
    data = json.dumps(body).encode()
    return f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n{extra}\r\n".encode() + data


Answer = Callable[[str, bytes], "bytes | None"]


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[Answer], Awaitable[Scripted]]]:
    """Start a `Scripted` server (closed after the test)."""
    made: list[Scripted] = []

    async def start(answer: Answer) -> Scripted:
        server = Scripted(answer)
        server.server = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        made.append(server)
        return server

    yield start
    for server in made:
        assert server.server is not None
        server.server.close()


async def test_calls_share_one_kept_alive_connection(scripted: Callable[[Answer], Awaitable[Scripted]]) -> None:
    server = await scripted(lambda path, body: ok({"path": path, "got": json.loads(body)}))
    client = Loopback(server.url)
    for i in range(3):
        answer = await client.post(f"/slots/{i}?action=erase", {"n": i}, "slot erase")
        assert answer == {"path": f"/slots/{i}?action=erase", "got": {"n": i}}
    assert server.connections == 1
    client.close()


async def test_a_connection_the_server_dropped_while_idle_is_replaced() -> None:
    s = Scripted(lambda path, body: ok({"n": 0}))
    closing: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closing.append(writer)
        await s.handle(reader, writer)

    s.server = await asyncio.start_server(handle, "127.0.0.1", 0)
    client = Loopback(s.url)
    assert await client.post("/a", {}, "a") == {"n": 0}
    closing[0].close()  # the server's keep-alive timeout: it closes the idle connection
    await closing[0].wait_closed()
    assert await client.post("/b", {}, "b") == {"n": 0}  # a fresh connection, not a failed call
    assert s.connections == 2
    s.server.close()
    client.close()


async def test_a_request_the_server_closed_on_unanswered_is_sent_again_on_a_fresh_connection(
    scripted: Callable[[Answer], Awaitable[Scripted]],
) -> None:
    """The server may close a kept-alive connection just as a request goes out on it (its idle
    timeout): the request is sent again once, on a new connection (slot actions are idempotent)."""
    seen: list[str] = []

    def answer(path: str, body: bytes) -> bytes | None:
        seen.append(path)
        return None if len(seen) == 2 else ok({"n": len(seen)})

    server = await scripted(answer)
    client = Loopback(server.url)
    assert await client.post("/a", {}, "a") == {"n": 1}
    assert await client.post("/b", {}, "b") == {"n": 3}  # closed unanswered at its first try
    assert seen == ["/a", "/b", "/b"] and server.connections == 2
    client.close()


async def test_connection_close_and_chunked_answers(scripted: Callable[[Answer], Awaitable[Scripted]]) -> None:
    def answer(path: str, body: bytes) -> bytes:
        if path == "/chunked":
            return b'HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{"a":\r\n2\r\n1}\r\n0\r\n\r\n'
        return ok({"closed": True}, "Connection: close\r\n")

    server = await scripted(answer)
    client = Loopback(server.url)
    assert await client.post("/chunked", {}, "chunked") == {"a": 1}
    assert await client.post("/close", {}, "close") == {"closed": True}  # the server said close: not kept
    assert await client.post("/chunked", {}, "chunked") == {"a": 1}
    assert server.connections == 2


async def test_an_error_status_is_a_binding_error_naming_the_action(scripted: Callable[[Answer], Awaitable[Scripted]]) -> None:
    body = b'{"error":{"code":400,"message":"Invalid slot ID"}}'
    server = await scripted(lambda path, _: b"HTTP/1.1 400 Bad Request\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    client = Loopback(server.url)
    with pytest.raises(BindingError, match="llama.cpp slot restore failed: 400"):
        await client.post("/slots/9?action=restore", {"filename": "x"}, "slot restore")
    assert await asyncio.wait_for(_fails_again(client), 5)  # the connection is still usable (a whole answer was read)
    assert server.connections == 1


async def _fails_again(client: Loopback) -> bool:
    try:
        await client.post("/again", {}, "slot erase")
    except BindingError as exc:
        return "400" in str(exc)
    return False


async def test_a_call_cancelled_mid_answer_never_hands_its_connection_on(scripted: Callable[[Answer], Awaitable[Scripted]]) -> None:
    def answer(path: str, body: bytes) -> bytes | None:
        if path == "/slow":
            return b""  # nothing yet: the caller is left waiting for its answer
        return ok({"path": path})

    server = await scripted(answer)
    client = Loopback(server.url)
    call = asyncio.ensure_future(client.post("/slow", {}, "slot save"))
    await server.arrived.wait()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # the slow call's answer may still arrive on its connection: the next call must not read it
    assert await client.post("/next", {}, "slot erase") == {"path": "/next"}
    assert server.connections == 2


async def test_slot_actions_on_llama_cpp_reuse_one_connection(tiny_model: Path, tmp_path: Path) -> None:
    runner = LlamaCppRunner(tiny_model, n_ctx=512, n_parallel=2, threads=1, slot_dir=tmp_path / "slots", cache_ram_mib=0).load()
    try:
        runner.chat({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2, "temperature": 0, "id_slot": 0,
                     "cache_prompt": True})
        saved = await runner.slot_action_async(0, "save", "a.slot")
        assert saved["n_saved"] > 0 and (tmp_path / "slots" / "a.slot").is_file()
        restored = await runner.slot_action_async(1, "restore", "a.slot")
        assert restored["n_restored"] == saved["n_saved"]
        await runner.slot_action_async(1, "erase")
        assert runner._client is not None and len(runner._client._idle) == 1  # noqa: SLF001  (one connection, kept)
        with pytest.raises(BindingError, match="slot restore failed"):
            await runner.slot_action_async(0, "restore", "missing.slot")
    finally:
        runner.close()
