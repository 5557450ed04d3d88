"""Coalescing through the flights Durable Object, on the local emulation with request isolation
enforced: one generation for identical requests, a failure reaching each of them, and the proof
that the same sharing done without the object fails with the isolation error."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest

from edgellm.cache.coalescing import FlightEvents, FlightObject, FlightOrder, shared_generation
from edgellm.cache.flight import Flight
from edgellm.config import Config
from edgellm.errors import GatewayError
from edgellm.generation import Finish, GenerationRequest, Token
from edgellm.inference import start_generation
from edgellm.ports import CapacityExceeded, Deps
from edgellm_local import isolation
from edgellm_local.durable import local_flights
from edgellm_local.isolation import CrossRequestIOError, request_context
from edgellm_local.kv import SqliteKV
from tests.conftest import ManualClock
from tests.support.fake_ai import ScriptedAI

ORDER = FlightOrder(GenerationRequest("@cf/meta/llama-2-7b-chat-int8", {"prompt": "hi", "temperature": 0}, stream=True),
                    "cache/v1/k", write=True, ttl=3600)


def make(ai: ScriptedAI) -> tuple[Deps, list[asyncio.Future[Any]]]:
    background: list[Any] = []
    deps = Deps(Config(), ai, kv=SqliteKV(":memory:", clock=ManualClock()), clock=ManualClock())
    return replace(deps, flights=local_flights(deps, lambda aw: background.append(asyncio.ensure_future(aw)))), background


def serve(coro: Any, label: str) -> asyncio.Task[Any]:
    with request_context(label):
        return asyncio.ensure_future(coro)


async def answer(deps: Deps) -> tuple[list[Any], bool]:
    generation, joined = await shared_generation(deps, ORDER)
    return [event async for event in generation.events], joined


def test_identical_requests_from_different_requests_share_one_generation() -> None:
    async def main() -> None:
        ai = ScriptedAI()
        deps, background = make(ai)
        results = await asyncio.gather(*(serve(answer(deps), f"worker {i}") for i in range(3)))
        assert len(ai.calls) == 1
        assert sorted(joined for _, joined in results) == [False, True, True]
        events = [events for events, _ in results]
        assert events[0] == events[1] == events[2] and isinstance(events[0][-1], Finish)
        assert "".join(e.text for e in events[0] if isinstance(e, Token)) == "Hello, world!"
        await asyncio.gather(*background)
        assert await deps.kv.get("cache/v1/k") is not None  # written once, by the object

    isolation.run(main())


def test_a_start_failure_reaches_the_caller_as_its_gateway_error() -> None:
    async def main() -> None:
        deps, _ = make(ScriptedAI(fail=CapacityExceeded("3040: Capacity temporarily exceeded")))
        with pytest.raises(GatewayError) as info:
            await serve(answer(deps), "worker")
        assert info.value.status == 503 and info.value.retry_after == 5 and info.value.code == "capacity_exceeded"

    isolation.run(main())


def test_a_failure_mid_stream_is_an_error_not_a_cut_answer() -> None:
    async def main() -> None:
        deps, background = make(ScriptedAI(fail_after=2))
        with pytest.raises(GatewayError) as info:
            await serve(answer(deps), "worker")
        assert info.value.status == 502
        await asyncio.gather(*background, return_exceptions=True)
        assert await deps.kv.get("cache/v1/k") is None

    isolation.run(main())


def test_a_stream_cut_before_its_end_is_an_error() -> None:
    async def main() -> None:
        async def cut() -> Any:
            yield b'{"token":"a"}\n'

        with pytest.raises(GatewayError, match="cut"):
            [event async for event in FlightEvents(cut())]

    isolation.run(main())


def test_sharing_a_flight_across_requests_without_the_object_fails_with_the_isolation_error() -> None:
    """What the Worker did before the Durable Object: one request starts the flight in the
    isolate, an identical one joins it. On workerd that hangs or cuts the second; here it fails."""

    async def main() -> None:
        ai = ScriptedAI()
        deps = Deps(Config(), ai)
        flights: dict[str, Flight] = {}

        async def first() -> list[Any]:
            flights["k"] = Flight().start(lambda: start_generation(deps, ORDER.request), lambda f: None)
            subscription = flights["k"].join()
            await asyncio.shield(flights["k"].started)
            return [event async for event in subscription]

        async def second() -> list[Any]:
            subscription = flights["k"].join()
            await asyncio.shield(flights["k"].started)
            return [event async for event in subscription]

        a = serve(first(), "worker A")
        await asyncio.sleep(0)
        b = serve(second(), "worker B")
        with pytest.raises(CrossRequestIOError):
            await b
        assert isinstance((await a)[-1], Finish)

    isolation.run(main())


def test_the_object_ignores_a_bad_order() -> None:
    async def main() -> None:
        from edgellm.http import Request

        response = await FlightObject(Deps(Config(), ScriptedAI())).fetch(Request("POST", "https://f/", body=b"{"))
        assert response.status == 400

    isolation.run(main())


def test_every_event_crosses_the_wire_whole() -> None:
    """Logprobs, tool-call fragments and a finish's route and cacheability reach the Worker
    intact: a stitched answer (edge,origin) must still say so, and still not be cacheable."""
    from edgellm.cache.coalescing import decode_event, encode_event
    from edgellm.generation import ToolCallDelta, Usage
    import json

    events = [
        Token("Pa", ({"token": "Pa", "logprob": -0.5, "bytes": [80, 97], "top_logprobs": []},)),
        Token("ris"),
        ToolCallDelta(0, "call_1", "lookup", ""),
        ToolCallDelta(0, arguments='{"q": 1}'),
        Finish("stop", Usage(3, 4), "edge,origin; reason=stall", cacheable=False),
    ]
    assert [decode_event(json.loads(encode_event(e))) for e in events] == events


def test_the_route_context_routes_the_objects_generation_like_the_request() -> None:
    from edgellm.cache.coalescing import RouteContext
    from edgellm.http import Request

    request = Request("POST", "https://x/v1/chat/completions", {"cf-aig-request-timeout": "300", "cf-ipcountry": "DE",
                                                                "authorization": "Bearer secret"}, b"{}", cf={"country": "DE"})
    order = replace(ORDER, route=RouteContext.of(request))
    decoded = FlightOrder.decode(order.encode())
    assert decoded == order
    rebuilt = decoded.route.request()
    assert rebuilt.header("cf-aig-request-timeout") == "300" and rebuilt.cf == {"country": "DE"}
    assert rebuilt.header("authorization") is None  # only what routing reads goes to the object


def test_a_flight_order_carries_the_whole_generation_request_across_the_wire() -> None:
    """The object generates from the decoded order: anything lost on the wire (the session that
    keeps a conversation's slot warm, stop sequences, usage wishes) would silently change the run."""
    request = GenerationRequest("@cf/m", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0},
                                ("\n\n",), stream=True, include_usage=True, session="conv-1")
    order = FlightOrder(request, "kv-key", True, 600)
    assert FlightOrder.decode(order.encode()).request == request
