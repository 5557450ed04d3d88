"""A slow-body attack (a request body trickled a byte at a time) against the real local edge, a
child process under a memory limit (`tests/support/watched_edge.py`); the attack is bounded (40
connections, a few seconds) and loopback-only, from 127.0.0.2 while /healthz is asked from
127.0.0.1. It once took every connection slot: /healthz failed for anyone for as long as it ran."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

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
