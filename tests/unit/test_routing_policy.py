"""Routing's pure parts: configuration from [vars], the breaker's states, the origin request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgellm.config import Config
from edgellm.generation import GenerationRequest
from edgellm.http import Request
from edgellm.routing.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from edgellm.routing.config import BreakerConfig, RoutingConfig
from edgellm.routing.origin import origin_body
from edgellm.routing.plan import first_token_budget, resolve_region
from edgellm.errors import GatewayError


def test_origins_regions_and_budgets_come_from_vars_and_secrets() -> None:
    config = Config.from_env({
        "ORIGINS": json.dumps([{"name": "eu", "url": "https://eu.example/v1", "token_secret": "EU_TOKEN", "region": "eu",
                                "models": {"@cf/a": "org/a"}, "timeout_ms": 1000, "context_window": 4096}, "https://plain.example"]),
        "EU_TOKEN": "s3cret", "EDGE_FIRST_TOKEN_MS": "1500", "EDGE_STALL_MS": "700", "EDGE_MAX_PROMPT_TOKENS": "900",
        "BREAKER": '{"failures": 3, "window_s": 10, "cooldown_s": 5}', "REGIONS": '{"eu": {"resident": true, "cache_ttl": 120}}',
    })
    routing = config.routing
    eu, plain = routing.origins
    assert (eu.name, eu.token, eu.region, eu.base_url, eu.model_for("@cf/a"), eu.serves("@cf/b")) == ("eu", "s3cret", "EU", "https://eu.example/v1", "org/a", False)
    assert (plain.name, plain.base_url, plain.token, plain.serves("@cf/b")) == ("origin2", "https://plain.example/v1", None, True)
    assert (routing.first_token_ms, routing.stall_ms, routing.edge_max_prompt_tokens) == (1500, 700, 900)
    assert routing.breaker == BreakerConfig(3, 10, 5)
    assert routing.regions["EU"].resident and routing.regions["EU"].cache_ttl == 120
    assert routing.regions["EU"].admits(eu) and not routing.regions["EU"].admits(plain)
    assert not Config.from_env({}).routing.active


def test_the_breaker_opens_cools_down_and_lets_one_probe_decide() -> None:
    breaker = CircuitBreaker(BreakerConfig(failures=2, window_s=10, cooldown_s=30))
    breaker.failure(0)
    breaker.failure(11)  # the first fell out of the window
    assert breaker.state == CLOSED and breaker.admit(11) == "edge"
    breaker.failure(12)
    assert breaker.state == OPEN and breaker.admit(20) == "skip"
    assert breaker.admit(42) == "probe" and breaker.state == HALF_OPEN
    assert breaker.admit(42) == "skip"  # one probe at a time
    breaker.failure(43)
    assert breaker.state == OPEN and breaker.admit(50) == "skip"
    assert breaker.admit(73) == "probe"
    breaker.abandon()  # the probe's client left: someone else may probe
    assert breaker.admit(74) == "probe"
    breaker.success(75)
    assert breaker.state == CLOSED and breaker.admit(75) == "edge" and breaker.opened_count == 2


def test_the_origin_request_continues_a_chat_with_an_assistant_prefill() -> None:
    origin = RoutingConfig.from_env({"ORIGINS": '[{"url": "http://o", "models": {"@cf/a": "big-a"}}]'}).origins[0]
    chat = GenerationRequest("@cf/a", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "temperature": 0.0, "seed": 5}, stop=("END",))
    path, body = origin_body(origin, chat, prefill="Hello, wor", max_tokens=17)
    assert path == "/chat/completions" and body["model"] == "big-a" and body["max_tokens"] == 17 and body["stop"] == ["END"]
    assert body["messages"][-1] == {"role": "assistant", "content": "Hello, wor"} and body["continue_final_message"] is True
    assert body["stream"] is True and body["seed"] == 5 and body["temperature"] == 0.0
    raw = GenerationRequest("@cf/a", {"prompt": "Once upon", "raw": True, "max_tokens": 8, "temperature": 0.6})
    path, body = origin_body(origin, raw, prefill=" a time")
    assert path == "/completions" and body["prompt"] == "Once upon a time" and "messages" not in body


def test_regions_come_from_cf_on_cloudflare_and_headers_locally() -> None:
    routing = RoutingConfig.from_env({"REGIONS": '{"DE": {"origin": "de"}, "EU": {"resident": true}}'})
    local = Request("POST", "http://x/", {"cf-ipcountry": "FR", "cf-ipcontinent": "EU"})
    assert resolve_region(routing, local).name == "EU"  # no FR policy: its continent's
    worker = Request("POST", "http://x/", {"cf-ipcountry": "US"}, cf={"country": "DE", "continent": "EU"})
    assert resolve_region(routing, worker).name == "DE"  # request.cf wins over any header
    assert resolve_region(routing, Request("POST", "http://x/", {"cf-ipcountry": "JP"})) is None


@pytest.mark.parametrize("value", ["0", "-5", "soon", "1.5"])
def test_a_bad_request_timeout_header_is_a_400(value: str) -> None:
    with pytest.raises(GatewayError) as info:
        first_token_budget(RoutingConfig(), Request("POST", "http://x/", {"cf-aig-request-timeout": value}))
    assert info.value.status == 400
    assert first_token_budget(RoutingConfig(), Request("POST", "http://x/", {"cf-aig-request-timeout": "250"})) == 0.25
    assert first_token_budget(RoutingConfig(), Request("POST", "http://x/")) == 3.0


async def test_a_probe_whose_client_leaves_before_the_first_token_frees_the_probe_slot() -> None:
    import asyncio
    import logging

    from edgellm.deps import Deps
    from edgellm.routing.failover import start_routed
    from edgellm.routing.plan import routing_state
    from edgellm.state import IsolateState
    from edgellm_local.doubles.scripted import ScriptedAI

    class NoFetch:
        async def post(self, *args: object) -> object:
            raise AssertionError("the origin must not be asked when the client left")

    config = Config.from_env({"ORIGINS": '["http://o"]', "BREAKER": '{"failures": 1, "cooldown_s": 0}'})
    silent = ScriptedAI(hold_streams=True, description=None)  # accepts the stream, never sends a token (a hung edge)
    deps = Deps(config=config, ai=silent, fetch=NoFetch(), state=IsolateState(), log=logging.getLogger("test"))  # type: ignore[arg-type]
    breaker = routing_state(deps).breaker
    breaker.failure(0)  # open, with no cool-down: the next request is the probe
    request = GenerationRequest(config.model, {"prompt": "hi", "max_tokens": 4, "temperature": 0.0}, stream=True)
    task = asyncio.ensure_future(start_routed(deps, Request("POST", "http://x/"), request))
    while not breaker.probing:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not breaker.probing and breaker.admit(1) == "probe"


async def test_an_edge_cut_mid_answer_is_a_failure_for_the_breaker_even_when_no_origin_continues(make_deps: Any) -> None:
    """The breaker hears the edge's mid-stream failure before an origin is asked, so an origin
    that is down as well does not make it an attempt without a verdict."""
    from dataclasses import replace as dc_replace

    from edgellm.ports import FetchError
    from edgellm.routing.breaker import OPEN
    from edgellm.routing.failover import start_routed
    from edgellm.routing.plan import routing_state
    from edgellm_local.doubles.faults import FaultPlan, FaultyAI

    class DownFetch:
        async def post(self, *args: object) -> object:
            raise FetchError("connection refused")

    config = Config.from_env({"ORIGINS": '["http://o"]', "BREAKER": '{"failures": 1, "cooldown_s": 600}'})
    deps = make_deps(config=config)
    deps = dc_replace(deps, ai=FaultyAI(deps.ai, FaultPlan(fail_mid=1.0, after=2)), fetch=DownFetch(), kv=None)
    request = GenerationRequest(config.model, {"prompt": "hi", "max_tokens": 8, "temperature": 0.0}, stream=True)
    generation = await start_routed(deps, Request("POST", "http://x/"), request)
    with pytest.raises(GatewayError) as info:
        async for _ in generation.events:
            pass
    state = routing_state(deps)
    assert info.value.status == 502 and state.counters.failovers_mid_stream == 1 and state.counters.origin_errors == 1
    assert state.breaker is not None and state.breaker.state == OPEN


async def test_a_request_only_an_origin_could_take_but_cannot_carry_is_refused_by_name() -> None:
    """Too long for the edge's output limit, and holding an input no origin request carries: a
    400 naming that input, before anything is sent (not a 503, not an origin answering without it)."""
    import logging

    from edgellm.deps import Deps
    from edgellm.routing.plan import plan_route
    from edgellm.state import IsolateState

    class NoFetch:
        async def post(self, *args: object) -> object:
            raise AssertionError("nothing may be sent")

    config = Config.from_env({"ORIGINS": '["http://o"]', "EDGE_MAX_OUTPUT_TOKENS": "8"})
    deps = Deps(config=config, ai=None, fetch=NoFetch(), state=IsolateState(), log=logging.getLogger("test"))  # type: ignore[arg-type]
    request = GenerationRequest(config.model, {"prompt": "hi", "max_tokens": 64, "lora": "mine"})
    with pytest.raises(GatewayError) as info:
        await plan_route(deps, Request("POST", "http://x/"), request)
    assert (info.value.status, info.value.code, info.value.param) == (400, "unsupported_parameter", "lora")
    assert "too long for the edge" in info.value.message


async def test_the_routing_refusals_say_how_long_to_wait_by_their_cause() -> None:
    """No route for a region, or a resident region with nothing inside it, changes only when an
    operator acts (60 s); a request past what the edge takes with no origin for it may find a
    route once one recovers (30 s)."""
    import logging

    from edgellm.deps import Deps
    from edgellm.routing.failover import start_routed
    from edgellm.routing.plan import plan_route
    from edgellm.state import IsolateState
    from edgellm_local.doubles.scripted import ScriptedAI

    class NoFetch:  # an origin configured, never asked: every case is refused before anything is sent
        async def post(self, *args: object) -> object:
            raise AssertionError("nothing may be sent")

    def deps_for(env: dict[str, str], ai: Any = None) -> Deps:
        return Deps(config=Config.from_env(env), ai=ai or ScriptedAI(), fetch=NoFetch(), state=IsolateState(),  # type: ignore[arg-type]
                    log=logging.getLogger("test"))

    chat = GenerationRequest("@cf/meta/llama-2-7b-chat-int8", {"prompt": "hi", "max_tokens": 4}, stream=True)
    eu = Request("POST", "http://x/", headers={"cf-ipcountry": "DE", "cf-ipcontinent": "EU"}, cf={"country": "DE", "continent": "EU"})
    central = '[{"name": "central", "url": "http://o"}]'
    elsewhere = '[{"name": "central", "url": "http://o", "models": {"@cf/other": "org/other"}}]'  # serves another model only
    for origins, regions, code in ((elsewhere, {"EU": {"edge": False}}, "no_route"),
                                   (central, {"EU": {"resident": True, "edge": False}, "US": {"origin": "central"}}, "residency_unavailable")):
        with pytest.raises(GatewayError) as refused:
            await plan_route(deps_for({"ORIGINS": origins, "REGIONS": json.dumps(regions)}), eu, chat)
        assert (refused.value.status, refused.value.code, refused.value.retry_after) == (503, code, 60)
        assert refused.value.to_response().headers["retry-after"] == "60"
    too_long = deps_for({"ORIGINS": elsewhere, "EDGE_MAX_OUTPUT_TOKENS": "2"})  # past the edge's output limit, no origin for it
    with pytest.raises(GatewayError) as unrouted:
        await start_routed(too_long, Request("POST", "http://x/"), chat)
    assert (unrouted.value.status, unrouted.value.code, unrouted.value.retry_after) == (503, "no_route", 30)
