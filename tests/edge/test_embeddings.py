"""`/v1/embeddings` and Workers AI's bge route through the local edge, over the real
all-MiniLM-L6-v2 (converted to GGUF from its PyPI package) in llama.cpp: the clients people use
(the openai client, float and base64; LangChain's OpenAIEmbeddings; the cloudflare SDK's
`ai.run`) unchanged, the exact cache keeping vectors, and every wrong request a 4xx naming its
field."""

from __future__ import annotations

import math
from typing import Any, Callable

import httpx
import pytest

from edgellm.config import Config
from edgellm.deps import Deps
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.llama.embedding_runner import EmbeddingRunner
from tests.support.minilm import BGE, minilm_runner  # noqa: F401 (a fixture)


@pytest.fixture
def embedding_edge(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], minilm_runner: EmbeddingRunner) -> EdgeServer:
    deps = make_deps(Config(open_access=True, embedding_models=(BGE,)))
    deps.ai.embedders = {BGE: minilm_runner}  # type: ignore[attr-defined]
    return start_edge(deps)


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def post(edge: EdgeServer, body: dict[str, Any], path: str = "/v1/embeddings", **headers: str) -> httpx.Response:
    return httpx.post(edge.url + path, json=body, headers=headers, timeout=60)


def test_openai_client_float_and_base64_agree(embedding_edge: EdgeServer) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=embedding_edge.url + "/v1", api_key="unused", max_retries=0)
    texts = ["What is the capital of France?", "what's the capital city of france", "How do I bake bread?"]
    floats = client.embeddings.create(model=BGE, input=texts, encoding_format="float")
    packed = client.embeddings.create(model=BGE, input=texts)  # the client's default: base64, decoded by it
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert all(len(d.embedding) == 384 for d in floats.data)
    for f, b in zip(floats.data, packed.data):
        assert max(abs(x - y) for x, y in zip(f.embedding, b.embedding)) < 1e-6  # float32 on the wire
    assert floats.usage.prompt_tokens > len(texts) * 2  # llama.cpp's own count, [CLS] and [SEP] included
    vectors = [d.embedding for d in floats.data]
    # what an embedding is for: the paraphrase is nearer than the other question
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.3


def test_same_text_same_vector_and_the_exact_cache_keeps_it(embedding_edge: EdgeServer) -> None:
    body = {"model": BGE, "input": "Embeddings are deterministic.", "encoding_format": "float"}
    first, second = post(embedding_edge, body), post(embedding_edge, body)
    assert first.headers["cf-aig-cache-status"] == "MISS"
    assert second.headers["cf-aig-cache-status"] == "HIT"
    assert first.json()["data"] == second.json()["data"]
    assert first.json()["usage"] == second.json()["usage"]
    skipped = post(embedding_edge, body, **{"cf-aig-skip-cache": "true"})
    assert skipped.headers["cf-aig-cache-status"] == "BYPASS"
    assert max(abs(x - y) for x, y in zip(skipped.json()["data"][0]["embedding"], first.json()["data"][0]["embedding"])) < 1e-6


def test_langchain_openai_embeddings(embedding_edge: EdgeServer) -> None:
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: LangChain would otherwise send OpenAI's tiktoken ids, which are no bge tokens
    embeddings = OpenAIEmbeddings(model=BGE, base_url=embedding_edge.url + "/v1", api_key="unused",
                                  check_embedding_ctx_length=False, max_retries=0)
    documents = embeddings.embed_documents(["The cat sat on the mat.", "Stock markets fell sharply today."])
    query = embeddings.embed_query("Where did the cat sit?")
    assert len(documents) == 2 and all(len(v) == 384 for v in documents) and len(query) == 384
    assert cosine(query, documents[0]) > cosine(query, documents[1])


def test_cloudflare_sdk_ai_run_with_the_bge_id(embedding_edge: EdgeServer) -> None:
    from cloudflare import Cloudflare

    client = Cloudflare(api_token="unused", base_url=embedding_edge.url + "/client/v4", max_retries=0)
    result = client.ai.run(BGE, account_id="local", text=["hello world", "goodbye world"])
    assert result["shape"] == [2, 384]  # type: ignore[index]
    assert len(result["data"]) == 2 and all(len(row) == 384 for row in result["data"])  # type: ignore[index]
    one = post(embedding_edge, {"text": "hello world"}, f"/client/v4/accounts/local/ai/run/{BGE}").json()
    assert one["success"] is True and one["result"]["shape"] == [1, 384]
    assert cosine(one["result"]["data"][0], result["data"][0]) > 0.9999  # type: ignore[index]


