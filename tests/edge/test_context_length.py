"""A prompt too long for the model is OpenAI's `context_length_exceeded` (the code LangChain and
LiteLLM trim or fall back on), whoever finds it: the edge's own count before inference, the
runner refusing it, or an origin. Through the real HTTP server, with real llama.cpp (the tiny
GGUF) and, for `edgellm dev --origin URL`, real processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from edgellm.config import MAX_CHARS_PER_TOKEN, MIN_TOKENS_PER_MESSAGE, Config
from edgellm.deps import Deps
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.emulator.http_fetch import HttpxFetch
from edgellm_local.emulator.server import EdgeServer
from tests.edge.test_routing import origin, routed, routing_env  # noqa: F401  (the origin process, the routed edge)
from tests.support.origin_process import OriginProcess

ADMIN = "context-admin"


def words(n: int) -> str:
    return " the" * n  # one token per word with the tiny BPE vocabulary


def assert_context_error(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "context_length_exceeded", "messages"), error


def test_edgellm_dev_with_an_origin_counts_with_its_own_models_tokenizer(tiny_model: Path, tmp_path: Path, origin: OriginProcess) -> None:  # noqa: F811
    """No EDGE_TOKENIZER: the local edge counts with the GGUF it serves. A prompt past every
    window (the edge's 8192, the origin's default 32768) is refused before any inference, and
    nothing reaches the origin."""
    edge = OriginProcess.start(tiny_model, tmp_path, "--origin", origin.url, "--admin-token", ADMIN)
    try:
        before = len(origin.generation_requests())
        # three messages under the per-message cap, ~37.5k tokens in all
        messages = [{"role": "user", "content": words(12_500)} for _ in range(3)]
        response = httpx.post(f"{edge.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 16}, timeout=120)
        assert_context_error(response)
        assert "32768" in response.json()["error"]["message"]  # the largest window of any route
        faults = httpx.get(f"{edge.url}/admin/faults", headers={"authorization": f"Bearer {ADMIN}"}, timeout=30).json()
        assert faults["calls"] == 0  # llama.cpp was never asked
        assert len(origin.generation_requests()) == before
        ok = httpx.post(f"{edge.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, timeout=120)
        assert ok.status_code == 200 and ok.headers["x-edgellm-route"] == "edge; reason=primary"
    finally:
        edge.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_the_runners_own_context_refusal_is_context_length_exceeded(edge: EdgeServer, stream: bool) -> None:
    """No routing, nothing counted: llama.cpp refuses a prompt past its slot (the tiny runner's
    2048 tokens over 4 slots) and that refusal is OpenAI's code, not `invalid_model_input`."""
    body = {"messages": [{"role": "user", "content": words(1000)}], "max_tokens": 8, "stream": stream}
    assert_context_error(httpx.post(f"{edge.url}/v1/chat/completions", json=body, timeout=120))
    too_much_output = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 600, "stream": stream}
    assert_context_error(httpx.post(f"{edge.url}/v1/chat/completions", json=too_much_output, timeout=120))
    completion = {"prompt": words(1000), "max_tokens": 8, "stream": stream}
    response = httpx.post(f"{edge.url}/v1/completions", json=completion, timeout=120)
    assert response.status_code == 400 and response.json()["error"]["code"] == "context_length_exceeded"


@pytest.fixture(scope="module")
def small_runner(tiny_model: Path) -> LlamaCppRunner:
    """An edge runner whose slots hold 256 tokens (the origin's: 512, the tiny GGUF's trained context)."""
    return LlamaCppRunner(tiny_model, n_ctx=1024, n_parallel=4, threads=1).load()


def test_an_uncounted_prompt_the_edge_cannot_hold_goes_to_an_origin_that_can(
    start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], small_runner: LlamaCppRunner, origin: OriginProcess,  # noqa: F811
) -> None:
    """Counting off (a Worker without EDGE_TOKENIZER): the edge's own refusal is not an edge
    failure but a reason to ask an origin with a larger window."""
    config = Config.from_env(routing_env(origin))
    deps = make_deps(config=config, ai=LlamaCppAI.for_config(config, small_runner), fetch=HttpxFetch(), kv=None)
    client = httpx.Client(base_url=start_edge(deps).url, timeout=120)
    before = len(origin.generation_requests())
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": words(400)}], "max_tokens": 8})
    assert response.status_code == 200, response.text
    assert response.headers["x-edgellm-route"] == "origin; reason=too-long-for-edge; origin=central"
    assert len(origin.generation_requests()) == before + 1
    assert deps.state.routing.breaker.state == "closed" and deps.state.routing.counters.too_long_for_edge == 1
    client.close()


