"""Embeddings in the core, at the app's seam with the AI binding double: a binding answer that is
not one vector of numbers per text is a 502 (a failing dependency, never a bare 500), the exact
cache's HITs, MISSes and bypasses are counted with chat's, and the reservation is cautious and
bounded."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import pytest

from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.embeddings import EmbeddingRequest, estimated_tokens, input_tokens, reserved_tokens
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.kv import SqliteKV
from tests.unit.test_app import post

BGE = "@cf/baai/bge-small-en-v1.5"


@dataclass
class Answering(ScriptedAI):
    """An embedding binding answering `answer(texts)`; `embedded` counts its calls."""

    answer: Any = None
    embedded: int = 0

    async def embed(self, model: str, texts: list[str]) -> dict[str, Any]:
        self.embedded += 1
        return self.answer(texts) if self.answer is not None else {"data": [[0.5, float(len(t)), 1.0] for t in texts]}


def deps_with(ai: ScriptedAI, clock: Any, kv: bool = False) -> tuple[Deps, list[Any]]:
    background: list[Any] = []
    deps = Deps(config=Config(open_access=True, embedding_models=(BGE,)), ai=ai, kv=SqliteKV(clock=clock) if kv else None, clock=clock,
                log=logging.getLogger("edgellm.test"), wait_until=background.append)
    return deps, background


@pytest.mark.parametrize("answer", [
    pytest.param(lambda texts: {"data": [[0.1, 0.2]]}, id="one-vector-for-two-texts"),
    pytest.param(lambda texts: {"data": [[0.1, 0.2]] * 3}, id="three-vectors-for-two-texts"),
    pytest.param(lambda texts: {"data": None}, id="no-vectors"),
    pytest.param(lambda texts: {}, id="no-data"),
    pytest.param(lambda texts: {"data": [[0.1, "x"], [0.2, 0.3]]}, id="a-value-not-a-number"),
    pytest.param(lambda texts: {"data": [0.1, 0.2]}, id="numbers-not-vectors"),
    pytest.param(lambda texts: {"data": [[0.1, 0.2], [0.3]]}, id="vectors-of-two-widths"),
    pytest.param(lambda texts: {"data": [[], []]}, id="empty-vectors"),
    pytest.param(lambda texts: ["not", "an", "object"], id="not-an-object"),
])
@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", {"model": BGE, "input": ["first text", "second text"]}),
    (f"/client/v4/accounts/acc/ai/run/{BGE}", {"text": ["first text", "second text"]}),
])
async def test_a_bad_answer_from_the_binding_is_a_502_with_retry_after(clock, answer: Any, path: str, body: dict[str, Any]) -> None:
    deps, background = deps_with(Answering(answer=answer), clock, kv=True)
    response = await handle(post(path, body), deps)
    assert response.status == 502, response.body
    assert "retry-after" in response.headers
    error = json.loads(response.body)
    error = error["error"] if "error" in error else error["errors"][0]
    assert "Traceback" not in json.dumps(error)
    assert not background  # nothing stored


async def test_embedding_cache_hits_misses_and_bypasses_are_counted_with_chats(clock) -> None:
    deps, background = deps_with(Answering(), clock, kv=True)
    body = {"model": BGE, "input": "Counted like a chat answer."}
    miss = await handle(post("/v1/embeddings", body), deps)
    while background:
        await background.pop()
    hit = await handle(post("/v1/embeddings", body), deps)
    bypass = await handle(post("/v1/embeddings", body, {"cf-aig-skip-cache": "true"}), deps)
    assert [r.headers["cf-aig-cache-status"] for r in (miss, hit, bypass)] == ["MISS", "HIT", "BYPASS"]
    counters = deps.state.cache
    assert (counters.misses, counters.hits, counters.bypasses) == (1, 1, 1)
    assert counters.bytes_served > 0
    chat = await handle(post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}), deps)
    assert chat.headers["cf-aig-cache-status"] == "MISS" and counters.misses == 2  # the same counters as chat's
    while background:
        await background.pop()


def test_the_reservation_is_cautious_and_bounded_by_what_the_model_reads() -> None:
    """At least the answer's own estimate (a WordPiece token per word or mark, plus two) for any
    text, never more than the model's input tokens per text: 100 texts of 100,000 characters
    reserve 100 x 512, not 3 million."""
    texts = ("Hello, world!", "a b c d e f g", "x" * 40, "naïve café, résumé.")
    for text in texts:
        assert reserved_tokens(EmbeddingRequest(BGE, (text,))) >= estimated_tokens((text,)) > 0
    assert reserved_tokens(EmbeddingRequest(BGE, texts)) == sum(reserved_tokens(EmbeddingRequest(BGE, (t,))) for t in texts)
    huge = EmbeddingRequest(BGE, ("word " * 20_000,) * 100)
    assert reserved_tokens(huge) == 100 * input_tokens(BGE) == 51_200