def test_models_lists_the_embedding_model_with_its_kind_and_dimension(embedding_edge: EdgeServer, minilm_runner: EmbeddingRunner) -> None:
    models = {m["id"]: m for m in httpx.get(embedding_edge.url + "/v1/models").json()["data"]}
    entry = models[BGE]["edgellm"]
    assert entry["kind"] == "embedding" and entry["dimensions"] == 384
    assert entry["gguf_name"] == minilm_runner.path.name  # the stand-in says what answers for bge
    assert httpx.get(embedding_edge.url + f"/v1/models/{BGE}").json()["edgellm"]["dimensions"] == 384


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"model": BGE, "input": ""}, "input", "empty_input"),
    ({"model": BGE, "input": []}, "input", "empty_input"),
    ({"model": BGE, "input": ["fine", "   "]}, "input[1]", "empty_input"),
    ({"model": BGE}, "input", "missing_input"),
    ({"model": BGE, "input": [1, 2, 3]}, "input", "unsupported_input"),
    ({"model": BGE, "input": {"text": "x"}}, "input", "invalid_type"),
    ({"model": BGE, "input": ["x"] * 101}, "input", "too_many_inputs"),
    ({"model": BGE, "input": "x", "dimensions": 256}, "dimensions", "unsupported_dimensions"),
    ({"model": BGE, "input": "x", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
    ({"model": "@cf/meta/llama-2-7b-chat-int8", "input": "x"}, "model", "model_not_embedding"),
    ({"model": BGE, "input": "word " * 600}, "input", "invalid_input"),  # past the model's 512 tokens, counted by llama.cpp
])
def test_bad_requests_are_400s_naming_the_field(embedding_edge: EdgeServer, body: dict[str, Any], param: str, code: str) -> None:
    response = post(embedding_edge, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, code, "invalid_request_error")


def test_native_dimensions_are_accepted(embedding_edge: EdgeServer) -> None:
    response = post(embedding_edge, {"model": BGE, "input": "x", "dimensions": 384})
    assert response.status_code == 200 and len(response.json()["data"][0]["embedding"]) == 384


def test_an_embedding_model_asked_to_chat_is_a_400(embedding_edge: EdgeServer) -> None:
    response = post(embedding_edge, {"model": BGE, "messages": [{"role": "user", "content": "hi"}]}, "/v1/chat/completions")
    assert response.status_code == 400
    assert (response.json()["error"]["param"], response.json()["error"]["code"]) == ("model", "model_not_chat")


def test_workers_ai_shape_errors_name_text(embedding_edge: EdgeServer) -> None:
    path = f"/client/v4/accounts/local/ai/run/{BGE}"
    missing = post(embedding_edge, {"prompt": "x"}, path)
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "text"
    assert missing.json()["success"] is False  # Cloudflare's envelope on its route
    empty = post(embedding_edge, {"text": [""]}, path)
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "text[0]"


def test_unknown_embedding_model_is_a_404(embedding_edge: EdgeServer) -> None:
    response = post(embedding_edge, {"model": "@cf/baai/bge-nope", "input": "x"})
    assert response.status_code == 404 and response.json()["error"]["param"] == "model"


def test_a_key_limited_to_other_models_is_refused_embeddings(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps],
                                                              minilm_runner: EmbeddingRunner) -> None:
    import asyncio

    from edgellm.access.keys import KeyRing, new_key

    deps = make_deps(Config(embedding_models=(BGE,)))
    deps.ai.embedders = {BGE: minilm_runner}  # type: ignore[attr-defined]
    limited, allowed = new_key("acme", 0, models=("@cf/meta/llama-2-7b-chat-int8",)), new_key("acme", 0, models=(BGE,))
    for made in (limited, allowed):
        asyncio.run(KeyRing(deps.kv).put(made.record))
    edge = start_edge(deps)
    refused = post(edge, {"model": BGE, "input": "x"}, authorization=f"Bearer {limited.api_key}")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "model_not_allowed"
    assert post(edge, {"model": BGE, "input": "x"}, authorization=f"Bearer {allowed.api_key}").status_code == 200
    assert post(edge, {"model": BGE, "input": "x"}).status_code == 401  # keys mode: no key, no vectors


