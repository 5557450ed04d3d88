"""The local Durable Object emulation: one instance per name, requests interleaving at await
points inside it, streamed bodies relayed chunk by chunk, a caller that leaves closing the
object's body, nothing shared between the object and the Worker request that called it, and
idle instances evicted (closed) past the namespace's cap, busy ones never."""

from __future__ import annotations

import asyncio
import gc
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import pytest

from edgellm.durable import DurableObjectNamespace
from edgellm.http import Request, Response
from edgellm_local.emulator import isolation
from edgellm_local.emulator.durable import LocalDurableObjectNamespace
from edgellm_local.emulator.isolation import CrossRequestIOError, current_request, request_context


@dataclass
class Room:
    """A tiny object: `/wait` blocks until `/open` is called, `/stream` streams what it owns."""

    name: str
    opened: asyncio.Event = field(default_factory=asyncio.Event)
    closed_bodies: int = 0
    waiting: int = 0  # requests inside `/wait`
    cancelled: int = 0  # `/wait` calls cancelled inside the object
    context: Any = None
    closed: bool = False  # the namespace evicted it

    def close(self) -> None:
        self.closed = True

    async def fetch(self, request: Request) -> Response:
        self.context = current_request()
        if request.path == "/wait":
            self.waiting += 1
            try:
                await self.opened.wait()  # another request to this object sets it: they interleave
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
            finally:
                self.waiting -= 1
            return Response(200, {"x-name": self.name}, b"opened")
        if request.path == "/open":
            self.opened.set()
            return Response(204)
        if request.path == "/fail":
            raise ValueError("the object broke")
        return Response(200, {"content-type": "text/plain"}, self._stream())

    async def _stream(self) -> AsyncIterator[bytes]:
        try:
            for i in range(5):
                await asyncio.sleep(0)
                yield f"chunk{i} ".encode()
        finally:
            self.closed_bodies += 1


def namespace(max_live: int = 256) -> LocalDurableObjectNamespace:
    return LocalDurableObjectNamespace(Room, class_name="Room", max_live=max_live)


async def until(condition: Any) -> None:
    """Until `condition()` holds, yielding to the loop (what is awaited runs in the same loop)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def call(ns: DurableObjectNamespace, name: str, path: str, label: str) -> asyncio.Task[Response]:
    with request_context(label):
        return asyncio.ensure_future(ns.get(name).fetch(Request("POST", f"https://room{path}")))


def test_one_instance_per_name_and_requests_interleave_inside_it() -> None:
    async def main() -> None:
        ns = namespace()
        waiting = call(ns, "a", "/wait", "worker 1")
        await until(lambda: ns.get("a").object.waiting == 1)
        assert not waiting.done()
        assert (await call(ns, "a", "/open", "worker 2")).status == 204
        response = await waiting
        assert response.body == b"opened" and response.headers["x-name"] == "a"
        assert ns.get("a") is ns.get("a") and ns.get("a") is not ns.get("b")
        assert ns.names == ["a", "b"]

    isolation.run(main())


def test_the_object_runs_in_its_own_context_not_the_callers() -> None:
    async def main() -> None:
        ns = namespace()
        with request_context("worker") as worker:
            await ns.get("a").fetch(Request("POST", "https://room/open"))
        room = ns.get("a").object
        assert room.context is not None and room.context is not worker
        assert room.context is ns.get("a").owner

    isolation.run(main())


def test_a_streamed_body_is_relayed_chunk_by_chunk() -> None:
    async def main() -> None:
        ns = namespace()

        async def read() -> list[bytes]:
            response = await ns.get("a").fetch(Request("POST", "https://room/stream"))
            assert response.is_streaming and response.headers["content-type"] == "text/plain"
            return [chunk async for chunk in response.body]  # type: ignore[union-attr]

        with request_context("worker"):
            chunks = await asyncio.ensure_future(read())
        assert chunks == [f"chunk{i} ".encode() for i in range(5)]
        assert ns.get("a").object.closed_bodies == 1

    isolation.run(main())


def test_a_caller_that_leaves_closes_the_objects_body() -> None:
    async def main() -> None:
        ns = namespace()

        async def read_one() -> bytes:
            response = await ns.get("a").fetch(Request("POST", "https://room/stream"))
            first = await anext(response.body)  # type: ignore[arg-type]
            await response.body.aclose()  # type: ignore[union-attr]
            return first

        with request_context("worker"):
            assert await asyncio.ensure_future(read_one()) == b"chunk0 "
        assert ns.get("a").object.closed_bodies == 1

    isolation.run(main())


def test_a_cancelled_caller_cancels_the_call() -> None:
    async def main() -> None:
        ns = namespace()
        waiting = call(ns, "a", "/wait", "worker")
        room = ns.get("a").object
        await until(lambda: room.waiting == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await until(lambda: room.waiting == 0)  # the object's own call was cancelled, not left waiting
        assert room.cancelled == 1
        assert ns.get("a").busy == 0  # and the instance is idle again: it may be evicted

    isolation.run(main())


def test_errors_in_the_object_fail_the_fetch() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="the object broke"):
            await call(namespace(), "a", "/fail", "worker")

    isolation.run(main())


def test_what_the_object_owns_is_not_the_callers() -> None:
    """A Worker request awaiting the object's own I/O directly (not through a stub) fails."""

    async def main() -> None:
        ns = namespace()
        waiting = call(ns, "a", "/wait", "worker 1")
        room = ns.get("a").object
        await until(lambda: room.waiting == 1)

        async def peek() -> None:
            await room.opened.wait()

        with request_context("worker 2"):
            peeking = asyncio.ensure_future(peek())
        await asyncio.sleep(0)  # one turn of the loop: the peek is now blocked on the object's event
        await call(ns, "a", "/open", "worker 3")
        with pytest.raises(CrossRequestIOError):
            await peeking
        assert (await waiting).status == 200

    isolation.run(main())


