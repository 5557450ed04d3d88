"""The inference API through the local edge's real HTTP server, on real llama.cpp (a tiny GGUF).

The answer cache is left out (`kv=None`) where a test needs every request to reach the model;
the cache has its own tests. Real-model text is gibberish here: tests assert shape, counts,
determinism and invariants, never wording.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

from edgellm.config import Config
from edgellm.ports import BindingError, CapacityExceeded
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.emulator.server import EdgeServer
from tests.conftest import target_headers
from edgellm_local.doubles.scripted import ScriptedAI

PRIMARY = "@cf/meta/llama-2-7b-chat-int8"
FALLBACK = "@cf/meta/llama-2-7b-chat-hf-lora"
RUN = f"/client/v4/accounts/0123abcd/ai/run/{PRIMARY}"


def chat_body(content: str = "Hello there", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 16, "temperature": 0, **extra}


@pytest.fixture
def api(edge_url: Callable[..., str]) -> Iterator[httpx.Client]:
    """The edge under test: a local one without the cache, or `EDGELLM_TEST_BASE_URL`."""
    with httpx.Client(base_url=edge_url(kv=None), headers=target_headers(kv=None), timeout=30) as client:
        yield client


def sse(lines: str) -> list[Any]:
    out = []
    for block in lines.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def stream(client: httpx.Client, path: str, body: dict[str, Any]) -> tuple[int, list[bytes], list[Any]]:
    with client.stream("POST", path, json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = list(response.iter_bytes())  # decoded: a platform edge gzips text, flushing each chunk
    return len(chunks), chunks, sse(b"".join(chunks).decode())


def test_chat_completion(api: httpx.Client) -> None:
    response = api.post("/v1/chat/completions", json=chat_body(max_tokens=12))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["x-edgellm-model"] == PRIMARY
    data = response.json()
    assert data["id"].startswith("chatcmpl-") and data["object"] == "chat.completion"
    assert isinstance(data["created"], int) and abs(data["created"] - time.time()) < 60
    assert data["model"] == PRIMARY
    [choice] = data["choices"]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"]
    # the tiny model never emits end-of-generation, so it always uses its whole budget
    assert choice["finish_reason"] == "length"
    usage = data["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["prompt_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_completion(api: httpx.Client) -> None:
    data = api.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 9, "temperature": 0}).json()
    assert data["object"] == "text_completion" and data["id"].startswith("cmpl-")
    assert data["choices"][0]["text"] and data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 9
    # a completion continues the raw text: far fewer prompt tokens than the chat template adds
    chat = api.post("/v1/chat/completions", json=chat_body("Once upon a time", max_tokens=1)).json()
    assert data["usage"]["prompt_tokens"] < chat["usage"]["prompt_tokens"]


def test_chat_stream_arrives_token_by_token(api: httpx.Client) -> None:
    body = chat_body(max_tokens=24, stream=True, stream_options={"include_usage": True})
    n_chunks, _, events = stream(api, "/v1/chat/completions", body)
    assert n_chunks > 1  # flushed as generated, not buffered into one body
    assert events[-1] == "[DONE]"
    data = events[:-1]
    assert {e["object"] for e in data} == {"chat.completion.chunk"} and len({e["id"] for e in data}) == 1
    assert data[0]["choices"][0]["delta"]["role"] == "assistant"
    contents = [e["choices"][0]["delta"]["content"] for e in data[1:-2]]
    assert len(contents) == 24 and all(contents)  # one event per generated token
    assert data[-2]["choices"][0]["finish_reason"] == "length"
    assert data[-1]["choices"] == [] and data[-1]["usage"]["completion_tokens"] == 24
    # the stream says exactly what the non-streamed answer says
    whole = api.post("/v1/chat/completions", json=chat_body(max_tokens=24)).json()
    assert "".join(contents) == whole["choices"][0]["message"]["content"]
    assert data[-1]["usage"] == whole["usage"]


def test_completion_stream(api: httpx.Client) -> None:
    _, _, events = stream(api, "/v1/completions", {"prompt": "abc", "max_tokens": 6, "temperature": 0, "stream": True})
    assert events[-1] == "[DONE]"
    assert [e["choices"][0]["finish_reason"] for e in events[:-1]][-1] == "length"
    assert all("usage" not in e for e in events[:-1])  # no usage unless asked for


def test_models_names_the_gguf(api: httpx.Client, tiny_model: Path) -> None:
    data = api.get("/v1/models").json()
    models = {m["id"]: m for m in data["data"] if m["edgellm"]["role"] != "alias"}  # aliases: test_structured_outputs
    assert list(models) == [PRIMARY, FALLBACK]
    for model in models.values():
        assert model["object"] == "model"
        assert model["edgellm"]["backend"] == "llama.cpp"
        assert model["edgellm"]["gguf_name"] == tiny_model.name
        assert Path(model["edgellm"]["gguf"]) == tiny_model
    assert models[PRIMARY]["edgellm"]["role"] == "primary"


def test_workers_ai_rest_route(api: httpx.Client) -> None:
    response = api.post(RUN, json={"prompt": "Tell me a story", "max_tokens": 10, "temperature": 0})
    assert response.status_code == 200
    data = response.json()
    assert data["success"] is True and data["errors"] == [] and data["messages"] == []
    assert isinstance(data["result"]["response"], str) and data["result"]["response"]
    assert data["result"]["usage"]["completion_tokens"] == 10


def test_workers_ai_rest_route_streams(api: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 10, "temperature": 0, "stream": True}
    n_chunks, _, events = stream(api, RUN, body)
    assert n_chunks > 1
    assert events[-1] == "[DONE]"
    tokens = [e["response"] for e in events[:-2]]
    assert len(tokens) == 10 and all(isinstance(t, str) and t for t in tokens)
    assert events[-2]["response"] == "" and events[-2]["usage"]["completion_tokens"] == 10
    whole = api.post(RUN, json={**body, "stream": False}).json()
    assert "".join(tokens) == whole["result"]["response"]


class HeldRunner:
    """The real llama.cpp runner, its callback held at the first chunk with text until `resume`:
    the generation is provably mid-run, inside llama.cpp's thread, for as long as a test wants."""

    def __init__(self, inner: LlamaCppRunner) -> None:
        self.inner, self.path = inner, inner.path
        self.holding, self.resume = threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:  # the queue bound, slot context, control tokens: the real runner's
        return getattr(self.inner, name)

    def _held(self, callback: Any) -> Any:
        def on_chunk(chunk: Any) -> bool:
            texts = [(c.get("delta") or {}).get("content") or c.get("text") for c in chunk.get("choices") or []]
            if not any(texts) or self.holding.is_set():
                return callback(chunk)
            self.holding.set()  # before the chunk is passed on: a client that sees it sees the hold
            stop = callback(chunk)
            self.resume.wait(60)
            return stop

        return on_chunk

    def chat(self, body: dict[str, Any], callback: Any = None) -> Any:
        return self.inner.chat(body, self._held(callback) if callback else None)

    def complete(self, body: dict[str, Any], callback: Any = None) -> Any:
        return self.inner.complete(body, self._held(callback) if callback else None)


