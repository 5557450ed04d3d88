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
from edgellm.ports import CapacityExceeded
from edgellm.deps import Deps
from edgellm_local.emulator import isolation
from edgellm_local.emulator.durable import local_flights
from edgellm_local.emulator.isolation import CrossRequestIOError, request_context
from edgellm_local.emulator.kv import SqliteKV
from tests.conftest import ManualClock
from edgellm_local.doubles.scripted import ScriptedAI

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


def test_the_flight_plan_crosses_the_wire_whole() -> None:
    """Route, budgets, model ids and the breaker's verdict (skip, probe) decided by the Worker
    reach the object unchanged: the object never plans."""
    from edgellm.cache.coalescing import FlightPlan

    plan = FlightPlan(routed=True, edge=True, origins=("eu", "us"), reason="primary", probe=True, prompt_tokens=42,
                      first_token_s=0.3, stall_ms=700, models=("@cf/a", "@cf/b"))
    assert FlightOrder.decode(replace(ORDER, plan=plan).encode()).plan == plan
    skipped = FlightPlan(routed=True, edge=False, origins=("eu",), reason="breaker")
    assert FlightOrder.decode(replace(ORDER, plan=skipped).encode()).plan == skipped
    assert FlightOrder.decode(ORDER.encode()).plan == FlightPlan()


ROUTED = '[{"name": "o1", "url": "http://origin.invalid/v1", "timeout_ms": 5000}]'


class OriginFetch:
    """The Worker's `fetch` port answering as an OpenAI-compatible origin streams."""

    def __init__(self) -> None:
        self.calls = 0

    async def post(self, url: str, body: bytes, headers: Any, timeout: float) -> Any:
        from edgellm.ports import FetchResponse

        self.calls += 1

        async def chunks() -> Any:
            yield b'data: {"choices": [{"delta": {"content": "From origin"}, "finish_reason": null}]}\n\n'
            yield b'data: {"choices": [{"delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}\n\n'
            yield b"data: [DONE]\n\n"

        return FetchResponse(200, {"content-type": "text/event-stream"}, chunks())


def routed(ai: ScriptedAI) -> tuple[Deps, OriginFetch, list[Any]]:
    background: list[Any] = []
    fetch = OriginFetch()
    config = Config.from_env({"ORIGINS": ROUTED, "EDGE_FIRST_TOKEN_MS": "5000"})
    deps = Deps(config, ai, kv=SqliteKV(":memory:", clock=ManualClock()), clock=ManualClock(), fetch=fetch)
    return replace(deps, flights=local_flights(deps, lambda aw: background.append(asyncio.ensure_future(aw)))), fetch, background


async def miss(deps: Deps, prompt: str = "hi") -> list[Any]:
    from edgellm.app import ROUTES
    from edgellm.cache.service import cached_generation
    from edgellm.context import RequestContext
    from edgellm.http import Request

    request = Request("POST", "https://edge.example/v1/chat/completions", {"content-type": "application/json"}, b"{}")
    gen_request = GenerationRequest("@cf/meta/llama-2-7b-chat-int8", {"messages": [{"role": "user", "content": prompt}], "temperature": 0},
                                    stream=True)
    generation = await cached_generation(deps, request, RequestContext(ROUTES), gen_request)
    return [event async for event in generation.events]


def test_the_workers_breaker_and_counters_see_a_flights_failover() -> None:
    """The edge fails before its first token inside the object, which fails over to the origin:
    the Worker's own breaker records the failure and its counters the failover (on Cloudflare the
    object's isolate is not the Worker's, so its state is fresh and /admin/routing/stats never saw
    it). Leaning on a state shared with the object fails here since objects get their own."""

    async def main() -> None:
        deps, fetch, background = routed(ScriptedAI(fail=CapacityExceeded("3040: Capacity temporarily exceeded")))
        events = await serve(miss(deps), "worker")
        assert isinstance(events[-1], Finish) and "origin" in (events[-1].route or "")
        counters, breaker = deps.state.routing.counters, deps.state.routing.breaker
        assert counters.failovers_before_first_token == 1 and counters.origin == 1 and fetch.calls == 1
        assert breaker is not None and len(breaker.failures) == 1
        await asyncio.gather(*background)

    isolation.run(main())


def test_an_open_breaker_in_the_worker_keeps_the_flight_off_the_edge() -> None:
    """The Worker's open breaker decides: the object, whose own state knows no failure, goes
    straight to the origin and never calls the edge."""
    from edgellm.routing.plan import routing_state

    async def main() -> None:
        ai = ScriptedAI()
        deps, fetch, background = routed(ai)
        breaker = routing_state(deps).breaker
        assert breaker is not None
        for _ in range(breaker.config.failures):
            breaker.failure(deps.clock.now())
        events = await serve(miss(deps), "worker")
        assert ai.calls == [] and fetch.calls == 1
        assert events[-1].route == "origin; reason=breaker; origin=o1"
        assert deps.state.routing.counters.breaker_skips == 1 and deps.state.routing.counters.origin == 1
        await asyncio.gather(*background)

    isolation.run(main())


