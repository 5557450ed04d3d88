"""Zero-copy R2 bodies (zero_copy.py) through the real local edge HTTP server: the bytes are
exact, sendfile(2) really sent them (`EdgeApp.zero_copy_stats`), a client that leaves or reads
slowly costs nothing lasting, and every case it cannot serve falls back to the chunked path
with the same headers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import http.client
import json
import os
import socket
import time
from pathlib import Path
from typing import Callable

import httpx
import pytest

from edgellm_local.emulator.r2 import FileR2
from edgellm_local.emulator.server import EdgeApp, EdgeServer

SIZE = 6 * 1024 * 1024 + 12345  # several MiB, not a multiple of any chunk size
BIG = 64 * 1024 * 1024  # more than loopback's socket buffers hold: the sender must wait for room
DATA = os.urandom(SIZE)
HEX = hashlib.sha256(DATA).hexdigest()
SHARD = f"models/zc/blobs/sha256-{HEX}"
MANIFEST = {"schema": "edgellm.manifest/1", "name": "zc", "shards": [{"path": f"blobs/sha256-{HEX}", "size": SIZE, "sha256": HEX}]}


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Wait for a state the server exposes (its counters, its descriptors), with a deadline."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def socket_fds() -> set[str]:
    """This process's socket descriptors, after the collector has closed every unreachable one
    (earlier tests' clients and servers): what is left is held open by someone."""
    gc.collect()
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(FileNotFoundError):
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                found.add(fd)
    return found


@pytest.fixture
def bucket(tmp_path: Path) -> FileR2:
    store = FileR2(tmp_path / "bucket")

    async def fill() -> None:
        await store.put(SHARD, DATA, http_metadata={"contentType": "application/octet-stream"})
        await store.put("models/zc/manifest.json", json.dumps(MANIFEST).encode() * 50, http_metadata={"contentType": "application/json"})
        big = os.urandom(1 << 20) * (BIG >> 20)
        await store.put(f"models/zc/blobs/sha256-{hashlib.sha256(big).hexdigest()}", big,
                        http_metadata={"contentType": "application/octet-stream"})

    asyncio.run(fill())
    return store


def big_key(bucket: FileR2) -> str:
    listed = asyncio.run(bucket.list("models/zc/blobs/"))
    return next(o.key for o in listed["objects"] if o.key != SHARD)


@pytest.fixture
def serve(make_deps: Callable[..., object], bucket: FileR2):
    servers: list[EdgeServer] = []

    def start(kind: str = "fast", compress: bool = False) -> EdgeServer:
        server = EdgeServer(EdgeApp(make_deps(r2=bucket), None, compress=compress), kind=kind).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


RANGES = [
    ("bytes=0-0", 0, 1),  # the first byte
    ("bytes=1000-2000999", 1000, 2_000_000),  # the middle
    ("bytes=-12345", SIZE - 12345, 12345),  # a suffix
    ("bytes=1048576-5242879", 1 << 20, 4 << 20),  # multi-MiB, on MiB boundaries
    ("bytes=3-", 3, SIZE - 3),  # open-ended, to the last byte
]


def test_full_and_range_gets_are_byte_exact_and_sent_with_sendfile(serve: Callable[..., EdgeServer]) -> None:
    server = serve()
    stats = server.app.zero_copy_stats
    with httpx.Client(base_url=server.url, timeout=30, headers={"accept-encoding": "identity"}) as client:
        head = client.head(f"/{SHARD}")
        assert head.status_code == 200 and head.headers["content-length"] == str(SIZE)
        full = client.get(f"/{SHARD}")
        assert full.status_code == 200 and full.content == DATA
        assert full.headers["content-length"] == str(SIZE) and full.headers["etag"] == head.headers["etag"]
        assert "transfer-encoding" not in full.headers
        assert hashlib.sha256(full.content).hexdigest() == MANIFEST["shards"][0]["sha256"]  # the manifest's integrity holds
        # the client can hold the last byte before the server's loop has counted it: wait for the count
        wait_until(lambda: stats.bodies == 1, "the full body counted")
        assert stats.bytes == SIZE
        for header, start, length in RANGES:
            part = client.get(f"/{SHARD}", headers={"range": header})
            assert part.status_code == 206, header
            assert part.content == DATA[start : start + length], header
            assert part.headers["content-length"] == str(length), header
            assert part.headers["content-range"] == f"bytes {start}-{start + length - 1}/{SIZE}", header
            assert part.headers["etag"] == head.headers["etag"], header
        # keep-alive held: every answer on the same connection, each one zero-copy
        wait_until(lambda: stats.bodies == 1 + len(RANGES), "every range counted")
        assert stats.bytes == SIZE + sum(n for _h, _s, n in RANGES)
        assert stats.fallbacks == 0 and stats.stopped == 0 and stats.in_flight == 0
        assert client.get("/healthz").status_code == 200  # the connection still speaks HTTP after them


def raw_get(server: EdgeServer, path: str, receive_buffer: int = 16384) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=30)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nAccept-Encoding: identity\r\n\r\n".encode())
    return sock


def read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    got = b""
    while b"\r\n\r\n" not in got:
        piece = sock.recv(65536)
        assert piece, "the server closed before its headers"
        got += piece
    head, _, rest = got.partition(b"\r\n\r\n")
    return head, rest


