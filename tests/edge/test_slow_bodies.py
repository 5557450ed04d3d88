"""A slow-body attack (a request body trickled a byte at a time) against the real local edge, a
child process under a memory limit (`tests/support/watched_edge.py`); the attack is bounded (40
connections, a few seconds) and loopback-only, from 127.0.0.2 while /healthz is asked from
127.0.0.1. It once took every connection slot: /healthz failed for anyone for as long as it ran."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from edgellm_local.emulator.hardening import ServerLimits, address_share
from edgellm_local.emulator.server import EdgeApp, EdgeServer
from tests.support.watched_edge import WatchedEdge

LIMITS = {"body_timeout": 2.0, "body_min_rate": 1024.0, "max_connections": 24, "max_connections_per_client": 8}
ATTACKERS = 40
ATTACK_SECONDS = 8.0


@pytest.fixture(scope="module")
def edge(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchedEdge]:
    watched = WatchedEdge.start(tiny_model, tmp_path_factory.mktemp("slow-body-edge"), limits=LIMITS)
    yield watched
    watched.stop()


def trickle(host: str, port: int, stop: threading.Event, opened: threading.Event) -> None:
    """ATTACKERS connections from 127.0.0.2, each a POST whose body comes a byte every 0.5 s;
    a connection the edge closes is opened again, until `stop`."""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            f"content-length: 100000\r\n\r\n").encode()

    def open_one() -> socket.socket | None:
        with contextlib.suppress(OSError):
            sock = socket.socket()
            sock.bind(("127.0.0.2", 0))
            sock.settimeout(2)
            sock.connect((host, port))
            sock.sendall(head)
            return sock
        return None

    socks = [open_one() for _ in range(ATTACKERS)]
    opened.set()
    deadline = time.monotonic() + ATTACK_SECONDS
    while not stop.is_set() and time.monotonic() < deadline:
        for i, sock in enumerate(socks):
            try:
                if sock is None:
                    raise OSError
                sock.sendall(b" ")
            except OSError:
                if sock is not None:
                    sock.close()
                socks[i] = open_one()
        stop.wait(0.5)  # the attack's own pace
    for sock in socks:
        if sock is not None:
            sock.close()


def test_healthz_stays_answered_while_one_address_trickles_bodies(edge: WatchedEdge) -> None:
    host, port = "127.0.0.1", int(edge.url.rsplit(":", 1)[1])
    stop, opened = threading.Event(), threading.Event()
    attack = threading.Thread(target=trickle, args=(host, port, stop, opened), daemon=True)
    attack.start()
    try:
        assert opened.wait(30)
        statuses = []
        for _ in range(10):
            try:
                statuses.append(httpx.get(edge.url + "/healthz", timeout=5).status_code)
            except httpx.HTTPError as exc:
                statuses.append(type(exc).__name__)
            stop.wait(0.3)
        assert statuses == [200] * 10, statuses
    finally:
        stop.set()
        attack.join(30)
    assert edge.alive()


def test_a_body_trickled_below_the_minimum_rate_is_cut(edge: WatchedEdge) -> None:
    host, port = "127.0.0.1", int(edge.url.rsplit(":", 1)[1])
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\ncontent-length: 100000\r\n\r\n".encode())
        started, answer = time.monotonic(), b""
        while b"\r\n\r\n" not in answer and time.monotonic() - started < 20:
            sock.sendall(b" ")  # a byte every 0.5 s: each chunk within body_timeout, the whole far below the rate
            sock.settimeout(0.5)
            with contextlib.suppress(socket.timeout):
                answer += sock.recv(65536)
        # the headers and the chunked error body may arrive apart: read on until the server closes
        sock.settimeout(10)
        with contextlib.suppress(socket.timeout, ConnectionError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.1 400") and b"request_timeout" in answer, answer[:300]


# --- places: the edge in this process, so a test may hold its connections exactly --------------------

def _serve_with(make_deps, **limits: float) -> EdgeServer:
    return EdgeServer(EdgeApp(make_deps(), limits=ServerLimits(**limits))).start()


def _held(server: EdgeServer, source: str) -> socket.socket:
    """A keep-alive connection from `source` that has been answered once (so the edge surely
    counts it) and then stays idle."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(30)
    sock.connect((server.host, server.port))
    sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {server.host}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    return sock


def _slow_body(server: EdgeServer, source: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(30)
    sock.connect((server.host, server.port))
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.host}\r\ncontent-type: application/json\r\n"
                 f"content-length: 100000\r\n\r\n{{".encode())
    return sock


