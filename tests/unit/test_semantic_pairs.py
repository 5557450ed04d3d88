"""The semantic benchmark's labelled set (`bench.semantic_pairs`): several hundred pairs, the
same every run, every label consistent with the meanings it was made from."""

from __future__ import annotations

from collections import Counter

from bench.semantic_pairs import generate


def test_the_set_is_large_deterministic_and_consistently_labelled() -> None:
    pairs = generate()
    assert pairs == generate()  # seeded: every run measures the same set
    kinds = Counter(p.kind for p in pairs)
    assert kinds["paraphrase"] >= 300 and kinds["entity"] + kinds["number"] + kinds["negation"] >= 300
    assert min(kinds["number"], kinds["negation"]) > 0
    for pair in pairs:
        assert pair.positive == (pair.seed_meaning == pair.query_meaning) == (pair.kind == "paraphrase")
        assert pair.seed.lower() != pair.query.lower() or pair.positive
