"""The Worker's side of one property every client leans on: a JSON answer is what its own stream
assembles to. Through `src/entry.py` over the REAL Workers SDK, with `env.AI` the platform's `Ai`
binding stood in by its contract (`fake_pyodide.JsAi`: an object for a request without `stream`, a
ReadableStream of SSE bytes whenever `inputs.stream` is truthy, JSON mode and tools included),
answered by real llama.cpp (SmolLM2-135M). The same cases as the local edge's
(tests/edge/test_json_equals_stream.py), field by field.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgellm.config import Config
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from tests.edge.test_json_equals_stream import CASES, check_calls, request, stop_inside
from tests.edge.test_structured_outputs import smollm2_runner  # noqa: F401  (the module-scoped SmolLM2 runner)
from tests.support import fake_pyodide as fp
from tests.unit.test_workers_sdk import Platform, runtime  # noqa: F401  (the SDK over the stand-ins)

FRESH = {"cf-aig-skip-cache": "true"}  # both ways answered by the model, neither a HIT of the other
# llama.cpp stands in for the model here and honours all of these (its constrained generation); the
# configuration says so, as a deployment serving a model with these capabilities would
CAPABLE = json.dumps({"@cf/meta/llama-2-7b-chat-int8": ["json_mode", "json_schema", "tools", "tool_choice"]})


async def answer(platform: Platform, body: dict[str, Any], stream: bool, headers: dict[str, str] | None = None) -> dict[str, Any]:
    """What a client reads of the Worker's answer, streamed or not, in one shape."""
    sent = {**body, "stream": True, "stream_options": {"include_usage": True}} if stream else body
    native = await platform.fetch(sent, headers)
    raw = (await native.bytes()).decode()
    assert native.status == 200, raw
    if not stream:
        data = json.loads(raw)
        choice = data["choices"][0]
        calls = [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in choice["message"].get("tool_calls") or []]
        return {"content": choice["message"]["content"] or "", "calls": calls, "finish_reason": choice["finish_reason"],
                "usage": data["usage"]}
    assert raw.rstrip().endswith("data: [DONE]"), raw
    text, usage, finish = "", None, None
    calls: dict[int, list[str]] = {}
    for line in raw.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or usage
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            for piece in delta.get("tool_calls") or []:
                call = calls.setdefault(piece["index"], ["", "", ""])
                call[0] = piece.get("id") or call[0]
                call[1] = piece["function"].get("name") or call[1]
                call[2] += piece["function"].get("arguments") or ""
            finish = choice.get("finish_reason") or finish
    return {"content": text, "calls": [tuple(calls[i]) for i in sorted(calls)], "finish_reason": finish, "usage": usage}


def compared(seen: dict[str, Any]) -> dict[str, Any]:
    assert all(call_id for call_id, _, _ in seen["calls"]), seen["calls"]
    usage = seen["usage"] or {}
    return {**seen, "calls": [(name, arguments) for _, name, arguments in seen["calls"]],
            "usage": {name: usage.get(name) for name in ("prompt_tokens", "completion_tokens", "total_tokens")}}


@pytest.fixture
def platform(runtime: Any, smollm2_runner: LlamaCppRunner) -> Platform:  # noqa: F811
    rt, entry = runtime
    return Platform(rt, entry, fp.JsAi(LlamaCppAI.for_config(Config(), smollm2_runner)), MODEL_CAPABILITIES=CAPABLE)


@pytest.mark.parametrize("case", list(CASES))
async def test_the_workers_json_answer_is_what_its_stream_assembles_to(platform: Platform, case: str) -> None:
    asked = request(case)
    if case == "stop sequence":
        asked["stop"] = stop_inside((await answer(platform, request("plain"), False, FRESH))["content"])
    whole = compared(await answer(platform, asked, False, FRESH))
    streamed = compared(await answer(platform, asked, True, FRESH))
    assert whole == streamed
    check_calls(whole)
    await platform.settle()


async def test_a_streamed_json_mode_request_is_answered_on_workers_ai(platform: Platform) -> None:
    """The binding answers a ReadableStream for any truthy `stream`: JSON mode, which Workers AI
    runs whole, must reach it without `stream` (with it, `.to_py()` of the stream failed, a 502)."""
    seen = await answer(platform, request("json mode"), True, FRESH)
    assert seen["content"].lstrip().startswith("{") and seen["finish_reason"] in ("stop", "length")
    if seen["finish_reason"] == "stop":
        assert isinstance(json.loads(seen["content"]), dict)
    json_mode = [inputs for _, inputs, _ in platform.ai.calls if inputs.get("response_format")]
    assert json_mode and all("stream" not in inputs for inputs in json_mode)
    await platform.settle()


async def test_a_hit_on_the_worker_answers_what_the_miss_did(platform: Platform) -> None:
    miss = compared(await answer(platform, request("several tool calls"), False))
    await platform.settle()
    assert compared(await answer(platform, request("several tool calls"), True)) == miss
    assert compared(await answer(platform, request("several tool calls"), False)) == miss
    assert len(platform.ai.calls) == 1  # both answered from KV
    await platform.settle()


async def test_the_worker_describes_its_models_from_the_catalog_it_ships(runtime: Any) -> None:  # noqa: F811
    """The `Ai` binding describes nothing (workerd): `/v1/models` and `system_fingerprint` come from
    the shipped catalog, with the keys the local edge gives (a null fingerprint and empty
    capabilities before)."""
    rt, entry = runtime
    platform = Platform(rt, entry, fp.JsAi(ScriptedAI()), MODEL="@hf/nousresearch/hermes-2-pro-mistral-7b")
    native = await platform.fetch({}, url="https://edge.example/v1/models", method="GET")
    [listed] = [m for m in json.loads(await native.bytes())["data"] if m["id"] == "@hf/nousresearch/hermes-2-pro-mistral-7b"]
    assert listed["edgellm"]["capabilities"] == ["json_mode", "json_schema", "tools"]
    assert listed["edgellm"]["context_window"] == 24000 and listed["edgellm"]["backend"] == "workers-ai"
    body = {"model": "@hf/nousresearch/hermes-2-pro-mistral-7b", "messages": [{"role": "user", "content": "hi"}]}
    answered = json.loads(await (await platform.fetch(body, FRESH)).bytes())
    assert answered["system_fingerprint"].startswith("fp_")
    await platform.settle()