def test_a_probe_decides_the_workers_half_open_breaker() -> None:
    """After the cool-down the Worker lets one flight probe the edge; its success, run in the
    object, closes the Worker's breaker."""
    from edgellm.routing.breaker import CLOSED, HALF_OPEN
    from edgellm.routing.plan import routing_state

    async def main() -> None:
        deps, fetch, background = routed(ScriptedAI())
        breaker = routing_state(deps).breaker
        assert breaker is not None
        for _ in range(breaker.config.failures):
            breaker.failure(deps.clock.now())
        deps.clock.advance(breaker.config.cooldown_s + 1)  # type: ignore[attr-defined]
        events = await serve(miss(deps), "worker")
        assert events[-1].route == "edge" and fetch.calls == 0
        assert breaker.state == CLOSED and breaker.state != HALF_OPEN and deps.state.routing.counters.edge == 1
        await asyncio.gather(*background)

    isolation.run(main())


def test_a_flight_order_carries_the_whole_generation_request_across_the_wire() -> None:
    """The object generates from the decoded order: anything lost on the wire (the session that
    keeps a conversation's slot warm, stop sequences, usage wishes) would silently change the run."""
    request = GenerationRequest("@cf/m", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0},
                                ("\n\n",), stream=True, include_usage=True, session="conv-1")
    order = FlightOrder(request, "kv-key", True, 600)
    assert FlightOrder.decode(order.encode()).request == request


# --- the object's own text: carried to the Worker for its log, never to the client ----

MARKER = "/srv/object/internal-91c2"


def test_a_binding_failure_inside_the_object_keeps_its_text_for_the_workers_log_only() -> None:
    async def main() -> None:
        from edgellm.ports import BindingError

        for ai in (ScriptedAI(fail=BindingError(f"3043: failed at {MARKER}")), ScriptedAI(fail_after=2, mid_stream=BindingError(MARKER))):
            deps, background = make(ai)
            with pytest.raises(GatewayError) as info:
                await serve(answer(deps), "worker")
            assert MARKER not in info.value.message and MARKER in (info.value.detail or "")  # app.handle / streamed_error log it
            await asyncio.gather(*background, return_exceptions=True)

    isolation.run(main())


def test_an_exception_in_the_object_is_the_gateways_words_with_its_text_as_the_detail() -> None:
    """Not a GatewayError (a bug, a runtime's error) in the object's stream: the line it sends says
    what failed in the gateway's words; the exception's text crosses as the detail only."""
    import json

    from edgellm.cache.coalescing import encode_error, error_from

    line = json.loads(encode_error(RuntimeError(f"KeyError at {MARKER}")))
    error = error_from(line, int(line["status"]), line["retry_after"])
    assert error.status == 502 and error.retry_after == 5 and MARKER not in error.message and "RuntimeError" not in error.message
    assert MARKER in (error.detail or "") and MARKER not in json.dumps(error.to_json())


def test_a_bad_order_is_refused_without_echoing_the_parsers_text() -> None:
    async def main() -> None:
        import json

        from edgellm.http import Request

        response = await FlightObject(Deps(Config(), ScriptedAI())).fetch(Request("POST", "https://f/", body=b"{\"model\": 1}"))
        data = json.loads(response.body)
        assert response.status == 400 and data["error"]["message"] == "Bad flight order." and data["detail"]

    isolation.run(main())


def test_the_object_runs_the_generation_for_the_tenant_the_order_names_not_the_callers_context() -> None:
    """The object's context is its own (on Cloudflare: another isolate), so the tenant the Worker
    admitted reaches the binding (the local engine's fair queue) only because the order says it."""
    from edgellm.admission import admitted_as, admitted_tenant

    class TenantSeeingAI(ScriptedAI):
        seen: list[str | None] = []

        async def stream(self, model: str, inputs: Any, **options: Any) -> Any:
            self.seen.append(admitted_tenant())
            return await super().stream(model, inputs, **options)

    async def main() -> None:
        ai = TenantSeeingAI()
        deps, background = make(ai)

        async def as_the_worker() -> Any:
            with admitted_as("set-in-the-worker"):  # the Worker's own context: never the object's
                generation, _ = await shared_generation(deps, replace(ORDER, tenant="acme"))
                return [event async for event in generation.events]

        await serve(as_the_worker(), "worker")
        await asyncio.gather(*background)
        assert ai.seen == ["acme"]

    isolation.run(main())