# --- eviction of idle instances ----------------------------------------------------------------


async def open_rooms(ns: LocalDurableObjectNamespace, *names: str) -> None:
    for name in names:
        with request_context(f"worker {name}"):
            assert (await asyncio.ensure_future(ns.get(name).fetch(Request("POST", "https://room/open")))).status == 204


def test_idle_instances_past_the_cap_are_evicted_least_recently_used_first_and_closed() -> None:
    async def main() -> None:
        ns = namespace(max_live=2)
        await open_rooms(ns, "a", "b")
        b = ns.get("b").object
        a = ns.get("a").object  # "a" is now the most recently used
        await open_rooms(ns, "c")
        assert ns.names == ["a", "c"] and ns.evictions == 1
        assert b.closed and not a.closed
        rebuilt = ns.get("b").object  # the next request to an evicted name gets a new instance
        assert rebuilt is not b and not rebuilt.closed and ns.names == ["c", "b"] and a.closed

    isolation.run(main())


def test_a_stub_kept_past_its_eviction_reaches_the_rebuilt_instance() -> None:
    async def main() -> None:
        ns = namespace(max_live=1)
        kept = ns.get("a")
        await open_rooms(ns, "b")
        assert kept.evicted and kept.object.closed
        with request_context("worker"):
            assert (await asyncio.ensure_future(kept.fetch(Request("POST", "https://room/open")))).status == 204
        assert ns.names == ["a"] and ns.get("a").object is not kept.object and ns.get("a").object.opened.is_set()

    isolation.run(main())


def test_an_instance_serving_a_request_is_never_evicted() -> None:
    async def main() -> None:
        ns = namespace(max_live=1)
        waiting = call(ns, "a", "/wait", "worker 1")
        room = ns.get("a").object
        await until(lambda: room.waiting == 1)
        await open_rooms(ns, "b", "c", "d")
        assert not room.closed and "a" in ns.names and ns.get("a").object is room
        assert (await call(ns, "a", "/open", "worker 2")).status == 204
        assert (await waiting).body == b"opened"
        await open_rooms(ns, "e")  # idle now: evicted with the next instance made
        assert room.closed and ns.names == ["e"]

    isolation.run(main())


def test_an_instance_whose_body_is_still_open_is_never_evicted() -> None:
    async def main() -> None:
        ns = namespace(max_live=1)
        with request_context("reader"):
            response = await asyncio.ensure_future(ns.get("a").fetch(Request("POST", "https://room/stream")))
            assert await asyncio.ensure_future(anext(response.body)) == b"chunk0 "  # type: ignore[arg-type]
        room = ns.get("a").object
        await open_rooms(ns, "b", "c")
        assert not room.closed and "a" in ns.names
        with request_context("reader"):
            assert await asyncio.ensure_future(anext(response.body)) == b"chunk1 "  # type: ignore[arg-type]
            await asyncio.ensure_future(response.body.aclose())  # type: ignore[union-attr]
        assert ns.get("a").busy == 0
        await open_rooms(ns, "d")
        assert room.closed and ns.names == ["d"]

    isolation.run(main())


def test_a_body_dropped_unclosed_leaves_its_instance_idle() -> None:
    async def main() -> None:
        ns = namespace()
        with request_context("reader"):
            response = await asyncio.ensure_future(ns.get("a").fetch(Request("POST", "https://room/stream")))
        assert ns.get("a").busy == 1
        del response
        await until(lambda: gc.collect() >= 0 and ns.get("a").busy == 0)  # once the loop lets go of the finished call

    isolation.run(main())
