"""The Vercel AI SDK's default provider (`openai(model)`, which speaks the Responses API) works
unchanged against the local edge: the SDK itself (installed by `make setup-test` into
node_modules/.ai-sdk) runs in node and calls the edge plainly, streamed, and continued with
`previousResponseId`, where the second turn reuses the first one's prompt tokens."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

from edgellm.deps import Deps
from edgellm_local.emulator.server import EdgeServer

from .test_responses import MODEL, conversational, pooled_runner  # noqa: F401 (fixtures)

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "node_modules" / ".ai-sdk"
SCRIPT = ROOT / "tests" / "support" / "js" / "vercel_ai_sdk.mjs"


def test_the_default_openai_provider_of_the_vercel_ai_sdk(start_edge: Callable[..., EdgeServer], conversational: Callable[..., Deps]) -> None:  # noqa: F811
    assert (SDK / ".installed").exists(), "the Vercel AI SDK is missing: make setup-test"
    node = shutil.which("node")
    assert node, "node is missing (make setup-test installs the npm packages with it)"
    server = start_edge(conversational())
    done = subprocess.run([node, str(SCRIPT), str(SDK), server.url, MODEL], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    calls: dict[str, dict[str, Any]] = {c["call"]: c for c in map(json.loads, done.stdout.splitlines())}
    assert set(calls) == {"generate", "stream", "continue"}, calls
    generated, streamed, continued = calls["generate"], calls["stream"], calls["continue"]
    assert generated["text"] and generated["id"].startswith("resp_") and generated["finish"] == "length"
    assert generated["usage"]["output_tokens"] == 6 and generated["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert streamed["text"] == generated["text"] and streamed["parts"] > 1 and streamed["finish"] == "length"  # greedy: same text
    assert continued["text"] and continued["usage"]["input_tokens"] > generated["usage"]["input_tokens"]
    assert continued["usage"]["input_tokens_details"]["cached_tokens"] > 0
