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

from edgellm.config import Config
from edgellm.ports import Deps
from edgellm_local.ai import LlamaCppAI, LlamaCppRunner
from edgellm_local.origin_fetch import HttpxFetch
from edgellm_local.server import EdgeServer
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


def test_an_origins_context_refusal_is_context_length_exceeded(routed: Callable[..., Any], origin: OriginProcess) -> None:  # noqa: F811
    client, faulty, _ = routed(ORIGINS=[{"name": "central", "url": origin.url, "context_window": 8192}])
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": words(1000)}], "max_tokens": 8})
    assert_context_error(response)
    assert "origin central" in response.json()["error"]["message"]