def test_healthz_answers_while_a_generation_is_running(start_edge: Callable[..., EdgeServer], tiny_runner: LlamaCppRunner) -> None:
    """A generation never holds the event loop: with llama.cpp held mid-generation, /healthz is
    answered (were the generation on the loop, the request would hang until the client's timeout)."""
    runner = HeldRunner(tiny_runner)
    server = start_edge(ai=LlamaCppAI.for_config(Config(), runner), kv=None)  # type: ignore[arg-type]
    try:
        with httpx.Client(base_url=server.url, timeout=30) as api:
            with api.stream("POST", "/v1/chat/completions", json=chat_body(max_tokens=40, stream=True)) as response:
                chunks = response.iter_raw()
                first = next(chunks)
                assert runner.holding.is_set() and not runner.resume.is_set()  # llama.cpp is mid-generation
                health = api.get("/healthz")
                assert health.status_code == 200 and health.json()["status"] == "ok"
                runner.resume.set()
                rest = b"".join(chunks)
    finally:
        runner.resume.set()
    events = sse((first + rest).decode())
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"  # it went on afterwards


def test_concurrent_requests_are_all_answered(api: httpx.Client) -> None:
    prompts = [f"Question number {i}" for i in range(8)]

    def ask(prompt: str) -> dict[str, Any]:
        with httpx.Client(base_url=api.base_url, timeout=60) as client:
            response = client.post("/v1/chat/completions", json=chat_body(prompt, max_tokens=20))
            assert response.status_code == 200
            return response.json()

    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        answers = list(pool.map(ask, prompts))
    assert all(a["usage"]["completion_tokens"] == 20 for a in answers)
    # each answer belongs to its own prompt: concurrent slots do not mix requests up
    alone = [api.post("/v1/chat/completions", json=chat_body(p, max_tokens=20)).json() for p in prompts[:3]]
    assert [a["choices"][0]["message"]["content"] for a in alone] == [a["choices"][0]["message"]["content"] for a in answers[:3]]


