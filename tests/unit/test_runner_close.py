"""`LlamaCppRunner.close` while a loopback call is in flight: the call holds the server until it
returns, as a generation does, so the server's destructor (which keeps the GIL while it joins
llama.cpp's threads) never runs under a request it would wait for. Seen as a suite that never
ended: `close` in a test's teardown while the slot pool readied a slot (`prefill`) in a thread."""

from __future__ import annotations

import json
import threading
import weakref
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from edgellm_local.llama.runner import LlamaCppRunner


class StandInServer:
    """What the runner holds of llama.cpp's in-process server here: its loopback address."""

    def __init__(self, url: str) -> None:
        self.listening_address = url


@pytest.fixture
def held_port() -> Iterator[tuple[str, threading.Event, threading.Event]]:
    """A loopback port whose answers wait for `release` once `arrived` is set."""
    arrived, release = threading.Event(), threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers["content-length"]))
            arrived.set()
            release.wait(30)
            body = json.dumps({"prompt": "ok"}).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", arrived, release
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def test_close_drops_the_server_only_after_a_loopback_call_in_flight_returns(held_port: Any) -> None:
    url, arrived, release = held_port
    runner = LlamaCppRunner(Path("stand-in.gguf"))
    server = StandInServer(url)
    runner._server = server  # the runner's started server (its loopback port is all a call uses)
    alive = weakref.ref(server)
    del server
    results: list[Any] = []
    call = threading.Thread(target=lambda: results.append(runner._loopback("/apply-template", {}, "apply-template")))
    call.start()
    assert arrived.wait(10)
    runner.close()
    assert alive() is not None, "close dropped the server under a call in flight"
    release.set()
    call.join(10)
    assert results == [{"prompt": "ok"}]
    assert alive() is None  # dropped when the call returned


def test_close_during_a_slot_action_from_the_loop_holds_the_server_and_never_hangs(held_port: Any) -> None:
    """The event loop's slot action (loopback.py) likewise: `close` (from another thread, as
    `edgellm dev` stops) leaves the server to the action, which then ends, answered or refused."""
    import asyncio

    url, arrived, release = held_port
    runner = LlamaCppRunner(Path("stand-in.gguf"))
    server = StandInServer(url)
    runner._server = server
    alive = weakref.ref(server)
    del server
    ended: list[Any] = []

    def act() -> None:
        try:
            ended.append(asyncio.run(asyncio.wait_for(runner.slot_action_async(0, "save", "state.bin"), 20)))
        except Exception as exc:  # closed under it: a refusal, never a hang
            ended.append(exc)

    call = threading.Thread(target=act)
    call.start()
    assert arrived.wait(10)
    runner.close()
    assert alive() is not None, "close dropped the server under a slot action in flight"
    release.set()
    call.join(15)
    assert not call.is_alive() and len(ended) == 1 and not isinstance(ended[0], asyncio.TimeoutError), ended
    assert alive() is None
