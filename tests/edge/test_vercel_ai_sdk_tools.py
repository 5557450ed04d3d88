"""The Vercel AI SDK's tool loop and structured output through the local edge on the default model
(SmolLM2-135M-Instruct), with both of its OpenAI providers over chat completions: `@ai-sdk/openai`
as `openai.chat(model)` and `@ai-sdk/openai-compatible`. (Its default `openai(model)` speaks the
Responses API, which this gateway serves as text generation only: tools there are a 400
`unsupported_parameter` naming `tools`, see test_responses.py.)

The SDK itself (installed by `make setup-test` into node_modules/.ai-sdk) runs in node:
`generateText` with a tool and `stopWhen: stepCountIs(4)` must end with a text answer after one
call and its result, the same through `streamText`, and `generateObject` with a zod schema must
give an object the schema accepts. Shape and invariants only, never wording."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from edgellm_local.emulator.server import EdgeServer

from .test_tool_loop import MODEL, default_edge, leaks, smollm2_runner  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
# EDGELLM_AI_SDK_DIR: another prefix installed the way the Makefile does (a worktree sharing node_modules).
SDK = Path(os.environ.get("EDGELLM_AI_SDK_DIR", ROOT / "node_modules" / ".ai-sdk"))
SCRIPT = ROOT / "tests" / "support" / "js" / "vercel_ai_sdk_tools.mjs"


def run_sdk(server: EdgeServer, provider: str) -> dict[str, dict[str, Any]]:
    assert (SDK / "node_modules" / "@ai-sdk" / "openai-compatible").exists(), "the Vercel AI SDK is missing: make setup-test"
    node = shutil.which("node")
    assert node, "node is missing (make setup-test installs the npm packages with it)"
    done = subprocess.run([node, str(SCRIPT), str(SDK), server.url, MODEL, provider], capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    return {c["call"]: c for c in map(json.loads, done.stdout.splitlines())}


def assert_loop_ends_with_an_answer(loop: dict[str, Any]) -> None:
    steps = loop["steps"]
    assert len(steps) >= 2, steps  # a call, then (after its result) the answer
    first, last = steps[0], steps[-1]
    assert first["finish"] == "tool-calls" and first["toolCalls"], first
    for call in first["toolCalls"]:
        assert call["name"] == "get_weather" and not call["invalid"] and isinstance(call["input"], dict), call
        assert call["id"].startswith("call_")
    assert [r["id"] for r in first["toolResults"]] == [c["id"] for c in first["toolCalls"]]
    assert loop["executed"] and all(isinstance(i.get("city"), str) for i in loop["executed"])
    assert last["finish"] == "stop" and not last["toolCalls"], last
    assert loop["finish"] == "stop" and loop["text"].strip() and not leaks(loop["text"])


@pytest.mark.parametrize("provider", ["openai-compatible", "openai-chat"])
def test_the_vercel_ai_sdk_tool_loop_and_object(default_edge: EdgeServer, provider: str) -> None:  # noqa: F811
    calls = run_sdk(default_edge, provider)
    assert set(calls) == {"generate", "stream", "object"}, calls
    assert_loop_ends_with_an_answer(calls["generate"])
    streamed = calls["stream"]
    assert not streamed["errors"] and streamed["parts"] >= 1, streamed
    assert_loop_ends_with_an_answer(streamed)
    made = calls["object"]
    assert made["valid"] and made["object"]["name"].strip() and made["object"]["country"].strip(), made
