"""Every event kind (text, logprobs, tool-call fragments, usage, errors) across every routing path
(edge, fallback id, origin, failover before and after the first token, the Flight object), through
the local edge's real HTTP server with a real origin process configured (`ORIGINS`).

The edge side is either real llama.cpp (behind `FaultyAI`) or, where a test needs an exact
sequence of events (a tool-call fragment then a stall), `ScriptedAI`: a fake at the binding seam
that replays a script of Workers AI stream events. The origin is always the real second process,
whose request log says what reached it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import httpx
import pytest

from edgellm.config import Config
from edgellm.ports import AIBinding, BindingError
from edgellm.deps import Deps
from edgellm_local.doubles.faults import FaultPlan, FaultyAI
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.http_fetch import HttpxFetch
from edgellm_local.emulator.server import EdgeServer
from tests.edge.test_routing import origin, routing_env  # noqa: F401  (the module-scoped origin process)
from tests.support.origin_process import OriginProcess

PRIMARY, FALLBACK = "@cf/meta/llama-2-7b-chat-int8", "@cf/meta/llama-2-7b-chat-hf-lora"
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
SCHEMA = {"type": "object", "properties": {"sunny": {"type": "boolean"}}, "required": ["sunny"], "additionalProperties": False}


def logprob(token: str) -> dict[str, Any]:
    return {"token": token, "logprob": -0.5, "bytes": list(token.encode()), "top_logprobs": []}


TEXT = [{"response": "Hel", "logprobs": [logprob("Hel")]}, {"response": "lo", "logprobs": [logprob("lo")]},
        {"response": "", "usage": {"prompt_tokens": 7, "completion_tokens": 2}}]
TOOL_FRAGMENTS = [
    {"response": "", "tool_calls": [{"index": 0, "id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":'}}]},
    {"response": "", "tool_calls": [{"index": 0, "function": {"arguments": '"Paris","days":2}'}}]},
    {"response": "", "usage": {"prompt_tokens": 7, "completion_tokens": 9}},
]


@pytest.fixture
def edge_with(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], origin: OriginProcess) -> Iterator[Callable[..., tuple[httpx.Client, Any, Deps]]]:  # noqa: F811
    clients: list[httpx.Client] = []

    def start(ai: Callable[[AIBinding], Any], kv: bool = False, **env: Any) -> tuple[httpx.Client, Any, Deps]:
        deps = make_deps(config=Config.from_env(routing_env(origin, **env)))
        binding = ai(deps.ai)
        deps = replace(deps, ai=binding, fetch=HttpxFetch(), **({} if kv else {"kv": None}))
        client = httpx.Client(base_url=start_edge(deps).url, timeout=60)
        clients.append(client)
        return client, binding, deps

    yield start
    for client in clients:
        client.close()


def scripted(script: list[dict[str, Any]], then: str = "end", fail_at_start: bool = False, delay_first: bool = False,
             retired: tuple[str, ...] = (), gate: threading.Event | None = None) -> Callable[[AIBinding], ScriptedAI]:
    """The library's double over the real binding (so capabilities are the real model's): each
    stream replays `script`, then ends, stalls until closed or fails; `fail_at_start` refuses the
    call, `retired` models are unknown, `gate` holds the stream before its second event."""
    fail = BindingError("3043: internal server error (scripted)") if fail_at_start else None
    held = {"gate": gate, "hold_before": 1} if gate is not None else {}
    return lambda real: ScriptedAI(inner=real, events=tuple(script), then=then, streams_only=True, fail=fail,
                                   delay_first=delay_first, retired=frozenset(retired), **held)


def ask(**extra: Any) -> dict[str, Any]:
    return {"model": PRIMARY, "messages": ASK, "max_tokens": 60, "temperature": 0, **extra}


@dataclass
class Seen:
    """What a client received, streamed or not, in one shape."""

    status: int
    route: str
    model: str | None
    text: str
    calls: list[dict[str, Any]]
    logprobs: list[dict[str, Any]] | None
    usage: dict[str, Any] | None
    finish: str | None
    error: dict[str, Any] | None
    final_route: str | None = None


def post(client: httpx.Client, body: dict[str, Any], stream: bool, **headers: str) -> Seen:
    if not stream:
        response = client.post("/v1/chat/completions", json=body, headers=headers)
        data = response.json()
        if response.status_code != 200:
            return Seen(response.status_code, response.headers.get("x-edgellm-route", ""), None, "", [], None, None, None, data["error"])
        choice = data["choices"][0]
        calls = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                 for c in choice["message"].get("tool_calls") or []]
        logprobs = (choice.get("logprobs") or {}).get("content")
        return Seen(200, response.headers["x-edgellm-route"], response.headers.get("x-edgellm-model"), choice["message"]["content"] or "",
                    calls, logprobs, data["usage"], choice["finish_reason"], None)
    events: list[dict[str, Any]] = []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}},
                       headers=headers) as response:
        status, route, model = response.status_code, response.headers.get("x-edgellm-route", ""), response.headers.get("x-edgellm-model")
        if status != 200:
            response.read()
            return Seen(status, route, model, "", [], None, None, None, response.json()["error"])
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events.append(json.loads(line[6:]))
    calls: dict[int, dict[str, Any]] = {}
    text, logprobs, usage, finish, final_route = "", None, None, None, None
    for event in events:
        usage = event.get("usage") or usage
        final_route = event.get("edgellm_route") or final_route
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(piece["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] = piece.get("id") or call["id"]
                call["name"] = (piece.get("function") or {}).get("name") or call["name"]
                call["arguments"] += (piece.get("function") or {}).get("arguments") or ""
            if choice.get("logprobs"):
                logprobs = (logprobs or []) + list(choice["logprobs"]["content"])
            finish = choice.get("finish_reason") or finish
    error = events[-1].get("error") if events else None
    return Seen(status, route, model, text, [calls[i] for i in sorted(calls)], logprobs, usage, finish, error, final_route)


def origin_bodies(origin: OriginProcess, before: int) -> list[dict[str, Any]]:  # noqa: F811
    return [json.loads(r["body"]) for r in origin.generation_requests()[before:]]


def check_weather(call: dict[str, Any]) -> None:
    assert call["name"] == "get_weather" and call["id"]
    args = json.loads(call["arguments"])
    assert set(args) == {"city", "days"} and isinstance(args["city"], str) and 1 <= args["days"] <= 7


# --- the edge answers ---------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_real_edge_tool_call_with_an_origin_configured_is_answered_by_the_edge(edge_with: Callable[..., Any], origin: OriginProcess, stream: bool) -> None:  # noqa: F811
    """The reported 500: `_follow_edge` read `.text` from a tool-call event."""
    client, faulty, _ = edge_with(lambda real: FaultyAI(real, FaultPlan()))
    before = len(origin.generation_requests())
    seen = post(client, ask(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=120), stream,
                **{"cf-aig-request-timeout": "60000"})
    assert seen.status == 200, seen.error
    assert seen.route == "edge; reason=primary" and seen.finish == "tool_calls" and seen.calls
    for call in seen.calls:
        check_weather(call)
    assert origin_bodies(origin, before) == []


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("retired", [(), (PRIMARY,)], ids=["edge", "fallback-id"])
def test_every_event_kind_crosses_the_edge_and_the_fallback_id(edge_with: Callable[..., Any], stream: bool, retired: tuple[str, ...]) -> None:
    model = FALLBACK if retired else PRIMARY
    client, ai, _ = edge_with(scripted(TOOL_FRAGMENTS, retired=retired))
    seen = post(client, ask(tools=[WEATHER_TOOL]), stream)
    assert (seen.status, seen.route, seen.model, seen.finish) == (200, "edge; reason=primary", model, "tool_calls")
    assert seen.calls == [{"id": "call_abc", "name": "get_weather", "arguments": '{"city":"Paris","days":2}'}]
    assert (seen.usage["prompt_tokens"], seen.usage["completion_tokens"]) == (7, 9)
    client, ai, _ = edge_with(scripted(TEXT, retired=retired))
    seen = post(client, ask(logprobs=True), stream)
    assert (seen.status, seen.model, seen.text, seen.finish) == (200, model, "Hello", "stop")
    assert [entry["token"] for entry in seen.logprobs] == ["Hel", "lo"]
    assert (seen.usage["prompt_tokens"], seen.usage["completion_tokens"]) == (7, 2)


# --- the origin answers: every parameter carried ---------------------------------------------------

CARRIED_PARAMETERS: dict[str, Any] = {
    "stop": ["ZZZ"], "temperature": 0.3, "top_p": 0.9, "top_k": 20, "seed": 11, "frequency_penalty": 0.1,
    "presence_penalty": 0.2, "repetition_penalty": 1.1, "max_tokens": 50,
}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("path", ["edge-error", "edge-timeout"])
def test_a_failover_before_the_first_token_carries_the_tools(edge_with: Callable[..., Any], origin: OriginProcess, stream: bool, path: str) -> None:  # noqa: F811
    """The reported prose: a constrained tool call emits nothing until whole, the edge's
    first-token budget ran out, and the origin was asked without `tools`."""
    client, _, _ = edge_with(scripted(TOOL_FRAGMENTS, fail_at_start=path == "edge-error", delay_first=path == "edge-timeout"))
    before = len(origin.generation_requests())
    seen = post(client, ask(tools=[WEATHER_TOOL], tool_choice="required", max_tokens=120, parallel_tool_calls=False), stream,
                **{"cf-aig-request-timeout": "300"})
    assert seen.status == 200, seen.error
    assert seen.route == f"origin; reason={path}; origin=central" and seen.finish == "tool_calls"
    assert len(seen.calls) == 1 and not seen.text
    check_weather(seen.calls[0])
    [sent] = origin_bodies(origin, before)
    assert sent["tools"] == [WEATHER_TOOL] and sent["tool_choice"] == "required" and sent["parallel_tool_calls"] is False


def test_a_failover_carries_sampling_stop_logprobs_and_usage(edge_with: Callable[..., Any], origin: OriginProcess) -> None:  # noqa: F811
    client, _, _ = edge_with(scripted(TEXT, fail_at_start=True))
    before = len(origin.generation_requests())
    seen = post(client, ask(**CARRIED_PARAMETERS), True)
    assert seen.status == 200 and seen.route == "origin; reason=edge-error; origin=central" and seen.usage["completion_tokens"] > 0
    [sent] = origin_bodies(origin, before)
    assert {name: sent.get(name) for name in CARRIED_PARAMETERS} == CARRIED_PARAMETERS
    seen = post(client, ask(logprobs=True, top_logprobs=2, max_tokens=6), True)
    assert seen.status == 200 and seen.logprobs and all(len(entry["top_logprobs"]) == 2 for entry in seen.logprobs)
    seen = post(client, ask(logprobs=True, top_logprobs=2, max_tokens=6), False)
    assert seen.status == 200 and seen.logprobs and seen.usage["completion_tokens"] == len(seen.logprobs)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_failover_carries_the_response_format(edge_with: Callable[..., Any], origin: OriginProcess, stream: bool) -> None:  # noqa: F811
    client, _, _ = edge_with(scripted(TEXT, delay_first=True))
    before = len(origin.generation_requests())
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA, "strict": True}}
    seen = post(client, ask(response_format=fmt), stream, **{"cf-aig-request-timeout": "300"})
    assert seen.status == 200 and seen.route == "origin; reason=edge-timeout; origin=central"
    assert isinstance(json.loads(seen.text)["sunny"], bool)
    [sent] = origin_bodies(origin, before)
    assert sent["response_format"]["type"] == "json_schema" and sent["response_format"]["json_schema"]["schema"] == SCHEMA


def test_a_parameter_no_origin_request_can_carry_keeps_the_request_on_the_edge(edge_with: Callable[..., Any], origin: OriginProcess) -> None:  # noqa: F811
    """`raw` with messages has no OpenAI spelling: the edge's failure is the answer (503/502), and
    nothing reaches the origin; had it been sent, it would have been answered without it."""
    client, ai, _ = edge_with(scripted(TEXT, fail_at_start=True))
    before = len(origin.generation_requests())
    seen = post(client, ask(raw=True), False)
    assert seen.status in (502, 503) and seen.error["code"] == "upstream_error"
    assert origin_bodies(origin, before) == []


# --- failover after the first token --------------------------------------------------------------


def test_text_and_logprobs_are_continued_by_the_origin_after_a_stall(edge_with: Callable[..., Any], origin: OriginProcess) -> None:  # noqa: F811
    client, ai, _ = edge_with(scripted(TEXT[:2], then="stall"), EDGE_STALL_MS="500")
    before = len(origin.generation_requests())
    seen = post(client, ask(logprobs=True, max_tokens=8), True)
    assert seen.status == 200 and seen.error is None and seen.final_route == "edge,origin; reason=stall"
    assert seen.text.startswith("Hello") and len(seen.text) > len("Hello")
    assert [entry["token"] for entry in seen.logprobs[:2]] == ["Hel", "lo"] and len(seen.logprobs) > 2  # the origin's too
    assert seen.usage["completion_tokens"] == len(seen.logprobs)
    [sent] = origin_bodies(origin, before)
    assert sent["messages"][-1] == {"role": "assistant", "content": "Hello"} and sent["logprobs"] is True and sent["max_tokens"] == 6


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("then", ["stall", "fail"])
def test_a_tool_call_cut_after_its_first_fragment_is_an_error_never_a_guess(edge_with: Callable[..., Any], origin: OriginProcess, stream: bool, then: str) -> None:  # noqa: F811
    client, ai, _ = edge_with(scripted(TOOL_FRAGMENTS[:1], then=then), EDGE_STALL_MS="500")
    before = len(origin.generation_requests())
    seen = post(client, ask(tools=[WEATHER_TOOL]), stream)
    assert seen.error is not None and seen.error["code"] == "upstream_error", seen
    assert "tool call" in seen.error["message"]
    if not stream:
        assert seen.status == 502
    assert origin_bodies(origin, before) == [] and ai.closed == 1


def test_text_cut_under_a_schema_is_an_error_not_an_unconstrained_continuation(edge_with: Callable[..., Any], origin: OriginProcess) -> None:  # noqa: F811
    client, ai, _ = edge_with(scripted([{"response": '{"sun'}], then="fail"))
    before = len(origin.generation_requests())
    fmt = {"type": "json_schema", "json_schema": {"name": "weather", "schema": SCHEMA}}
    seen = post(client, ask(response_format=fmt), True)
    assert seen.text == '{"sun' and seen.error["code"] == "upstream_error" and "response_format" in seen.error["message"]
    assert origin_bodies(origin, before) == []


def test_an_origin_failing_mid_continuation_ends_the_stream_with_an_error(edge_with: Callable[..., Any], origin: OriginProcess) -> None:  # noqa: F811
    dead = [{"name": "central", "url": "http://127.0.0.1:9", "context_window": 2048}]
    client, ai, _ = edge_with(scripted(TEXT[:2], then="fail"), ORIGINS=dead)
    seen = post(client, ask(), True)
    assert seen.text == "Hello" and seen.error is not None and seen.error["code"] == "origin_unreachable"


# --- the Flight object ---------------------------------------------------------------------------


def test_joiners_of_a_flight_get_every_event_kind(edge_with: Callable[..., Any]) -> None:
    gate = threading.Event()
    client, ai, deps = edge_with(scripted(TOOL_FRAGMENTS, gate=gate), kv=True)
    body = ask(tools=[WEATHER_TOOL], seed=3)
    results: list[Seen] = []
    threads = [threading.Thread(target=lambda: results.append(post(client, body, True))) for _ in range(2)]
    threads[0].start()
    with ai.arrived:  # the flight has started its generation
        assert ai.arrived.wait_for(lambda: ai.calls, 60)
    deadline = time.monotonic() + 60
    threads[1].start()
    while deps.state.cache.coalesced < 1 and time.monotonic() < deadline:  # the joiner is counted when the object answers it
        threading.Event().wait(0.01)
    gate.set()
    for thread in threads:
        thread.join(60)
    assert len(ai.calls) == 1 and deps.state.cache.coalesced == 1
    assert len(results) == 2
    for seen in results:
        assert seen.status == 200 and seen.finish == "tool_calls" and seen.usage["completion_tokens"] == 9
        assert seen.calls == [{"id": "call_abc", "name": "get_weather", "arguments": '{"city":"Paris","days":2}'}]