def test_client_leaving_mid_body_stops_the_send_and_leaks_nothing(serve: Callable[..., EdgeServer], bucket: FileR2) -> None:
    server = serve()
    stats = server.app.zero_copy_stats
    key = big_key(bucket)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
    connections = server.server.server_state.connections
    wait_until(lambda: not connections, "the server to close its idle connection")
    baseline = socket_fds()
    for _ in range(3):
        sock = raw_get(server, f"/{key}")
        head, rest = read_head(sock)
        assert b" 200 " in head.split(b"\r\n")[0] and f"content-length: {BIG}".encode() in head.lower()
        wait_until(lambda: stats.in_flight == 1, "the sender thread to start")
        assert len(rest) + len(sock.recv(65536)) > 0  # body bytes are flowing
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # leave with a reset
        sock.close()
        wait_until(lambda: stats.in_flight == 0, "the sender thread to stop")
    wait_until(lambda: not connections, "the server to close the connections")
    assert stats.stopped == 3 and stats.bodies == 0  # none counted as sent in full
    assert socket_fds() - baseline == set(), "a socket descriptor outlived its connection"
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.get("/healthz").status_code == 200
        assert client.get(f"/{SHARD}").content == DATA  # and it still sends files
    wait_until(lambda: stats.bodies == 1, "that body counted")


def test_a_slow_reader_does_not_stall_anyone_else(serve: Callable[..., EdgeServer], bucket: FileR2) -> None:
    server = serve()
    stats = server.app.zero_copy_stats
    key = big_key(bucket)
    sock = raw_get(server, f"/{key}")
    try:
        head, rest = read_head(sock)
        wait_until(lambda: stats.in_flight == 1, "the sender thread to start")
        # the slow client reads nothing more now: its socket fills and the sender waits for room
        with httpx.Client(base_url=server.url, timeout=5) as client:
            for _ in range(20):
                assert client.get("/healthz").status_code == 200
            assert client.get(f"/{SHARD}", headers={"range": "bytes=-4096"}).content == DATA[-4096:]  # another file meanwhile
        wait_until(lambda: stats.bodies == 1, "the small range counted")
        assert stats.in_flight == 1  # the big body is still waiting on its reader
        received = hashlib.sha256(rest)
        got = len(rest)
        while got < BIG:  # now it reads the lot: every byte, in order
            piece = sock.recv(1 << 20)
            assert piece, f"the server closed after {got} of {BIG} bytes"
            received.update(piece)
            got += len(piece)
        assert received.hexdigest() == key.rsplit("sha256-", 1)[1]
    finally:
        sock.close()
    wait_until(lambda: stats.bodies == 2, "the big body counted")
    assert stats.stopped == 0 and stats.in_flight == 0 and stats.bytes == BIG + 4096


def test_head_gzip_and_h11_fall_back_to_chunks_with_the_same_headers(serve: Callable[..., EdgeServer]) -> None:
    fast, baseline, compressing = serve(), serve(kind="baseline"), serve(compress=True)
    with httpx.Client(timeout=30, headers={"accept-encoding": "identity"}) as client:
        zero_copied = client.get(f"{fast.url}/{SHARD}", headers={"range": "bytes=100-"})
        wait_until(lambda: fast.app.zero_copy_stats.bodies == 1, "the zero-copy body counted")
        # HEAD: the headers alone, no body sent by any path
        head = client.head(f"{fast.url}/{SHARD}")
        assert head.status_code == 200 and head.content == b"" and head.headers["content-length"] == str(SIZE)
        assert fast.app.zero_copy_stats.bodies == 1
        # ... and the connection stays whole: a HEAD that reached the sender would end it in an error
        connection = http.client.HTTPConnection(fast.host, fast.port, timeout=30)
        try:
            for _ in range(2):
                connection.request("HEAD", f"/{SHARD}")
                answer = connection.getresponse()
                assert answer.status == 200 and answer.read() == b"" and answer.getheader("content-length") == str(SIZE)
                first_socket = connection.sock
            connection.request("GET", f"/{SHARD}", headers={"range": "bytes=0-9", "accept-encoding": "identity"})
            assert connection.getresponse().read() == DATA[:10] and connection.sock is first_socket
        finally:
            connection.close()
        # h11 (the "baseline" server): no extension, the chunked path, the same bytes and headers
        chunked = client.get(f"{baseline.url}/{SHARD}", headers={"range": "bytes=100-"})
        assert chunked.content == zero_copied.content == DATA[100:]
        for name in ("content-length", "content-range", "etag", "content-type", "cache-control"):
            assert chunked.headers[name] == zero_copied.headers[name], name
        assert baseline.app.zero_copy_stats.bodies == 0
        # gzip: a compressed body is not the file's bytes; it goes through GzipStream
        manifest = client.get(f"{compressing.url}/models/zc/manifest.json", headers={"accept-encoding": "gzip"})
        assert manifest.headers["content-encoding"] == "gzip"
        assert json.loads(manifest.content.decode()[: len(json.dumps(MANIFEST))]) == MANIFEST
        assert compressing.app.zero_copy_stats.bodies == 0
        plain = client.get(f"{compressing.url}/models/zc/manifest.json")  # identity from the same server: zero-copy
        assert "content-encoding" not in plain.headers and plain.content == json.dumps(MANIFEST).encode() * 50
        wait_until(lambda: compressing.app.zero_copy_stats.bodies == 1, "the identity body counted")
    assert all(s.app.zero_copy_stats.fallbacks == 0 for s in (fast, baseline, compressing))
