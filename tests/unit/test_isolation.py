"""Request isolation on the local edge: I/O one request created fails when another awaits it,
as workerd fails it ("Cannot perform I/O on behalf of a different request")."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from edgellm_local.emulator import isolation
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.emulator.isolation import CrossRequestIOError, RequestContext, context_of, request_context
from tests.support.bounded import within


def in_request(label: str, coro: Any) -> asyncio.Task[Any]:
    """Start `coro` as a task serving its own request, as the server does for each one."""
    with request_context(label):
        return asyncio.ensure_future(coro)


def serving(context: RequestContext, coro: Any) -> asyncio.Task[Any]:
    return asyncio.get_running_loop().create_task(coro, context=context_of(context))


def test_a_future_awaited_by_another_request_fails() -> None:
    async def main() -> None:
        shared: dict[str, asyncio.Future[str]] = {}

        async def first() -> str:
            shared["answer"] = asyncio.get_running_loop().create_future()
            return await shared["answer"]

        async def second() -> str:
            return await shared["answer"]

        a = in_request("A", first())
        await asyncio.sleep(0)
        b = in_request("B", second())
        with pytest.raises(CrossRequestIOError, match="different request"):
            await within(b, "request B awaited a future request A created and was left waiting instead of failing: "
                            "the owner check (isolation.check_owner) is not enforced")
        shared["answer"].set_result("x")  # the runtime (no request) may resolve anything
        assert await a == "x"

    isolation.run(main())


def test_an_event_broadcast_from_one_request_to_another_fails_the_waiter() -> None:
    """The pure-Python broadcaster (an asyncio.Event set by the producer) fails on workerd too."""

    async def main() -> None:
        changed = asyncio.Event()

        async def follower() -> None:
            await changed.wait()

        async def producer() -> None:
            changed.set()

        b = in_request("B", follower())
        await asyncio.sleep(0)
        await in_request("A", producer())
        with pytest.raises(CrossRequestIOError):
            await b

    isolation.run(main())


def test_a_task_started_by_one_request_cannot_be_awaited_or_shielded_by_another() -> None:
    async def main() -> None:
        tasks: dict[str, asyncio.Task[int]] = {}

        async def start() -> None:
            tasks["work"] = asyncio.ensure_future(asyncio.sleep(0, 7))

        async def join_by_await() -> int:
            return await tasks["work"]

        async def join_by_shield() -> int:
            return await asyncio.shield(tasks["work"])

        await in_request("A", start())
        for join in (join_by_await, join_by_shield):
            with pytest.raises(CrossRequestIOError):
                await in_request("B", join())
        assert await tasks["work"] == 7

    isolation.run(main())


def test_within_one_request_everything_works() -> None:
    async def main() -> int:
        async def serve() -> int:
            queue: asyncio.Queue[int] = asyncio.Queue()
            worker = asyncio.ensure_future(queue.put(3))
            await worker
            return await asyncio.shield(asyncio.ensure_future(queue.get()))

        return await in_request("A", serve())

    assert isolation.run(main()) == 3


def test_a_binding_stream_read_by_another_request_fails(tiny_runner) -> None:
    """A real llama.cpp stream started by request A, read by request B."""
    ai = LlamaCppAI({"@cf/m": tiny_runner})

    async def main() -> None:
        streams: dict[str, Any] = {}

        async def start() -> None:
            streams["s"] = await ai.stream("@cf/m", {"prompt": "hi", "max_tokens": 50, "temperature": 0})

        async def read() -> list[Any]:
            return [event async for event in streams["s"]]

        a = RequestContext("A")
        await serving(a, start())
        with pytest.raises(CrossRequestIOError):
            await in_request("B", read())

        async def close() -> None:
            await streams["s"].aclose()

        await serving(a, close())  # its own request may close it

    isolation.run(main())


@pytest.mark.parametrize("factory", [isolation.new_event_loop, isolation.new_uvloop], ids=["asyncio", "uvloop"])
def test_both_server_loops_isolate_requests(factory: Any) -> None:
    """`edgellm dev` serves on uvloop (the benchmark baseline on asyncio's loop): sharing an
    event between two requests fails on either, the way workerd fails it."""

    async def main() -> None:
        shared = asyncio.Event()

        async def waiter() -> None:
            await shared.wait()

        a = in_request("A", waiter())
        await asyncio.sleep(0)
        b = in_request("B", waiter())
        with request_context("C"):
            shared.set()
        results = await asyncio.gather(a, b, return_exceptions=True)
        assert any(isinstance(r, CrossRequestIOError) for r in results), results

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


@pytest.mark.parametrize("factory", [isolation.new_event_loop, isolation.new_uvloop], ids=["asyncio", "uvloop"])
def test_runtime_io_belongs_to_no_request_and_runs_in_the_calling_task(factory: Any) -> None:
    """The server's own `send`/`receive` (`as_runtime`): what they create belongs to no request
    (uvicorn starts a pipelined next request from inside the previous one's `send`), and they run
    in the request's own task, with no task of their own per call (a streamed answer sends once
    per token). Their result and their failure reach the caller."""

    async def main() -> None:
        seen: dict[str, Any] = {}

        async def send(value: str) -> str:
            loop = asyncio.get_running_loop()
            seen["future"], seen["task"] = loop.create_future(), loop.create_task(asyncio.sleep(0))
            seen["request"], seen["in_task"] = isolation.current_request(), asyncio.current_task()
            await asyncio.sleep(0)  # a step on, still outside the request
            seen["later"] = isolation.current_request()
            return value * 2

        async def broken() -> None:
            raise OSError("the client went away")

        async def request() -> None:
            assert await isolation.as_runtime(send, "ab") == "abab"
            assert seen["request"] is None and seen["later"] is None
            assert seen["future"]._owner is None and seen["task"]._owner is None
            assert seen["in_task"] is asyncio.current_task()  # no task of its own
            assert isolation.current_request() is not None  # the request's context is its own again
            with pytest.raises(OSError, match="went away"):
                await isolation.as_runtime(broken)
            await seen["task"]

        await in_request("A", request())

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())


def test_runtime_io_waits_for_the_runtime_and_is_cancelled_with_its_request() -> None:
    """A `send` that waits (flow control) wakes when the runtime resolves what it waits on, and a
    request cancelled meanwhile cancels it: the cancellation reaches it where it waits, on a
    future or on a bare yield."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        waits: dict[str, asyncio.Future[str]] = {}
        cancelled = asyncio.Event()
        waiting: asyncio.Queue[str] = asyncio.Queue()

        async def drain(name: str) -> str:
            waits[name] = loop.create_future()
            waiting.put_nowait(name)
            try:
                return await waits[name]
            except asyncio.CancelledError:
                cancelled.set()
                raise

        woken = in_request("A", isolation.as_runtime(drain, "a"))
        stuck = in_request("B", isolation.as_runtime(drain, "b"))
        assert {await within(waiting.get(), "a send never waited"), await within(waiting.get(), "a send never waited")} == {"a", "b"}
        waits["a"].set_result("writable")  # the runtime (no request) resolves it
        assert await woken == "writable"
        stuck.cancel()
        with pytest.raises(asyncio.CancelledError):
            await stuck
        assert cancelled.is_set()

        async def yielding() -> str:  # waits on no future: a cancellation is thrown in, not a future's
            for _ in range(10_000):  # then gives up, so a send the cancellation missed ends the test
                waiting.put_nowait("yielding")
                await asyncio.sleep(0)
            return "never cancelled"

        spinning = in_request("C", isolation.as_runtime(yielding))
        await within(waiting.get(), "the yielding send never ran")
        spinning.cancel()
        with pytest.raises(asyncio.CancelledError):
            await within(spinning, "a cancelled send kept running")

    isolation.run(main())
