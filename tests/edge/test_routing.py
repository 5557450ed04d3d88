"""Edge and origin through the local edge's real HTTP server, with a real origin process.

The edge is llama.cpp (the tiny GGUF) behind `FaultyAI`, the fault-injecting binding of the
local edge; the origin is a second local edge (`edgellm dev`) in its own process, whose own
request log says what reached it. Text is gibberish: tests assert routes, stitching and
invariants, never wording.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from edgellm.config import Config
from edgellm.deps import Deps
from edgellm_local.doubles.faults import FaultPlan, FaultyAI
from edgellm_local.emulator.http_fetch import HttpxFetch
from edgellm_local.hub.publish import publish
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.hub.sinks import BlobStoreSink
from tests.conftest import ManualClock
from tests.support.origin_process import OriginProcess

ADMIN = "routing-admin"


@pytest.fixture(scope="module")
def origin(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OriginProcess]:
    process = OriginProcess.start(tiny_model, tmp_path_factory.mktemp("origin"))
    yield process
    process.stop()


def routing_env(origin: OriginProcess, **extra: Any) -> dict[str, Any]:
    origins = extra.pop("ORIGINS", [{"name": "central", "url": origin.url, "region": "US", "context_window": 2048}])
    # Budgets far above any healthy gap (the machine is shared and busy): only injected faults trip them.
    return {"ORIGINS": json.dumps(origins), "ADMIN_TOKEN": ADMIN, "OPEN_ACCESS": "true", "EDGE_FIRST_TOKEN_MS": "60000", "EDGE_STALL_MS": "60000", **extra}


@pytest.fixture
def routed(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], origin: OriginProcess) -> Callable[..., tuple[httpx.Client, FaultyAI, Deps]]:
    clients: list[httpx.Client] = []

    def start(plan: FaultPlan | None = None, kv: bool = False, clock: Any = None, **env: Any) -> tuple[httpx.Client, FaultyAI, Deps]:
        config = Config.from_env(routing_env(origin, **env))
        deps = make_deps(config=config, clock=clock)
        faulty = FaultyAI(deps.ai, plan or FaultPlan())
        deps = replace(deps, ai=faulty, fetch=HttpxFetch(), **({} if kv else {"kv": None}))
        server = start_edge(deps)
        client = httpx.Client(base_url=server.url, timeout=60)
        clients.append(client)
        return client, faulty, deps

    yield start
    for client in clients:
        client.close()


def chat(content: str = "Hello there", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0, **extra}


def stream_text(client: httpx.Client, body: dict[str, Any], **headers: str) -> tuple[httpx.Response, str, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    done = False
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as response:
        for line in response.iter_lines():
            done = done or line == "data: [DONE]"
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    assert done or events[-1].get("error"), "a stream ends with [DONE] or an error event"
    text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))
    return response, text, events


def continuation_of(origin: OriginProcess, body: dict[str, Any], prefill: str, max_tokens: int) -> str:
    """What the origin answers, streamed, when asked to continue `prefill` (deterministic at temperature 0)."""
    messages = [*body["messages"], {"role": "assistant", "content": prefill}]
    with httpx.stream("POST", f"{origin.url}/v1/chat/completions", timeout=60,
                      json={**body, "messages": messages, "max_tokens": max_tokens, "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    return "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))


def test_edge_answers_when_it_is_healthy(routed: Callable[..., Any], origin: OriginProcess) -> None:
    client, faulty, _ = routed()
    before = len(origin.generation_requests())
    response = client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    assert response.headers["x-edgellm-route"] == "edge; reason=primary"
    assert response.headers["x-edgellm-model"] == response.json()["model"] == "@cf/meta/llama-2-7b-chat-int8"
    assert faulty.calls == 1 and len(origin.generation_requests()) == before


def test_a_binding_error_goes_to_the_origin(routed: Callable[..., Any], origin: OriginProcess) -> None:
    client, faulty, _ = routed(FaultPlan(fail=1.0))
    before = len(origin.generation_requests())
    response = client.post("/v1/chat/completions", json=chat("What is routing?"))
    assert response.status_code == 200, response.text
    assert response.headers["x-edgellm-route"] == "origin; reason=edge-error; origin=central"
    assert response.json()["choices"][0]["message"]["content"]
    sent = origin.generation_requests()[before:]
    assert len(sent) == 1 and json.loads(sent[0]["body"])["messages"] == chat("What is routing?")["messages"]


def test_retired_models_fall_back_on_the_edge_before_the_origin(routed: Callable[..., Any], origin: OriginProcess) -> None:
    client, faulty, _ = routed(FaultPlan(retired=1.0, models=("@cf/meta/llama-2-7b-chat-int8",)))
    response = client.post("/v1/chat/completions", json=chat())
    assert response.headers["x-edgellm-route"] == "edge; reason=primary"
    assert response.headers["x-edgellm-model"] == "@cf/meta/llama-2-7b-chat-hf-lora"
    faulty.plan = FaultPlan(retired=1.0)  # every id retired: then the origin
    before = len(origin.generation_requests())
    response = client.post("/v1/chat/completions", json=chat())
    assert response.headers["x-edgellm-route"] == "origin; reason=model-unavailable; origin=central"
    assert len(origin.generation_requests()) == before + 1


def test_no_first_token_in_the_budget_goes_to_the_origin_and_stops_the_edge(routed: Callable[..., Any]) -> None:
    client, faulty, _ = routed(FaultPlan(delay_first=1.0, delay_s=600))
    response, text, events = stream_text(client, chat(), **{"cf-aig-request-timeout": "300"})
    assert response.headers["x-edgellm-route"] == "origin; reason=edge-timeout; origin=central"
    assert text and events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert faulty.calls == 1 and faulty.closed == 1  # the edge stream was closed before the origin was asked


@pytest.mark.parametrize("fault", [FaultPlan(stall=1.0, after=4), FaultPlan(fail_mid=1.0, after=4)], ids=["stall", "failure"])
def test_a_mid_stream_failure_is_continued_by_the_origin_in_one_stream(routed: Callable[..., Any], origin: OriginProcess, fault: FaultPlan) -> None:
    # an injected stall lasts until the gateway closes the stream, so any budget ends it
    client, faulty, _ = routed(fault, kv=True, EDGE_STALL_MS="1500")
    body = chat("Tell me a story")
    before = len(origin.generation_requests())
    response, text, events = stream_text(client, body)
    edge_part = "".join(faulty.sent)
    assert len(faulty.sent) == 4 and faulty.closed == 1
    reason = "stall" if fault.stall else "edge-failed-mid-stream"
    assert response.headers["x-edgellm-route"] == "edge; reason=primary"  # sent before the failover
    assert events[-1]["edgellm_route"] == f"edge,origin; reason={reason}"
    assert not any(e.get("error") for e in events)
    [asked] = origin.generation_requests()[before:]
    sent_messages = json.loads(asked["body"])["messages"]
    assert sent_messages[-1] == {"role": "assistant", "content": edge_part}  # continue exactly what the client has
    assert text == edge_part + continuation_of(origin, body, edge_part, 12 - 4)
    faulty.plan = FaultPlan()
    again = client.post("/v1/chat/completions", json=body)
    assert again.headers["cf-aig-cache-status"] == "MISS"  # the stitched answer was never cached
    assert again.headers["x-edgellm-route"] == "edge; reason=primary"


def test_a_json_answer_stitched_mid_generation_says_both_routes(routed: Callable[..., Any]) -> None:
    client, faulty, _ = routed(FaultPlan(fail_mid=1.0, after=3))
    response = client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200
    assert response.headers["x-edgellm-route"] == "edge,origin; reason=edge-failed-mid-stream"
    assert response.json()["choices"][0]["message"]["content"].startswith("".join(faulty.sent))


def test_without_an_origin_a_mid_stream_failure_ends_with_an_error_event(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps]) -> None:
    deps = make_deps(kv=None)
    faulty = FaultyAI(deps.ai, FaultPlan(fail_mid=1.0, after=2))
    server = start_edge(replace(deps, ai=faulty, fetch=HttpxFetch()))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response, text, events = stream_text(client, chat())
    assert events[-1]["error"]["code"] == "upstream_error" and text == "".join(faulty.sent)


def test_the_breaker_opens_skips_the_edge_and_one_probe_closes_it(routed: Callable[..., Any]) -> None:
    clock = ManualClock()
    client, faulty, _ = routed(FaultPlan(fail=1.0), clock=clock, BREAKER=json.dumps({"failures": 2, "window_s": 60, "cooldown_s": 30}))
    admin = {"authorization": f"Bearer {ADMIN}"}
    for _ in range(2):
        assert client.post("/v1/chat/completions", json=chat()).headers["x-edgellm-route"].startswith("origin; reason=edge-error")
    assert client.get("/admin/routing/stats", headers=admin).json()["breaker"]["state"] == "open"
    response = client.post("/v1/chat/completions", json=chat())
    assert response.headers["x-edgellm-route"] == "origin; reason=breaker; origin=central"
    assert faulty.calls == 2  # the open breaker did not touch the edge
    clock.advance(31)
    response = client.post("/v1/chat/completions", json=chat())  # the probe fails: open again
    assert faulty.calls == 3 and response.headers["x-edgellm-route"].startswith("origin; reason=edge-error")
    assert client.get("/admin/routing/stats", headers=admin).json()["breaker"]["state"] == "open"
    clock.advance(31)
    faulty.plan = FaultPlan()
    response = client.post("/v1/chat/completions", json=chat())  # the probe succeeds: closed
    assert response.headers["x-edgellm-route"] == "edge; reason=primary"
    stats = client.get("/admin/routing/stats", headers=admin).json()
    assert stats["breaker"]["state"] == "closed" and stats["breaker_skips"] == 1 and stats["breaker"]["opened"] == 2


@pytest.fixture
def with_tokenizer(tiny_model: Path) -> Callable[[Deps], None]:
    def put(deps: Deps) -> None:
        assert deps.r2 is not None
        asyncio.run(publish(tiny_model, "tiny", BlobStoreSink(deps.r2)))

    return put


def test_a_prompt_too_long_for_the_edge_goes_to_the_origin(routed: Callable[..., Any], with_tokenizer: Callable[[Deps], None], origin: OriginProcess) -> None:
    client, faulty, deps = routed(EDGE_TOKENIZER="tiny", EDGE_MAX_PROMPT_TOKENS="40")
    with_tokenizer(deps)
    short = client.post("/v1/chat/completions", json=chat("hi"))
    assert short.headers["x-edgellm-route"] == "edge; reason=primary"
    counted = deps.state.routing.tokenizers["tiny"].count(chat("hi"))
    assert counted == short.json()["usage"]["prompt_tokens"]  # the edge counts what llama.cpp sees
    before = len(origin.generation_requests())
    long = client.post("/v1/chat/completions", json=chat("tell me about it " * 20))
    assert long.headers["x-edgellm-route"] == "origin; reason=too-long-for-edge; origin=central"
    assert faulty.calls == 1 and len(origin.generation_requests()) == before + 1


def test_a_prompt_too_long_for_every_route_is_a_400_with_no_inference(routed: Callable[..., Any], with_tokenizer: Callable[[Deps], None], origin: OriginProcess) -> None:
    client, faulty, deps = routed(EDGE_TOKENIZER="tiny", CONTEXT_WINDOW="100",
                                  ORIGINS=[{"name": "central", "url": origin.url, "context_window": 200}])
    with_tokenizer(deps)
    before = len(origin.generation_requests())
    response = client.post("/v1/chat/completions", json=chat("tell me about it " * 60))
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    assert faulty.calls == 0 and len(origin.generation_requests()) == before


def test_a_resident_region_refuses_rather_than_send_anything_abroad(routed: Callable[..., Any], origin: OriginProcess) -> None:
    regions = {"EU": {"resident": True, "edge": False}, "US": {"origin": "central"}}
    client, faulty, _ = routed(REGIONS=json.dumps(regions))
    before = len(origin.requests())
    response = client.post("/v1/chat/completions", json=chat("a private question"), headers={"cf-ipcountry": "DE", "cf-ipcontinent": "EU"})
    assert response.status_code == 503 and response.headers["retry-after"] == "60"  # an operator must act
    assert response.json()["error"]["code"] == "residency_unavailable" and "EU" in response.json()["error"]["message"]
    assert faulty.calls == 0 and len(origin.requests()) == before  # the origin's own log: nothing left
    # the control: a request from a region that is not resident does reach the same origin
    faulty.plan = FaultPlan(fail=1.0)
    response = client.post("/v1/chat/completions", json=chat("a public question"), headers={"cf-ipcountry": "US"})
    assert response.headers["x-edgellm-route"] == "origin; reason=edge-error; origin=central"
    assert len(origin.requests()) == before + 1


def test_a_resident_region_whose_edge_fails_does_not_fail_over_abroad(routed: Callable[..., Any], origin: OriginProcess) -> None:
    client, faulty, _ = routed(FaultPlan(fail=1.0), REGIONS=json.dumps({"EU": {"resident": True}}))
    before = len(origin.requests())
    response = client.post("/v1/chat/completions", json=chat(), headers={"cf-ipcontinent": "EU"})
    assert response.status_code == 502 and len(origin.requests()) == before


def test_a_resident_regions_cached_answers_stay_in_its_scope(routed: Callable[..., Any]) -> None:
    regions = {"EU": {"resident": True, "cache_ttl": 120}}
    client, _, _ = routed(kv=True, REGIONS=json.dumps(regions))
    eu, us = {"cf-ipcontinent": "EU"}, {"cf-ipcontinent": "NA"}
    first = client.post("/v1/chat/completions", json=chat("cache me"), headers=eu)
    assert first.headers["cf-aig-cache-status"] == "MISS"
    assert client.post("/v1/chat/completions", json=chat("cache me"), headers=eu).headers["cf-aig-cache-status"] == "HIT"
    abroad = client.post("/v1/chat/completions", json=chat("cache me"), headers=us)
    assert abroad.headers["cf-aig-cache-status"] == "MISS"  # not the resident entry
    assert abroad.headers["x-edgellm-cache-key"] != first.headers["x-edgellm-cache-key"]


def test_a_bad_timeout_header_is_a_400(routed: Callable[..., Any]) -> None:
    client, faulty, _ = routed()
    response = client.post("/v1/chat/completions", json=chat(), headers={"cf-aig-request-timeout": "soon"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "cf-aig-request-timeout"
    assert faulty.calls == 0


def test_edgellm_dev_wires_origins_and_faults_from_the_command_line(tiny_model: Path, tmp_path: Path, origin: OriginProcess) -> None:
    edge = OriginProcess.start(tiny_model, tmp_path, "--origin", origin.url, "--origin-token", "tok", "--admin-token", ADMIN,
                               "--fault", "fail=1", "--var", "EDGE_FIRST_TOKEN_MS=60000")
    admin = {"authorization": f"Bearer {ADMIN}"}
    try:
        before = len(origin.generation_requests())
        response = httpx.post(f"{edge.url}/v1/chat/completions", json=chat(), timeout=60)
        assert response.headers["x-edgellm-route"] == "origin; reason=edge-error; origin=origin1"
        [asked] = origin.generation_requests()[before:]
        assert asked["authorization"] == "Bearer tok"
        assert httpx.post(f"{edge.url}/admin/faults", json={}, timeout=10).status_code == 401
        plan = httpx.post(f"{edge.url}/admin/faults", json={"stall": 0.0}, headers=admin, timeout=10).json()
        assert plan["plan"]["fail"] == 0 and plan["injected"]["fail"] == 1
        again = httpx.post(f"{edge.url}/v1/chat/completions", json=chat(), timeout=60)
        assert again.headers["x-edgellm-route"] == "edge; reason=cache"  # the origin's complete answer was cached
        response = httpx.post(f"{edge.url}/v1/chat/completions", json=chat("another question"), timeout=60)
        assert response.headers["x-edgellm-route"] == "edge; reason=primary"
    finally:
        edge.stop()


def test_a_raw_completion_is_continued_as_prompt_plus_partial_answer(routed: Callable[..., Any], origin: OriginProcess) -> None:
    client, faulty, _ = routed(FaultPlan(fail_mid=1.0, after=3))
    before = len(origin.generation_requests())
    body = {"prompt": "Once upon a time", "max_tokens": 10, "temperature": 0}
    response = client.post("/v1/completions", json=body)
    assert response.headers["x-edgellm-route"] == "edge,origin; reason=edge-failed-mid-stream"
    [asked] = origin.generation_requests()[before:]
    sent = json.loads(asked["body"])
    assert asked["path"] == "/v1/completions" and sent["prompt"] == "Once upon a time" + "".join(faulty.sent)
    assert response.json()["choices"][0]["text"].startswith("".join(faulty.sent))


def test_the_workers_ai_stream_says_both_routes_in_its_last_event(routed: Callable[..., Any]) -> None:
    client, faulty, _ = routed(FaultPlan(fail_mid=1.0, after=2))
    run = "/client/v4/accounts/abc/ai/run/@cf/meta/llama-2-7b-chat-int8"
    with client.stream("POST", run, json={"prompt": "Hi", "max_tokens": 8, "stream": True}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    assert events[-1]["edgellm_route"] == "edge,origin; reason=edge-failed-mid-stream" and "usage" in events[-1]
    assert "".join(e["response"] for e in events).startswith("".join(faulty.sent))


def test_a_session_keeps_to_one_origin_replica_and_its_warm_slot(routed: Callable[..., Any], origin: OriginProcess) -> None:
    """Three origin names (one real server behind them, so the route header tells which was
    picked): a session's turns always go to the same one, sessions spread over them, and the
    origin (an EdgeLLM edge, slots pooled) gets the session and reuses the conversation's prompt."""
    replicas = [{"name": name, "url": origin.url, "region": "US", "context_window": 2048} for name in ("r1", "r2", "r3")]
    client, _, _ = routed(FaultPlan(fail=1.0), ORIGINS=replicas)  # the edge always fails: every turn is an origin's
    picked: dict[str, set[str]] = {}
    for session in [f"conv-{i}" for i in range(6)]:
        messages: list[dict[str, str]] = []
        for turn, text in enumerate(["Tell me about rivers and the sea.", "And lakes?"]):
            messages.append({"role": "user", "content": text})
            before = len(origin.generation_requests())
            response = client.post("/v1/chat/completions", headers={"x-session-affinity": session},
                                   json={"messages": messages, "max_tokens": 4, "temperature": 0})
            assert response.status_code == 200, response.text
            picked.setdefault(session, set()).add(response.headers["x-edgellm-route"].rsplit("origin=", 1)[1])
            assert [r["session"] for r in origin.generation_requests()[before:]] == [session]
            if turn:
                assert response.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
            messages.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
    assert all(len(names) == 1 for names in picked.values()), picked  # pinned
    assert len(set().union(*picked.values())) > 1, picked  # and spread