def test_embeddings_spend_the_keys_tokens_and_are_recorded_in_usage_and_metrics(
        start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps], minilm_runner: EmbeddingRunner, tmp_path: Any) -> None:
    """A key's token budget and per-minute window hold for embeddings as for chat: the input tokens
    are the cost, reserved at admission and settled at the answer; a HIT is charged none. The usage
    row, the token counters and the latency histogram say the embedding model; no time to a first
    token is made up for an answer that generates none."""
    import asyncio

    from prometheus_client.parser import text_string_to_metric_families

    from edgellm.access.keys import KeyRing, new_key
    from edgellm.embeddings import EmbeddingRequest, reserved_tokens
    from edgellm_local.emulator.usage_sqlite import SqliteUsage

    deps = make_deps(Config(embedding_models=(BGE,), admin_token="admin", metrics_open=True), usage=SqliteUsage(tmp_path / "usage.sqlite3"))
    deps.ai.embedders = {BGE: minilm_runner}  # type: ignore[attr-defined]
    first_text = "The first text to embed, long enough to spend the budget."
    budget = reserved_tokens(EmbeddingRequest(BGE, (first_text,)))  # the first request fits it exactly
    budgeted, windowed = new_key("acme", 0, token_budget=budget), new_key("bravo", 0, tokens_per_minute=1000)
    for made in (budgeted, windowed):
        asyncio.run(KeyRing(deps.kv).put(made.record))
    edge = start_edge(deps)

    def as_key(made: Any, text: str) -> httpx.Response:
        return post(edge, {"model": BGE, "input": text}, authorization=f"Bearer {made.api_key}")

    first = as_key(budgeted, first_text)
    assert first.status_code == 200 and first.headers["cf-aig-cache-status"] == "MISS"
    spent = first.json()["usage"]["prompt_tokens"]
    assert 0 < spent <= budget  # llama.cpp's own count, within the cautious reservation
    edge.drain()
    refused = as_key(budgeted, "Another text, too long for what is left of the budget.")  # admitted only if it fits what is left
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"

    missed = as_key(windowed, "Counted in the window.")
    hit = as_key(windowed, "Counted in the window.")
    assert (missed.headers["cf-aig-cache-status"], hit.headers["cf-aig-cache-status"]) == ("MISS", "HIT")
    tokens = missed.json()["usage"]["prompt_tokens"]
    assert int(hit.headers["x-ratelimit-remaining-tokens"]) == 1000 - tokens  # the HIT charged nothing
    edge.drain()

    admin = {"authorization": "Bearer admin"}
    report = httpx.get(edge.url + "/admin/usage", params={"group_by": "tenant,model"}, headers=admin, timeout=30).json()
    rows = {(row["tenant"], row["model"]): row for row in report["data"]}
    assert rows[("acme", BGE)]["prompt_tokens"] == spent and rows[("acme", BGE)]["completion_tokens"] == 0
    assert rows[("bravo", BGE)]["prompt_tokens"] == tokens and rows[("bravo", BGE)]["hits"] == 1

    families = {f.name: f for f in text_string_to_metric_families(httpx.get(edge.url + "/metrics", timeout=30).text)}

    def value(family: str, sample: str, **labels: str) -> float:
        return sum(s.value for s in families[family].samples if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))

    assert value("edgellm_prompt_tokens", "edgellm_prompt_tokens_total", model=BGE, tenant="acme") == spent
    assert value("edgellm_prompt_tokens", "edgellm_prompt_tokens_total", model=BGE, tenant="bravo") == tokens
    latency, ttft = "edgellm_e2e_request_latency_seconds", "edgellm_time_to_first_token_seconds"
    assert value(latency, latency + "_count", model=BGE) == 3  # the 429 was refused before any model served it
    assert value(ttft, ttft + "_count", model=BGE) == 0
