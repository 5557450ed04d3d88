"""The semantic cache's second check (`cache.semantic_guard`): paraphrases agree, near misses
(another number, name or polarity) do not, whatever their cosine."""

from __future__ import annotations

import pytest

from edgellm.cache.semantic_guard import disagreement, facts, readable


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
    ("What is the capital of France?", "Tell me the capital city of France."),
    ("How do I reset my router?", "how can I reset my router"),
    ("What's the population of Paris?", "Tell me the population of Paris, please"),
    ("東京の人口は？", "東京の人口は"),  # a script without spaces
    ("Какая столица Франции?", "какая столица франции"),
    ("Convert 10 miles to kilometers", "convert 10 miles into kilometers please"),
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


# The near misses a sentence embedding scores high (0.82-0.99 with all-MiniLM-L6-v2 / bge-small),
# each of which the guard must refuse, whichever text is cached.
@pytest.mark.parametrize(("a", "b", "why"), [
    ("How many legs does a cat have?", "How many legs does a dog have?", "content"),
    ("Convert 10 miles to kilometers", "Convert 10 kilometers to miles", "numbers"),
    ("How do I convert miles to kilometers?", "How do I convert kilometers to miles?", "order"),
    ("How many km is 5 miles?", "How many miles is 5 km?", "numbers"),
    ("What is 12 + 7?", "What is 12 - 7?", "content"),
    ("What is the maximum dose of ibuprofen?", "What is the minimum dose of ibuprofen?", "content"),
    ("What is 3 plus 4?", "What is 3 minus 4?", "content"),
    ("Is it safe to mix bleach and vinegar?", "Is it dangerous to mix bleach and vinegar?", "content"),
    ("Is it safe to eat raw chicken?", "Is it safe to eat cooked chicken?", "content"),
    ("What is the dose of paracetamol for an adult?", "What is the dose of paracetamol for a child?", "content"),
    ("Is this mushroom edible?", "Is this mushroom poisonous?", "content"),
    ("How can I increase my blood pressure?", "How can I decrease my blood pressure?", "content"),
    ("Is it legal to record a phone call?", "Is it illegal to record a phone call?", "content"),
    ("Should I take 1 mg of melatonin?", "Should I take 1 g of melatonin?", "content"),
    ("When should I buy stocks?", "When should I sell stocks?", "content"),
    ("Should I take this pill after eating?", "Should I take this pill before eating?", "content"),
    ("Can cats eat chocolate?", "Can dogs eat chocolate?", "content"),
    ("How do I delete all files in a folder?", "How do I delete all files in a folder except the hidden ones?", "content"),
    ("What is the population of Tokyo?", "What is the population of Osaka?", "entities"),
    ("東京の人口は？", "大阪の人口は？", "content"),
    ("Какая столица Франции?", "Какая столица Германии?", "entities"),
    ("какая столица франции", "какая столица германии", "content"),
    ("What is the capital?", "What is the capital of France?", "entities"),
    ("Is a cat bigger than a dog?", "Is a dog bigger than a cat?", "order"),
    ("Who was the president of Kenya in 1990?", "Who was the first president of Kenya in 1990?", "content"),  # one scope word
])
def test_hostile_near_misses_disagree(a: str, b: str, why: str) -> None:
    assert disagreement(a, b) == why and disagreement(b, a) == why


@pytest.mark.parametrize(("a", "b"), [
    ("What is the capital of France?", "What is the capital?"),  # the name only in the first
    ("What is the capital?", "What is the capital of France?"),  # the name only in the second
])
def test_an_entity_on_one_side_only_is_refused_in_either_order(a: str, b: str) -> None:
    assert disagreement(a, b) == "entities"


def test_a_text_with_nothing_to_compare_is_unreadable() -> None:
    assert not readable("🙂🙂?") and not readable("what is it?")
    assert readable("東京") and readable("2 + 2") and readable("capital of France")


def test_a_sentence_start_is_no_entity_but_still_a_word() -> None:
    found = facts("Paris is lovely. Is Lyon too?")
    assert "lyon" in found.entities and "paris" not in found.entities and "paris" in found.words
    assert facts("1,000 people and twelve cats").numbers == ("1000", "12")