def _stream_end(response: httpx.Response) -> tuple[str | None, dict[str, Any], str, list[str]]:
    """An SSE answer (with `stream_options.include_usage`): its finish_reason, usage, content
    and the names of the tools it called."""
    finish, usage, content, names = None, {}, "", []
    for line in response.text.splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line[len("data: "):])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                finish = choice.get("finish_reason") or finish
                delta = choice.get("delta") or {}
                content += delta.get("content") or choice.get("text") or ""
                names += [c["function"]["name"] for c in delta.get("tool_calls") or [] if c.get("function", {}).get("name")]
    return finish, usage, content, names


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_an_answer_cut_by_the_slots_context_finishes_with_length(
    start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], small_runner: LlamaCppRunner, stream: bool, route: str,
) -> None:
    """A prompt and a max_tokens that each fit the 256-token slot but not together: llama.cpp stops
    when the slot is full, short of max_tokens, and that is OpenAI's "length" (the answer is cut),
    not "stop" (which tells a client the answer is complete)."""
    config = Config(open_access=True)
    client = httpx.Client(base_url=start_edge(make_deps(config=config, ai=LlamaCppAI.for_config(config, small_runner), kv=None)).url, timeout=120)
    max_tokens = 200
    common = {"max_tokens": max_tokens, "temperature": 0, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    path, body = (("/v1/chat/completions", {"messages": [{"role": "user", "content": words(150)}], **common}) if route == "chat"
                  else ("/v1/completions", {"prompt": words(150), **common}))
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    if stream:
        finish, usage, _, _ = _stream_end(response)
    else:
        finish, usage = response.json()["choices"][0]["finish_reason"], response.json()["usage"]
    assert 0 < usage["completion_tokens"] < max_tokens  # cut by the slot, not by max_tokens
    assert usage["prompt_tokens"] + usage["completion_tokens"] == small_runner.slot_context
    assert finish == "length"
    client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_call_cut_by_the_slots_context_finishes_with_length_not_tool_calls(
    start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], tiny_model: Path, stream: bool,
) -> None:
    """The forced call's arguments run into the full slot (512 tokens: the tool's description
    alone takes ~280): finish_reason "length", and the half-written call is not sent (a client
    could not parse its arguments), streamed or not; nor does the envelope leak as text."""
    config = Config(open_access=True)
    runner = LlamaCppRunner(tiny_model, n_ctx=512, n_parallel=1, threads=1).load()
    client = httpx.Client(base_url=start_edge(make_deps(config=config, ai=LlamaCppAI.for_config(config, runner), kv=None)).url, timeout=120)
    tool = {"type": "function", "function": {"name": "note", "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    body = {"messages": [{"role": "user", "content": words(180)}], "tools": [tool], "tool_choice": "required", "max_tokens": 200,
            "temperature": 0, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    if stream:
        finish, usage, content, names = _stream_end(response)
        assert names == [] and "tool_calls" not in content
    else:
        choice, usage = response.json()["choices"][0], response.json()["usage"]
        finish = choice["finish_reason"]
        assert not choice["message"].get("tool_calls")
        assert "tool_calls" not in (choice["message"]["content"] or "")
    assert usage["completion_tokens"] < 200 and usage["prompt_tokens"] + usage["completion_tokens"] == runner.slot_context
    assert finish == "length"
    client.close()
    runner.close()


def test_an_origins_context_refusal_is_context_length_exceeded(routed: Callable[..., Any], origin: OriginProcess) -> None:  # noqa: F811
    client, faulty, _ = routed(ORIGINS=[{"name": "central", "url": origin.url, "context_window": 8192}])
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": words(1000)}], "max_tokens": 8})
    assert_context_error(response)
    message = response.json()["error"]["message"]
    assert "origin central" in message and "max_tokens 8" in message and "8192" in message  # the numbers the edge knows
    assert "do not fit the model's context window" not in message  # the origin's own message (an EdgeLLM's) is logged, not repeated


# --- the per-message cap follows the routes -------------------------------------------------------


def test_a_message_only_an_origin_could_take_reaches_the_origin(routed: Callable[..., Any], origin: OriginProcess) -> None:  # noqa: F811
    """~100k characters (25k tokens): past the old fixed 64 KiB cap, within a 32k-token origin's
    window. It is routed (the edge refuses it, the origin is asked), not refused as `message_too_long`."""
    client, faulty, _ = routed(ORIGINS=[{"name": "central", "url": origin.url, "context_window": 32768}])
    before = len(origin.generation_requests())
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": words(25_000)}], "max_tokens": 8})
    assert response.json()["error"]["code"] != "message_too_long"
    assert len(origin.generation_requests()) == before + 1  # the tiny origin cannot hold it either: its own refusal answers
    assert_context_error(response)


@pytest.mark.parametrize("path, field, param", [("/v1/chat/completions", "messages", "messages[0].content"),
                                                ("/v1/completions", "prompt", "prompt")])
def test_the_message_cap_is_the_largest_routes_window_in_characters(
    start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], origin: OriginProcess, path: str, field: str, param: str,  # noqa: F811
) -> None:
    small = Config.from_env({"OPEN_ACCESS": "true", "CONTEXT_WINDOW": "2048"})
    routed_config = Config.from_env(routing_env(origin, CONTEXT_WINDOW="2048",
                                                 ORIGINS=[{"name": "central", "url": origin.url, "context_window": 4096}]))
    assert small.max_message_chars == 2048 * MAX_CHARS_PER_TOKEN < small.max_body_bytes
    assert routed_config.max_message_chars == 4096 * MAX_CHARS_PER_TOKEN
    past_small = "x" * (small.max_message_chars + 1)

    def body(text: str) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": text}], "max_tokens": 4} if field == "messages" else {"prompt": text, "max_tokens": 4}

    edge = start_edge(make_deps(config=small))
    response = httpx.post(edge.url + path, json=body(past_small), timeout=120)
    assert response.status_code == 400 and response.json()["error"]["param"] == param
    assert response.json()["error"]["code"] in ("message_too_long", "prompt_too_long")
    within = httpx.post(edge.url + path, json=body("x" * small.max_message_chars), timeout=120)
    assert within.json()["error"]["code"] == "context_length_exceeded"  # taken, and refused by the model's window
    routed_edge = start_edge(make_deps(config=routed_config, fetch=HttpxFetch(), kv=None))
    before = len(origin.generation_requests())
    response = httpx.post(routed_edge.url + path, json=body(past_small), timeout=120)
    assert response.json()["error"]["code"] == "context_length_exceeded"  # past the edge's cap, within the origin's: routed
    assert len(origin.generation_requests()) == before + 1


# --- so does the message count ---------------------------------------------------------------------


def test_the_message_count_cap_is_the_largest_routes_window(
    start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], origin: OriginProcess,  # noqa: F811
) -> None:
    """A fixed 256 refused, as `too_many_messages`, a conversation an origin could hold. The cap
    is now how many messages the largest window could hold (each costs at least
    MIN_TOKENS_PER_MESSAGE): 300 pass the guard, and past the cap is refused before any work."""
    small = Config.from_env({"OPEN_ACCESS": "true", "CONTEXT_WINDOW": "2048"})
    routed_config = Config.from_env(routing_env(origin, CONTEXT_WINDOW="2048",
                                                 ORIGINS=[{"name": "central", "url": origin.url, "context_window": 4096}]))
    assert small.max_messages == 2048 // MIN_TOKENS_PER_MESSAGE
    assert routed_config.max_messages == 4096 // MIN_TOKENS_PER_MESSAGE
    assert Config.from_env({"CONTEXT_WINDOW": "2048", "MAX_MESSAGES": "10"}).max_messages == 10  # stricter only
    assert Config.from_env({"CONTEXT_WINDOW": "2048", "MAX_MESSAGES": "99999"}).max_messages == 1024

    def chat(count: int) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": "x"}] * count, "max_tokens": 4}

    edge = start_edge(make_deps(config=small))
    taken = httpx.post(edge.url + "/v1/chat/completions", json=chat(300), timeout=120)
    assert taken.json()["error"]["code"] == "context_length_exceeded"  # taken, and refused by the tiny slot's window
    refused = httpx.post(edge.url + "/v1/chat/completions", json=chat(small.max_messages + 1), timeout=120)
    assert refused.status_code == 400
    assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == ("too_many_messages", "messages")
    routed_edge = start_edge(make_deps(config=routed_config, fetch=HttpxFetch(), kv=None))
    before = len(origin.generation_requests())
    response = httpx.post(routed_edge.url + "/v1/chat/completions", json=chat(small.max_messages + 1), timeout=120)
    assert response.json()["error"]["code"] != "too_many_messages"  # past the edge's cap, within the origin's: routed
    assert len(origin.generation_requests()) == before + 1
