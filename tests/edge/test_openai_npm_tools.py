"""The openai npm SDK's (7.x) tool loop through the local edge on the default model (SmolLM2-135M-
Instruct): chat.completions.create with tools -> tool_calls -> the tool's result -> a final text
answer, by hand (not streamed, and streamed with the calls assembled from the deltas) and through
the SDK's own `runTools` loop (not streamed and streamed). A default model that never
answers after a tool result would loop; here every loop must end with text after one round of calls.

The SDK (installed by `make setup-test` into node_modules/.ai-sdk) runs in node,
tests/support/js/openai_npm_tools.mjs. Shape and invariants only, never wording."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from edgellm_local.emulator.server import EdgeServer

from .test_tool_loop import MODEL, default_edge, leaks, smollm2_runner  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
# EDGELLM_AI_SDK_DIR: another prefix installed the way the Makefile does (a worktree sharing node_modules).
SDK = Path(os.environ.get("EDGELLM_AI_SDK_DIR", ROOT / "node_modules" / ".ai-sdk"))
SCRIPT = ROOT / "tests" / "support" / "js" / "openai_npm_tools.mjs"
LOOPS = {"create", "create-stream", "runTools", "runTools-stream"}


def run_sdk(server: EdgeServer) -> dict[str, dict[str, Any]]:
    package = SDK / "node_modules" / "openai" / "package.json"
    assert package.exists(), "the openai npm SDK is missing: make setup-test"
    assert json.loads(package.read_text())["version"].startswith("7."), "openai npm 7.x is pinned in the Makefile"
    node = shutil.which("node")
    assert node, "node is missing (make setup-test installs the npm packages with it)"
    done = subprocess.run([node, str(SCRIPT), str(SDK), server.url, MODEL], capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    return {loop["loop"]: loop for loop in map(json.loads, done.stdout.splitlines())}


def assert_call_result_answer(loop: dict[str, Any]) -> None:
    assert "error" not in loop, loop
    steps = loop["steps"]
    assert len(steps) == 2, steps  # one round of calls, then (after the results) the answer
    first, last = steps
    assert first["finish"] == "tool_calls" and first["toolCalls"], first
    assert first["content"] in (None, ""), first  # a call is no text, and no envelope
    for call in first["toolCalls"]:
        assert call["id"].startswith("call_") and call["type"] == "function" and call["name"] == "get_weather", call
        assert isinstance(json.loads(call["arguments"]), dict) and not leaks(call["arguments"]), call
    assert len({c["id"] for c in first["toolCalls"]}) == len(first["toolCalls"])
    assert len(loop["executed"]) == len(first["toolCalls"]) and all(isinstance(a, dict) for a in loop["executed"])
    assert last["finish"] == "stop" and not last["toolCalls"], last
    assert isinstance(last["content"], str) and last["content"].strip() and not leaks(last["content"]), last


def test_the_openai_npm_tool_loop_ends_with_an_answer(default_edge: EdgeServer) -> None:  # noqa: F811
    loops = run_sdk(default_edge)
    assert set(loops) == LOOPS, loops
    failed = {}
    for name in sorted(LOOPS):
        try:
            assert_call_result_answer(loops[name])
        except AssertionError as error:
            failed[name] = str(error)[:600]
    assert failed == {}
    for name in ("runTools", "runTools-stream"):  # the SDK's own loop hands back the last step's text
        assert loops[name]["text"] == loops[name]["steps"][-1]["content"]
