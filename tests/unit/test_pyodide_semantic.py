"""The semantic cache on the Cloudflare path: the core over the Pyodide adapter's `WorkersAI`
(chat and bge) and `WorkersVectorize`, with only the bindings stood in: `env.AI` by a fake that
answers chat and embeds by bag of words (so a change of case or punctuation is the same vector),
`env.VECTORIZE` by `tests/support/fake_vectorize.py`, whose mutations apply only when the test
says Vectorize has processed them. The error bound is off (its own tests:
tests/unit/test_semantic_calibration.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
from typing import Any, Awaitable

import pytest

from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.http import Request
from edgellm_local.emulator.kv import SqliteKV
from tests.support import fake_pyodide as fp
from tests.support.fake_vectorize import FakeVectorize

BGE = "@cf/baai/bge-small-en-v1.5"
RERANKER = "@cf/baai/bge-reranker-base"
ON = {"x-edgellm-semantic-cache": "on"}


class FakeAI:
    """`env.AI`: chat answers name the question's hash; bge vectors count words into 384 buckets."""

    def __init__(self, rerank: float | None = None) -> None:
        self.chats, self.embeds, self.rerank, self.reranked = 0, 0, rerank, []

    async def run(self, model: str, inputs: Any, *options: Any) -> Any:
        if model == RERANKER:
            # Workers AI's contract (@cloudflare/workers-types, Ai_Cf_Baai_Bge_Reranker_Base_Input/_Output in
            # node_modules/workerd/worker.mjs; the runtime notes): a JS object in, {response: [{id, score}]} out
            assert isinstance(inputs, fp.JsObject), "the reranker's inputs must be a JS object"
            plain = fp.to_plain(inputs)
            assert set(plain) == {"query", "contexts"} and all(set(c) == {"text"} for c in plain["contexts"])
            self.reranked.append(plain)
            return fp.JsDict({"response": [{"id": 0, "score": self.rerank}]})
        inputs = fp.to_plain(inputs)
        if model == BGE:
            self.embeds += 1
            texts = inputs["text"]
            return fp.JsDict({"shape": [len(texts), 384], "data": [_bag(t) for t in texts]})
        self.chats += 1
        question = inputs["messages"][-1]["content"]
        return fp.JsDict({"response": f"answer {hashlib.sha256(question.encode()).hexdigest()[:6]}",
                          "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})


def _bag(text: str) -> list[float]:
    vector = [0.0] * 384
    for word in re.findall(r"[a-z0-9]+", text.lower()):
        vector[int(hashlib.sha256(word.encode()).hexdigest(), 16) % 384] += 1.0
    return vector


@pytest.fixture
def adapter():
    with fp.installed():
        from edgellm.runtime.pyodide_ai import WorkersAI
        from edgellm.runtime.pyodide_vectorize import WorkersVectorize

        yield WorkersAI, WorkersVectorize


class Background:
    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[Any]] = []

    def __call__(self, awaitable: Awaitable[Any]) -> None:
        self.tasks.append(asyncio.ensure_future(awaitable))

    async def settle(self) -> None:
        while self.tasks:
            await self.tasks.pop(0)


def chat(text: str) -> Request:
    body = {"messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 8}
    return Request("POST", "http://edge.test/v1/chat/completions", {"content-type": "application/json", **ON}, json.dumps(body).encode())


def deps(adapter: Any, ai: FakeAI, vectorize: FakeVectorize, background: Background, **config: Any) -> Deps:
    workers_ai, workers_vectorize = adapter
    return Deps(config=Config(open_access=True, embedding_models=(BGE,), semantic_max_error=None, **config), ai=workers_ai(ai), kv=SqliteKV(),
                vectors=workers_vectorize(vectorize), wait_until=background, log=logging.getLogger("edgellm.test"))


async def test_a_paraphrase_hits_once_vectorize_has_applied_the_upsert(adapter) -> None:
    ai, vectorize, background = FakeAI(), FakeVectorize(384), Background()
    bundle = deps(adapter, ai, vectorize, background)
    first = await handle(chat("What is the capital of France?"), bundle)
    assert first.headers["cf-aig-cache-status"] == "MISS"
    await background.settle()  # the exact entry is in KV; the vector's upsert is only queued
    assert vectorize.pending and not vectorize.vectors
    early = await handle(chat("what is the capital of france"), bundle)
    assert early.headers["cf-aig-cache-status"] == "MISS"  # Vectorize had not applied it: a miss, never an error
    await background.settle()
    vectorize.process()
    late = await handle(chat("What is the capital of France"), bundle)
    assert late.headers["cf-aig-cache-status"] == "HIT" and late.headers["x-edgellm-cache-match"] == "semantic; score=1.00"
    assert json.loads(late.body)["choices"][0]["message"] == json.loads(first.body)["choices"][0]["message"]
    assert ai.chats == 2
    query = vectorize.queries[-1]
    assert query["topK"] <= 20 and query["returnMetadata"] == "all" and set(query["filter"]) == {"context"}
    assert query["returnValues"] is True  # high-precision scoring
    assert len(query["namespace"].encode()) <= 64
    stored = next(iter(vectorize.vectors.values()))
    assert stored["namespace"] == query["namespace"] and len(stored["id"]) == 64
    assert {"context", "digest", "text", "threshold", "expires"} <= set(stored["metadata"])


async def test_a_failing_vectorize_leaves_an_ordinary_miss(adapter) -> None:
    ai, background = FakeAI(), Background()
    bundle = deps(adapter, ai, FakeVectorize(384, error="VECTOR_QUERY_ERROR: internal error"), background)
    response = await handle(chat("What is the capital of France?"), bundle)
    assert response.status == 200 and response.headers["cf-aig-cache-status"] == "MISS"
    await background.settle()
    again = await handle(chat("What is the capital of France?"), bundle)
    assert again.headers["cf-aig-cache-status"] == "HIT" and "x-edgellm-cache-match" not in again.headers  # the exact cache still works


async def test_scores_are_exact_cosines_not_the_indexs_approximation(adapter) -> None:
    from edgellm.ports import VectorRecord

    _, workers_vectorize = adapter
    vectorize = FakeVectorize(4)
    index = workers_vectorize(vectorize)
    await index.upsert([VectorRecord("a", (1.0, 0.0, 0.0, 0.0), "ns", {"context": "c"})])
    vectorize.process()
    query = [0.93, (1 - 0.93 ** 2) ** 0.5, 0.0, 0.0]  # a cosine of 0.93, which the approximate scoring rounds to 0.95
    [match] = await index.query(query, top_k=20, namespace="ns", filter={"context": "c"})
    assert match.score == pytest.approx(0.93, abs=1e-9)
    assert round(0.93 / 0.05) * 0.05 != pytest.approx(0.93, abs=1e-3)  # the stand-in's approximation would have moved it


@pytest.mark.parametrize(("score", "status"), [(0.9, "HIT"), (0.1, "MISS")])
async def test_the_reranker_verifies_a_candidate_through_the_ai_binding(adapter, score: float, status: str) -> None:
    ai, vectorize, background = FakeAI(rerank=score), FakeVectorize(384), Background()
    bundle = deps(adapter, ai, vectorize, background, semantic_verifier=RERANKER)
    await handle(chat("What is the capital of France?"), bundle)
    await background.settle()
    vectorize.process()
    again = await handle(chat("what is the capital of france"), bundle)
    assert again.headers["cf-aig-cache-status"] == status
    assert ai.reranked == [{"query": "what is the capital of france", "contexts": [{"text": "What is the capital of France?"}]}]


async def test_a_vectorize_binding_without_an_upstream_costs_no_embedding(adapter) -> None:
    # workerd, `wrangler dev` offline: every call throws (the runtime notes, "Seen in workerd (2026-12-06)")
    ai, background = FakeAI(), Background()
    vectorize = FakeVectorize(384, error="Error: Binding VECTORIZE needs to be run remotely")
    bundle = deps(adapter, ai, vectorize, background)
    for text in ("What is the capital of France?", "what is the capital of france?"):
        response = await handle(chat(text), bundle)
        assert response.status == 200 and response.headers["cf-aig-cache-status"] == "MISS"
    await background.settle()
    assert ai.embeds == 0 and bundle.state.semantic.unavailable and bundle.state.semantic.skipped == 2