def test_identical_requests_share_one_routed_generation_stitched_answers_included(routed: Callable[..., Any], origin: OriginProcess) -> None:
    """Coalescing composes with routing: a second identical stream joins the Flight object's
    generation while the edge is stalled; the origin continues once for both; both streams say
    `edge,origin` at their end; the stitched answer is written by nobody."""
    client, faulty, deps = routed(FaultPlan(stall=1.0, after=4), kv=True, EDGE_STALL_MS="4000")
    body = chat("Tell me about lighthouses")
    before = len(origin.generation_requests())
    results: list[tuple[httpx.Response, str, list[dict[str, Any]]]] = []
    first_token = threading.Event()

    def leader() -> None:
        events: list[dict[str, Any]] = []
        with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    events.append(json.loads(line[6:]))
                    first_token.set()
        text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))
        results.append((response, text, events))

    thread = threading.Thread(target=leader)
    thread.start()
    assert first_token.wait(60)  # the flight is running (and will stall after 4 tokens)
    joiner = threading.Thread(target=lambda: results.append(stream_text(client, body)))
    joiner.start()
    deadline = time.monotonic() + 60
    while deps.state.cache.coalesced < 1 and time.monotonic() < deadline:
        threading.Event().wait(0.01)  # the joiner is counted when the object answers it
    thread.join(60)
    joiner.join(60)
    assert deps.state.cache.coalesced == 1 and faulty.calls == 1  # one edge generation for both
    assert len(origin.generation_requests()) == before + 1  # one continuation for both
    (_, text_a, events_a), (_, text_b, events_b) = results
    assert text_a == text_b and text_a
    assert events_a[-1]["edgellm_route"] == events_b[-1]["edgellm_route"] == "edge,origin; reason=stall"
    faulty.plan = FaultPlan()
    again = client.post("/v1/chat/completions", json=body)
    assert again.headers["cf-aig-cache-status"] == "MISS"  # the flight wrote nothing
