"""Which of Vectorize's matches may answer (`cache.semantic.candidates`): the base cosine, each
entry's learned threshold (a refusal ends the search), the guard (a refusal skips), expiry."""

from __future__ import annotations

from typing import Any

from edgellm.cache.semantic import BASE_THRESHOLD, MARGIN, candidates, context_digest, learned_threshold
from edgellm.generation import GenerationRequest
from edgellm.ports import VectorMatch

NOW = 1_000.0


def match(id: str, score: float, text: str, threshold: float = BASE_THRESHOLD, expires: float = NOW + 60) -> VectorMatch:
    return VectorMatch(id, score, {"text": text, "threshold": threshold, "digest": id * 8, "expires": expires})


def ids(found: list[VectorMatch]) -> list[str]:
    return [m.id for m in found]


def test_a_nearer_entry_that_refuses_ends_the_search() -> None:
    stricter = match("a", BASE_THRESHOLD + 0.02, "What is the capital of France?", threshold=BASE_THRESHOLD + 0.03)
    laxer = match("b", BASE_THRESHOLD + 0.01, "what's the capital of France")
    assert ids(candidates("capital of France?", [stricter, laxer], NOW)) == []


def test_the_guard_skips_to_a_farther_entry_that_agrees() -> None:
    other_city = match("a", BASE_THRESHOLD + 0.03, "What is the capital of Germany?")
    same_city = match("b", BASE_THRESHOLD + 0.01, "Tell me France's capital")
    assert ids(candidates("What is the capital of France?", [other_city, same_city], NOW)) == ["b"]
    assert ids(candidates("What is the capital of France?", [other_city, same_city], NOW, guard=False)) == ["a", "b"]


def test_below_the_base_expired_or_malformed_never_answer() -> None:
    text = "What is the capital of France?"
    assert ids(candidates(text, [match("a", BASE_THRESHOLD - 0.01, text)], NOW)) == []
    assert ids(candidates(text, [match("a", 0.99, text, expires=NOW)], NOW)) == []
    broken: list[Any] = [VectorMatch("a", 0.99, {"text": text, "threshold": "x", "digest": "d", "expires": NOW + 60}),
                         VectorMatch("b", 0.99, {"threshold": 0.8, "digest": "d", "expires": NOW + 60})]
    assert ids(candidates(text, broken, NOW)) == []


def test_a_learned_threshold_sits_above_the_nearest_other_entry() -> None:
    assert learned_threshold(0.0) == BASE_THRESHOLD
    assert learned_threshold(BASE_THRESHOLD + 0.01) == BASE_THRESHOLD + 0.01 + MARGIN
    assert learned_threshold(1.0) < 1.0  # an entry can always be hit by its own text


def test_the_context_is_everything_but_the_last_user_text() -> None:
    def request(system: str, text: str, **params: Any) -> GenerationRequest:
        return GenerationRequest("@cf/m", {"messages": [{"role": "system", "content": system}, {"role": "user", "content": text}],
                                           "temperature": 0, "max_tokens": 8, **params})

    assert context_digest(request("Be brief.", "capital of France?")) == context_digest(request("Be brief.", "France's capital"))
    assert context_digest(request("Be brief.", "x")) != context_digest(request("Be long.", "x"))
    assert context_digest(request("Be brief.", "x")) != context_digest(request("Be brief.", "x", top_k=5))


def test_a_text_the_guard_cannot_read_needs_a_stricter_cosine() -> None:
    from edgellm.cache.semantic_guard import STRICT_COSINE

    unreadable = "🙂🙂🙂?"
    assert ids(candidates(unreadable, [match("a", STRICT_COSINE - 0.01, "🙂🙂?")], NOW)) == []
    assert ids(candidates(unreadable, [match("a", STRICT_COSINE - 0.01, "eggs?")], NOW)) == []  # the guard alone lets one word by
    assert ids(candidates(unreadable, [match("a", STRICT_COSINE, "🙂🙂?")], NOW)) == ["a"]
    assert ids(candidates("What is it?", [match("a", STRICT_COSINE - 0.01, "🙂")], NOW)) == []  # the cached one unreadable
