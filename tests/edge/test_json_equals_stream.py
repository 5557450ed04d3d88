"""One property every client leans on: a request's JSON answer is exactly what its own stream
assembles to (content, every tool call, finish reason, usage), on every path.

Through the local edge's real HTTP server over real llama.cpp (SmolLM2-135M, the default model, so
tool calls and their cuts are a real model's), each request is sent both ways, as the openai SDK,
the AI SDK and litellm send them, and the two answers are compared field by field. Tool-call ids
are made per answer: each is checked present, the rest compared. The same property over the
Worker's adapter is tests/unit/test_worker_json_equals_stream.py.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from typing import Any, Callable, Iterator

import httpx
import pytest

from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.ports import BindingError
from edgellm.state import IsolateState
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.http_fetch import HttpxFetch
from edgellm_local.emulator.server import EdgeApp, EdgeServer
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from tests.edge.test_routing import origin, routing_env  # noqa: F401  (the module-scoped origin process)
from tests.edge.test_routing_events import Seen, post
from tests.edge.test_structured_outputs import smollm2_runner  # noqa: F401  (the module-scoped SmolLM2 runner)
from tests.support.origin_process import OriginProcess

MODEL = "@cf/meta/llama-2-7b-chat-int8"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TWO_CITIES = [{"role": "user", "content": "What is the weather in Paris and in London? Call get_weather for each city."}]
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]

# name -> the request's own fields (model and temperature 0 added)
CASES: dict[str, dict[str, Any]] = {
    "plain": {"messages": FRANCE, "max_tokens": 40},
    "stop sequence": {"messages": FRANCE, "max_tokens": 40, "stop": ["<the plain answer's third word>"]},
    "max_tokens cut": {"messages": FRANCE, "max_tokens": 4},
    "one tool call": {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": [WEATHER],
                      "tool_choice": "required", "max_tokens": 80},
    "several tool calls": {"messages": TWO_CITIES, "tools": [WEATHER], "max_tokens": 120},
    # the two cuts seen splitting and gluing calls: after the first call, and inside the second
    "tool calls cut after one": {"messages": TWO_CITIES, "tools": [WEATHER], "max_tokens": 40},
    "tool calls cut inside one": {"messages": TWO_CITIES, "tools": [WEATHER], "max_tokens": 60},
    "json mode": {"messages": [{"role": "user", "content": "Give the capital of France as JSON."}],
                  "response_format": {"type": "json_object"}, "max_tokens": 60},
}


def request(case: str) -> dict[str, Any]:
    return {"model": MODEL, "temperature": 0, **CASES[case]}


def stop_inside(plain: str) -> list[str]:
    """A stop sequence the model's plain answer holds (its third word): the stop case then cuts
    whatever the llama.cpp build's wording, never a stop the answer happens not to reach."""
    words = plain.split()
    assert len(words) >= 3, plain
    return [" " + words[2]]


def fields(seen: Seen) -> dict[str, Any]:
    """What a client reads of an answer; tool-call ids are per answer, so only checked present."""
    assert seen.status == 200 and seen.error is None, seen
    assert all(call["id"] for call in seen.calls), seen.calls
    return {"content": seen.text, "calls": [(c["name"], c["arguments"]) for c in seen.calls], "finish_reason": seen.finish,
            "usage": {name: (seen.usage or {}).get(name) for name in ("prompt_tokens", "completion_tokens", "total_tokens")}}


def check_calls(answer: dict[str, Any]) -> None:
    """Whole calls: one name each and arguments that parse on their own (never two glued)."""
    for name, arguments in answer["calls"]:
        assert name == "get_weather"
        assert isinstance(json.loads(arguments), dict), arguments


@pytest.fixture(scope="module")
def smollm2_edge(smollm2_runner: LlamaCppRunner) -> Iterator[httpx.Client]:  # noqa: F811
    """An edge of its own (module-scoped: one model load for every case), answering from the
    model every time: no KV, so neither way of asking is a HIT of the other."""
    config = Config(open_access=True)
    deps = Deps(config=config, ai=LlamaCppAI.for_config(config, smollm2_runner), kv=None, log=logging.getLogger("edgellm.test"),
                state=IsolateState())
    server = EdgeServer(EdgeApp(deps, None)).start()
    try:
        with httpx.Client(base_url=server.url, timeout=120) as client:
            yield client
    finally:
        server.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_a_json_answer_is_what_its_stream_assembles_to(smollm2_edge: httpx.Client, case: str) -> None:
    asked = request(case)
    if case == "stop sequence":
        asked["stop"] = stop_inside(fields(post(smollm2_edge, request("plain"), False))["content"])
    whole, streamed = fields(post(smollm2_edge, asked, False)), fields(post(smollm2_edge, asked, True))
    assert whole == streamed
    check_calls(whole)
    if case.startswith("tool calls cut"):
        assert whole["finish_reason"] == "length"
    if case == "several tool calls":
        assert whole["finish_reason"] == "tool_calls" and len(whole["calls"]) == 2
    if case == "stop sequence":
        assert asked["stop"][0] not in whole["content"] and whole["finish_reason"] == "stop"


def test_a_hit_answers_both_ways_what_the_miss_answered(start_edge: Callable[..., EdgeServer], smollm2_runner: LlamaCppRunner) -> None:  # noqa: F811
    config = Config(open_access=True)
    server = start_edge(config=config, ai=LlamaCppAI.for_config(config, smollm2_runner))
    with httpx.Client(base_url=server.url, timeout=120) as client:
        for case in ("plain", "several tool calls"):
            miss = post(client, request(case), False)
            assert miss.route  # answered, and kept
            hit_json, hit_stream = post(client, request(case), False), post(client, request(case), True)
            assert fields(miss) == fields(hit_json) == fields(hit_stream)


@pytest.mark.parametrize("case", ["plain", "max_tokens cut"])
def test_an_origin_answer_is_the_same_both_ways(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps],
                                                  origin: OriginProcess, case: str) -> None:  # noqa: F811
    """The edge refuses at the call, so the origin (a real second process) answers both."""
    deps = make_deps(config=Config.from_env(routing_env(origin)), kv=None, fetch=HttpxFetch())
    failing = ScriptedAI(inner=deps.ai, fail=BindingError("3043: internal server error (scripted)"))
    server = start_edge(replace(deps, ai=failing))
    with httpx.Client(base_url=server.url, timeout=120) as client:
        whole, streamed = post(client, request(case), False), post(client, request(case), True)
    assert whole.route.startswith("origin") and streamed.route.startswith("origin")
    assert fields(whole) == fields(streamed)
