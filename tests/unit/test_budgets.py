"""A key's token budget at admission: a request is admitted only when what it may cost fits what
is left, on every route that spends tokens. A generation asking for more than is left is cut to
it (its `max_tokens` lowered: a shorter answer, `finish_reason: length`); an embedding cannot be
cut, so it is refused 429 `insufficient_quota` before the binding is called. And a stream cut
before its end is charged the prompt the model counted when the model said it."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import pytest

from edgellm.access.keys import KeyRing, NewKey, new_key
from edgellm.app import handle
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.http import Request
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.kv import SqliteKV

BGE = "@cf/baai/bge-small-en-v1.5"
MODEL = Config().model
RUN = f"/client/v4/accounts/acc/ai/run/{MODEL}"


@dataclass
class EmbeddingAI(ScriptedAI):
    """The AI binding seam with an embedding model: one small vector per text, and usage counted
    as a WordPiece tokenizer would (a token per word, plus two)."""

    embedded: int = 0

    async def embed(self, model: str, texts: list[str]) -> dict[str, Any]:
        self.embedded += 1
        return {"data": [[float(len(t)), 1.0, 0.0] for t in texts],
                "usage": {"prompt_tokens": sum(len(t.split()) + 2 for t in texts)}}


async def keyed(clock: Any, ai: ScriptedAI, **limits: Any) -> tuple[Deps, NewKey]:
    deps = Deps(config=Config(embedding_models=(BGE,)), ai=ai, kv=SqliteKV(clock=clock), clock=clock, log=logging.getLogger("edgellm.test"))
    made = new_key("acme", clock.now(), requests_per_minute=0, **limits)
    await KeyRing(deps.kv).put(made.record)  # type: ignore[arg-type]
    return deps, made


def call(made: NewKey, path: str, body: Any) -> Request:
    return Request("POST", f"http://edge.test{path}", {"content-type": "application/json", "authorization": f"Bearer {made.api_key}",
                                                       "cf-aig-skip-cache": "true"}, json.dumps(body).encode())


LONG = "word " * 300  # 1,500 characters: a reservation of ~500 tokens per text
ASK = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("path, body, admitted, max_tokens", [
    # embeddings cannot be cut: one that may cost more than is left is refused before the binding
    ("/v1/embeddings", {"model": BGE, "input": [LONG] * 100}, False, None),  # up to 50,200 tokens of a 300 budget
    ("/v1/embeddings", {"model": BGE, "input": LONG}, False, None),  # 502 > 300
    (f"/client/v4/accounts/acc/ai/run/{BGE}", {"text": [LONG, LONG]}, False, None),
    ("/v1/embeddings", {"model": BGE, "input": "a short text"}, True, None),
    # a generation is cut to what is left after its prompt (estimated 17 for "hi"): 300 - 17
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 1000}, True, 283),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 1000, "stream": True}, True, 283),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 1000}, True, 291),
    (RUN, {"prompt": "hi", "max_tokens": 1000}, True, 291),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 1000}, True, 283),
    ("/v1/chat/completions", {"messages": ASK, "max_tokens": 30}, True, 30),  # fits: untouched
    # a prompt that alone may cost more than is left is refused
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 1000}], "max_tokens": 10}, False, None),
])
async def test_a_request_is_admitted_only_within_what_is_left_of_its_budget(
        clock, path: str, body: dict[str, Any], admitted: bool, max_tokens: int | None) -> None:
    ai = EmbeddingAI()
    deps, made = await keyed(clock, ai, token_budget=300)
    response = await handle(call(made, path, body), deps)
    if response.is_streaming:
        [chunk async for chunk in response.body]  # type: ignore[union-attr]
    if not admitted:
        assert response.status == 429, response.body
        assert json.loads(response.body)["error"]["code"] == "insufficient_quota"
        assert ai.embedded == 0 and ai.called == 0
        assert not deps.state.access.reserved and not deps.state.access.spent.get(made.record.key_id)
        return
    assert response.status == 200, response.body
    if max_tokens is not None:
        assert [inputs.get("max_tokens") for _, inputs in ai.calls] == [max_tokens]
    assert not deps.state.access.reserved
    assert deps.state.access.spent[made.record.key_id] <= 300


async def test_with_part_of_the_budget_spent_the_next_request_gets_what_is_left() -> None:
    """Spent and reserved tokens count: what is left is the budget less both."""
    from tests.conftest import ManualClock

    clock = ManualClock()
    ai = EmbeddingAI()
    deps, made = await keyed(clock, ai, token_budget=300)
    deps.state.access.spent[made.record.key_id] = 200
    deps.state.access.reserved[made.record.key_id] = 50  # another request of the key, in progress
    response = await handle(call(made, "/v1/chat/completions", {"messages": ASK, "max_tokens": 1000}), deps)
    assert response.status == 200 and ai.calls[-1][1]["max_tokens"] == 300 - 200 - 50 - 17
    refused = await handle(call(made, "/v1/embeddings", {"model": BGE, "input": "one two three " * 20}), deps)
    assert refused.status == 429 and ai.embedded == 0


async def test_a_stream_left_early_is_charged_the_prompt_the_model_counted(clock) -> None:
    """The local binding reports its prompt's tokens with the first token; a client that leaves
    before the final usage event is charged that count, not the admission's estimate (17 for "hi")."""
    events = ({"response": "Hel", "usage": {"prompt_tokens": 52}}, {"response": "lo"}, {"response": " there"},
              {"response": "", "usage": {"prompt_tokens": 52, "completion_tokens": 3}})
    ai = ScriptedAI(events=events)
    deps, made = await keyed(clock, ai, token_budget=10_000)
    response = await handle(call(made, "/v1/chat/completions", {"messages": ASK, "stream": True}), deps)
    assert response.status == 200
    for _ in range(3):  # the role chunk, then two tokens
        await anext(response.body)  # type: ignore[arg-type]
    await response.body.aclose()  # type: ignore[union-attr]
    assert deps.state.access.spent[made.record.key_id] == 52 + 2
