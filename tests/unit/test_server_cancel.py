"""The local edge's ASGI adapter when a request is cut short: a client that leaves cancels the
work and the request ends quietly, while the serving task itself being cancelled (the server
shutting down) stays a cancel for whoever cancelled it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgellm.config import Config
from edgellm.http import Request
from edgellm.deps import Deps
from edgellm_local.emulator import isolation
from edgellm_local.emulator.server import EdgeApp
from tests.support.bounded import within

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
         "query_string": b"", "headers": [(b"host", b"localhost"), (b"content-length", b"2")]}


@dataclass
class HeldApp(EdgeApp):
    """An edge whose answer waits until it is cancelled, saying when it started and how it ended."""

    answering: asyncio.Event = field(default_factory=asyncio.Event)
    answer_cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    async def _answer(self, request: Request, send: Any) -> None:
        self.answering.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.answer_cancelled.set()
            raise


@dataclass
class Client:
    """The ASGI `receive` of one request: its body, then nothing until `leave()`."""

    messages: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self.messages.put_nowait({"type": "http.request", "body": b"{}", "more_body": False})

    async def receive(self) -> dict[str, Any]:
        return await self.messages.get()

    def leave(self) -> None:
        self.messages.put_nowait({"type": "http.disconnect"})


async def nothing_sent(message: dict[str, Any]) -> None:
    raise AssertionError(f"nothing is answered to a request cut short, got {message}")


def held_app() -> HeldApp:
    return HeldApp(Deps(config=Config(open_access=True), ai=None), coalesce=False)  # type: ignore[arg-type]


def test_a_client_that_leaves_cancels_the_answer_and_the_request_ends_quietly() -> None:
    async def main() -> None:
        app, client = held_app(), Client()
        serving = asyncio.ensure_future(app(SCOPE, client.receive, nothing_sent))
        await within(app.answering.wait(), "the answer never started")
        client.leave()
        await within(app.answer_cancelled.wait(), "the client left and its answer kept running: the server no longer "
                                                  "cancels a departed request's work (EdgeApp._serve's disconnect watcher)")
        await within(serving, "the answer was cancelled but the request never ended")
        # no CancelledError: the request was served as far as it could be

    isolation.run(main())


def test_cancelling_the_serving_task_stays_a_cancel() -> None:
    async def main() -> None:
        app, client = held_app(), Client()
        serving = asyncio.ensure_future(app(SCOPE, client.receive, nothing_sent))
        await within(app.answering.wait(), "the answer never started")
        serving.cancel()  # what uvicorn does to requests still running when it shuts down
        with pytest.raises(asyncio.CancelledError):
            await within(serving, "the serving task was cancelled and never ended")
        assert app.answer_cancelled.is_set()

    isolation.run(main())
