"""The local edge's ASGI adapter when a request is cut short: a client that leaves cancels the
work and the request ends quietly, while the serving task itself being cancelled (the server
shutting down) stays a cancel for whoever cancelled it. And a body that never waits leaves the
loop's other requests their turns."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from edgellm.config import Config
from edgellm.http import Request, Response
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


@dataclass
class NeverWaitingApp(EdgeApp):
    """An edge whose answer is a large body that never waits (a file in the page cache, a replay
    in memory), counting the chunks it has given."""

    given: int = 0

    async def _answer(self, request: Request, send: Any) -> None:
        async def chunks() -> Any:
            for _ in range(64):
                self.given += 1
                yield b"x" * 65536

        await self._send(Response(200, {"content-type": "application/octet-stream"}, chunks()), send)


def test_a_body_that_never_waits_leaves_other_requests_their_turns() -> None:
    """uvicorn's `send` waits only when its client falls behind, so a 4 MiB body sent to one that
    keeps up would hold the loop until its last byte; the other requests must still get turns
    (every `server.FAIR_SHARE_BYTES`)."""
    from edgellm_local.emulator.server import FAIR_SHARE_BYTES

    async def main() -> None:
        app, client = NeverWaitingApp(Deps(config=Config(open_access=True), ai=None), coalesce=False), Client()  # type: ignore[arg-type]
        sent: list[int] = []

        async def keeps_up(message: dict[str, Any]) -> None:  # never waits
            sent.append(len(message.get("body", b"")))

        turns: list[int] = []

        async def another_request() -> None:
            while True:
                turns.append(app.given)
                await asyncio.sleep(0)

        other = asyncio.ensure_future(another_request())
        await within(app(SCOPE, client.receive, keeps_up), "the body was never sent")
        other.cancel()
        assert sum(sent) == 64 * 65536
        during = [given for given in turns if 0 < given < 64]
        assert len(during) >= 64 * 65536 // FAIR_SHARE_BYTES - 2, f"other requests got {len(during)} turns while 4 MiB went out"

    isolation.run(main())


@dataclass
class ImmediateApp(EdgeApp):
    """An edge whose answer never waits (as a HIT's or /healthz's does not), noting the tasks
    that exist while it answers."""

    tasks_while_answering: set[str] = field(default_factory=set)

    async def _answer(self, request: Request, send: Any) -> None:
        self.tasks_while_answering = {task.get_coro().__qualname__ for task in asyncio.all_tasks()}  # type: ignore[union-attr]
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


def test_an_answer_that_never_waits_has_no_disconnect_watcher() -> None:
    """No disconnect can reach an answer before it first waits, so the watcher (a task, ~10% of a
    /healthz's instructions) starts only then; one that waits is still watched (the tests above)."""

    async def main() -> None:
        app, client = ImmediateApp(Deps(config=Config(open_access=True), ai=None), coalesce=False), Client()  # type: ignore[arg-type]
        sent: list[dict[str, Any]] = []

        async def record(message: dict[str, Any]) -> None:
            sent.append(message)

        await within(app(SCOPE, client.receive, record), "the answer never ended")
        assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
        assert app.tasks_while_answering and not any(name.endswith("_serve.<locals>.watch") for name in app.tasks_while_answering), app.tasks_while_answering

        held, leaving = held_app(), Client()  # and one that waits has its watcher while it waits
        serving = asyncio.ensure_future(held(SCOPE, leaving.receive, nothing_sent))
        await within(held.answering.wait(), "the answer never started")
        assert any(task.get_coro().__qualname__.endswith("_serve.<locals>.watch") for task in asyncio.all_tasks())  # type: ignore[union-attr]
        leaving.leave()
        await within(serving, "the request never ended")

    isolation.run(main())