def _held_or_answer(server: EdgeServer, sock: socket.socket, reading: int) -> bytes | None:
    """b"" once the edge waits for this slow body (its count of bodies in flight grew past
    `reading`), else what it answered on `sock` (None for a reset or a bare close)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if server.app.connections.reading > reading:
            return b""
        if select.select([sock], [], [], 0.01)[0]:
            try:
                return sock.recv(65536) or None
            except ConnectionResetError:
                return None
    raise AssertionError("the edge neither waited for the body nor answered it")


def test_slow_bodies_from_many_addresses_never_take_healthz_s_place(make_deps) -> None:
    """Forty addresses each open slow bodies until the edge refuses one of theirs: the edge is
    then full of bodies, and /healthz (and anything else without a body) is still answered."""
    server = _serve_with(make_deps, max_connections=48, reserved_connections=8, max_connections_per_client=16,
                         head_timeout=30.0, body_timeout=30.0, body_timeout_min=30.0, linger_timeout=1.0)
    held: list[socket.socket] = []
    try:
        refused: bytes | None = b""
        for i in range(40 * 4):  # bounded: more attempts than the edge has places
            reading = server.app.connections.reading
            sock = _slow_body(server, f"127.0.0.{2 + i % 40}")
            held.append(sock)
            refused = _held_or_answer(server, sock, reading)
            if refused != b"":
                break
        assert refused is not None, "a refused slow body is answered, never reset"
        assert refused.startswith(b"HTTP/1.1 503") and b"retry-after" in refused.lower(), refused[:300]
        statuses = []
        for _ in range(10):
            try:
                statuses.append(httpx.get(server.url + "/healthz", timeout=5).status_code)
            except httpx.HTTPError as exc:
                statuses.append(type(exc).__name__)
        assert statuses == [200] * 10, statuses
        assert server.app.connections.reading == server.app.limits.body_places  # the bodies still hold theirs
        # a body that comes whole with its head needs no place: answered (its 400) while the flood holds them all
        with socket.create_connection((server.host, server.port), timeout=30) as sock:
            body = b'{"messages": ['
            sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {server.host}\r\ncontent-type: application/json\r\n"
                         f"content-length: {len(body)}\r\n\r\n".encode() + body)
            assert sock.recv(65536).startswith(b"HTTP/1.1 400")
    finally:
        for sock in held:
            sock.close()
        server.stop()


@pytest.mark.parametrize("kind", ["fast", "baseline"])
def test_a_client_over_its_address_share_is_answered_503_not_reset(make_deps, kind: str) -> None:
    limits = ServerLimits(max_connections=24, max_connections_per_client=8, head_timeout=30.0, idle_timeout=30.0)
    server = EdgeServer(EdgeApp(make_deps(), limits=limits), kind=kind).start()
    held: list[socket.socket] = []
    try:
        while len(held) < address_share(limits.max_connections, len(held), limits.min_connections_per_client,
                                        limits.max_connections_per_client):
            held.append(_held(server, "127.0.0.2"))
        assert len(held) == 8
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(transport=transport, timeout=10) as client:
            response = client.get(server.url + "/healthz")
        assert response.status_code == 503, response.text
        assert int(response.headers["retry-after"]) > 0 and response.headers["connection"] == "close"
        assert response.json()["error"]["code"] == "too_many_connections"
        with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"), timeout=10) as other:
            assert other.get(server.url + "/healthz").status_code == 200  # another address has its own share
        held.pop().close()
    finally:
        for sock in held:
            sock.close()
        server.stop()


def _seconds_to_cut(server: EdgeServer) -> float:
    """How long the edge takes to cut a body trickled from 127.0.0.1 (a byte every 0.2 s)."""
    sock = _slow_body(server, "127.0.0.1")
    started, answer = time.monotonic(), b""
    with sock:
        while b"request_timeout" not in answer and time.monotonic() - started < 30:
            sock.sendall(b" ")
            sock.settimeout(0.2)
            with contextlib.suppress(socket.timeout):
                answer += sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400") and b"request_timeout" in answer, answer[:300]
    return time.monotonic() - started


def test_a_loaded_edge_cuts_slow_bodies_sooner_than_an_idle_one(make_deps) -> None:
    server = _serve_with(make_deps, max_connections=40, body_timeout=8.0, body_timeout_min=1.0, head_timeout=60.0,
                         idle_timeout=60.0, max_connections_per_client=8)
    held: list[socket.socket] = []
    try:
        idle = _seconds_to_cut(server)
        held = [_held(server, f"127.0.0.{2 + i // 4}") for i in range(36)]  # nine addresses, four each: 90% of the places
        loaded = _seconds_to_cut(server)
        print(f"slow body cut after {idle:.1f} s on an idle edge, {loaded:.1f} s on a loaded one")
        assert idle >= 7.0 and loaded < 4.0, (idle, loaded)  # 8 s idle; 1 s + a recheck (1 s) loaded
    finally:
        for sock in held:
            sock.close()
        server.stop()
