"""The verifier before a semantic candidate is served (`cache.verifier`, through
`cache.semantic.lookup`), with scripted verdicts at the AI binding's seam (`ScriptedReranker`):
its contract, a refusal that moves on to one more candidate and no further, a failure that is
no hit, and its time counted."""

from __future__ import annotations

import math
from typing import Any

import pytest

from edgellm.cache import semantic
from edgellm.cache.verifier import RERANKER, VerifierError, reranker_score
from edgellm.config import Config
from edgellm_local.doubles.verifier import ScriptedReranker
from tests.unit.test_semantic_lookup import key_of, look, make, remember, unit

FIRST, SECOND, THIRD = "How do I reset my router?", "how do I reset my router", "how do i reset my router!!"
QUERY = "How do I reset my router, please?"


@pytest.mark.parametrize(("answer", "score"), [
    ({"response": [{"id": 0, "score": 0.93}]}, 0.93),
    ({"response": [{"id": 0, "score": -2.5}]}, -2.5),  # a raw logit is a score too
    ({"response": [{"id": 1, "score": 0.1}, {"id": 0, "score": 0.05}]}, 0.05),
])
def test_the_reranker_answer_is_read_by_its_contract(answer: Any, score: float) -> None:
    assert reranker_score(answer) == score


@pytest.mark.parametrize("answer", [{}, {"response": None}, {"response": [{"id": 1, "score": 0.9}]},
                                    {"response": [{"id": 0, "score": math.nan}]}, {"response": [{"id": 0, "score": "0.9"}]},
                                    {"response": [{"id": 0, "score": True}]}, "0.9"])
def test_an_answer_outside_the_contract_is_an_error(answer: Any) -> None:
    with pytest.raises(VerifierError):
        reranker_score(answer)


def verified(scores: dict[tuple[str, str], float], **kw: Any) -> tuple[Any, Any, ScriptedReranker]:
    vectors = {FIRST: unit(0.0), SECOND: unit(0.01), THIRD: unit(0.02), QUERY: unit(0.0)}
    deps, background, embedder = make(vectors)
    reranker = ScriptedReranker(embedder, scores, **kw)
    object.__setattr__(deps, "ai", reranker)
    object.__setattr__(deps, "config", Config(open_access=True, embedding_models=deps.config.embedding_models,
                                              semantic_max_error=None, semantic_verifier=RERANKER))
    return deps, background, reranker


async def seed(deps: Any) -> None:
    for text in (FIRST, SECOND, THIRD):
        await remember(deps, text)


async def test_an_accepted_candidate_is_served() -> None:
    deps, _, reranker = verified({(QUERY, FIRST): 0.9})
    await seed(deps)
    hit = await look(deps, QUERY)
    assert isinstance(hit, semantic.Hit) and hit.generation.cache_key == key_of(FIRST).digest
    assert reranker.asked == [(QUERY, FIRST)]  # the new question as the query, the cached one as the context
    assert deps.state.semantic.verifications == 1 and deps.state.semantic.verifier_seconds > 0


async def test_a_refusal_moves_on_to_one_more_candidate_and_no_further() -> None:
    deps, _, reranker = verified({(QUERY, SECOND): 0.9})
    await seed(deps)
    hit = await look(deps, QUERY)
    assert isinstance(hit, semantic.Hit) and hit.generation.cache_key == key_of(SECOND).digest
    assert reranker.asked == [(QUERY, FIRST), (QUERY, SECOND)]
    deps, _, reranker = verified({(QUERY, THIRD): 0.9})
    await seed(deps)
    assert not isinstance(await look(deps, QUERY), semantic.Hit)
    assert reranker.asked == [(QUERY, FIRST), (QUERY, SECOND)]  # the third is never asked about
    assert deps.state.semantic.verifier_refusals == 2
    from prometheus_client.parser import text_string_to_metric_families

    from edgellm.telemetry.exposition import TextExposition, families

    found = {f.name: f for f in text_string_to_metric_families(TextExposition().render(families(deps))[0].decode())}
    outcomes = {s.labels["outcome"]: s.value for s in found["edgellm_cache_semantic_verifications"].samples}
    assert outcomes == {"accepted": 0.0, "refused": 2.0, "failed": 0.0}


async def test_a_failing_verifier_serves_nothing() -> None:
    deps, _, reranker = verified({}, default=0.99, fail=True)
    await seed(deps)
    assert not isinstance(await look(deps, QUERY), semantic.Hit)
    assert deps.state.semantic.verifier_failures == 1


def test_the_verifier_is_configured() -> None:
    assert Config().semantic_verifier is None
    assert Config.from_env({"SEMANTIC_VERIFIER": "off"}).semantic_verifier is None
    assert Config.from_env({"SEMANTIC_VERIFIER": RERANKER}).semantic_verifier == RERANKER
    assert Config.from_env({"SEMANTIC_VERIFIER_THRESHOLD": "-1.5"}).semantic_verifier_threshold == -1.5
    with pytest.raises(ValueError, match="SEMANTIC_VERIFIER_THRESHOLD"):
        Config.from_env({"SEMANTIC_VERIFIER_THRESHOLD": "nan"})
