"""The semantic cache's second check (`cache.semantic_guard`): paraphrases agree, near misses
(another number, name or polarity) do not, whatever their cosine."""

from __future__ import annotations

import pytest

from edgellm.cache.semantic_guard import disagreement, facts


@pytest.mark.parametrize(("a", "b"), [
    ("What is the capital of France?", "what is the capital of france"),
    ("What is the capital of France?", "Tell me France's capital."),
    ("How many legs does a spider have?", "How many legs do spiders have?"),
    ("Convert 100 dollars to euros", "convert 100 USD into euros please".replace("USD", "dollars")),
    ("Is it safe to swim after eating?", "Can I safely swim right after I eat?"),
    ("Who wrote Hamlet?", "Hamlet was written by whom?"),
    ("How do I unpack a tarball?", "how to unpack a tarball"),
    ("Explain how universities are ranked", "how are universities ranked? explain"),
    ("Give me 3 tips for sleeping better", "Give me three tips to sleep better"),
    ("Summarise GPT-4's paper", "summarise the GPT-4 paper"),
])
def test_paraphrases_agree(a: str, b: str) -> None:
    assert disagreement(a, b) is None and disagreement(b, a) is None


@pytest.mark.parametrize(("a", "b", "why"), [
    ("What is the capital of France?", "What is the capital of Germany?", "entities"),
    ("Who wrote Emma?", "Who wrote Dracula?", "entities"),
    ("What is 2 + 2?", "What is 2 + 3?", "numbers"),
    ("Convert 100 dollars to euros", "Convert 1,000 dollars to euros", "numbers"),
    ("Give me 3 tips", "Give me four tips", "numbers"),
    ("Is coffee bad for you?", "Is coffee not bad for you?", "negation"),
    ("Can I take ibuprofen with food?", "Can't I take ibuprofen with food?", "negation"),
    ("Is it ok to swim after eating?", "Is it unsafe to swim after eating?", "negation"),
    ("Is this paint toxic?", "Is this paint non-toxic?", "negation"),
    ("Flights from NYC to Paris", "Flights from LAX to Paris", "entities"),
    ("Explain GPT-4", "Explain GPT-3", "numbers"),
])
def test_near_misses_disagree(a: str, b: str, why: str) -> None:
    assert disagreement(a, b) == why and disagreement(b, a) == why


def test_a_sentence_start_is_no_entity_but_still_a_word() -> None:
    found = facts("Paris is lovely. Is Lyon too?")
    assert "lyon" in found.entities and "paris" not in found.entities and "paris" in found.words
    assert facts("1,000 people and twelve cats").numbers == ("1000", "12")