def test_temperature_zero_is_deterministic(api: httpx.Client) -> None:
    texts = {api.post("/v1/chat/completions", json=chat_body(max_tokens=20)).json()["choices"][0]["message"]["content"] for _ in range(3)}
    assert len(texts) == 1


def test_a_seed_makes_sampling_repeatable(api: httpx.Client) -> None:
    def sample(seed: int) -> str:
        body = chat_body(max_tokens=24, temperature=1.5, seed=seed)
        return api.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]

    assert sample(42) == sample(42)
    assert len({sample(seed) for seed in (1, 2, 3, 4)}) > 1  # and the seed reaches the sampler


@pytest.mark.parametrize("max_tokens", [1, 5, 33])
def test_max_tokens_is_honoured(api: httpx.Client, max_tokens: int) -> None:
    data = api.post("/v1/chat/completions", json=chat_body(max_tokens=max_tokens)).json()
    assert data["usage"]["completion_tokens"] == max_tokens


def test_top_k_one_is_greedy_whatever_the_temperature(api: httpx.Client) -> None:
    greedy = api.post("/v1/chat/completions", json=chat_body(max_tokens=20)).json()["choices"][0]["message"]["content"]
    for seed in (1, 2):
        body = chat_body(max_tokens=20, temperature=2.0, top_k=1, seed=seed)
        assert api.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"] == greedy


def test_stop_sequence_cuts_the_answer(api: httpx.Client) -> None:
    full = api.post("/v1/chat/completions", json=chat_body(max_tokens=30)).json()["choices"][0]["message"]["content"]
    stop = full[5:7]
    cut = full[: full.find(stop)]
    for streamed in (False, True):
        body = chat_body(max_tokens=30, stop=[stop], stream=streamed)
        if streamed:
            _, _, events = stream(api, "/v1/chat/completions", body)
            text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1])
            reason = events[-2]["choices"][0]["finish_reason"]
        else:
            choice = api.post("/v1/chat/completions", json=body).json()["choices"][0]
            text, reason = choice["message"]["content"], choice["finish_reason"]
        assert (text, reason) == (cut, "stop")


def test_the_default_edge_with_its_cache_answers_too(edge: EdgeServer) -> None:
    for _ in range(2):  # a miss, then (the cache permitting) a hit: the same answer either way
        response = httpx.post(f"{edge.url}/v1/chat/completions", json=chat_body(max_tokens=8), timeout=30)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == 8


@pytest.mark.parametrize(
    ("error", "status"),
    [(CapacityExceeded("3040: Capacity temporarily exceeded"), 503), (BindingError("InferenceUpstreamError: 5000"), 502)],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", RUN])
@pytest.mark.parametrize("streamed", [False, True])
def test_a_failing_binding_is_502_or_503_json_with_retry_after(
    start_edge: Callable[..., EdgeServer], error: BindingError, status: int, path: str, streamed: bool
) -> None:
    server = start_edge(ai=ScriptedAI(fail=error, description=None), kv=None)
    response = httpx.post(server.url + path, json=chat_body(stream=streamed), timeout=30)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert int(response.headers["retry-after"]) > 0
    error_json = response.json()["error"]
    assert set(error_json) == {"message", "type", "param", "code", "request_id"}
    assert str(error) not in error_json["message"] and error_json["message"]  # the binding's own text stays in the log


@pytest.mark.parametrize("streamed", [False, True])
def test_falls_back_when_the_model_is_retired(start_edge: Callable[..., EdgeServer], tiny_runner: LlamaCppRunner, streamed: bool) -> None:
    ai = ScriptedAI(LlamaCppAI.for_config(Config(), tiny_runner), retired=frozenset({PRIMARY}))
    server = start_edge(ai=ai, kv=None)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        if streamed:
            _, _, events = stream(client, "/v1/chat/completions", chat_body(stream=True))
            assert {e["model"] for e in events[:-1]} == {FALLBACK} and events[-1] == "[DONE]"
        else:
            response = client.post("/v1/chat/completions", json=chat_body())
            assert response.status_code == 200
            assert response.json()["model"] == FALLBACK
            assert response.headers["x-edgellm-model"] == FALLBACK
            assert response.json()["usage"]["completion_tokens"] == 16
    assert ai.models == [PRIMARY, FALLBACK]
