"""The second check on a semantic candidate: what a cosine cannot see must agree.

Sentence embeddings put "the capital of France" and "the capital of Germany", "2 + 2" and
"2 + 3", "is X safe" and "is X not safe" close together (GPTCache's published table: 5-9% wrong
hits at its recommended thresholds). A paraphrase changes words, case and punctuation, never
the numbers, the names or the polarity of the question, so a candidate must carry the same:

- numbers (digits, and the number words one to a billion), as a multiset;
- named entities: words written capitalised inside a sentence, acronyms and words mixing
  letters and digits; each one either text names must appear (case aside) in the other;
- negation: both negated or neither (a negative word, `n't`, or a word negated by its prefix:
  "unsafe", "non-toxic"; the common words that only start like one, "under", "unique", are not).

Pure functions of two strings (table-driven tests: tests/unit/test_semantic_guard.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’\-]*")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SENTENCE_END = re.compile(r"[.!?:;]\s*$")
NEGATIONS = frozenset({"not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "cannot", "without", "nowhere"})
# words that begin with "un" but negate nothing
NOT_NEGATED = ("under", "understand", "unit", "uni", "until", "unless", "unto", "unveil", "unravel", "unleash", "unload", "unpack",
               "undo", "unlock")
NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
NUMBER_WORDS.update({"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80",
                     "ninety": "90", "hundred": "100", "thousand": "1000", "million": "1000000", "billion": "1000000000",
                     "half": "0.5", "dozen": "12"})


@dataclass(frozen=True)
class Facts:
    numbers: tuple[str, ...]  # sorted, a multiset
    entities: frozenset[str]  # lower-cased
    words: frozenset[str]  # every word, lower-cased, possessives stripped
    negated: bool


def _bare(word: str) -> str:
    word = word.replace("’", "'").lower()
    for suffix in ("'s", "'"):
        if word.endswith(suffix):
            word = word[: -len(suffix)]
    return word


def _negated_by_prefix(word: str) -> bool:
    if word.startswith("non-") or (word.startswith("non") and len(word) >= 7):
        return True
    return word.startswith("un") and len(word) >= 6 and not word.startswith(NOT_NEGATED)


def facts(text: str) -> Facts:
    numbers: list[str] = [n.replace(",", "") for n in _NUMBER.findall(text)]
    entities: set[str] = set()
    words: set[str] = set()
    negated = False
    at_start = True
    for match in _WORD.finditer(text):
        raw = match.group(0)
        word = _bare(raw)
        words.add(word)
        if word in NUMBER_WORDS:
            numbers.append(NUMBER_WORDS[word])
        if word in NEGATIONS or word.endswith("n't") or _negated_by_prefix(word):
            negated = True
        has_digit = any(c.isdigit() for c in raw)
        mixed = has_digit and any(c.isalpha() for c in raw)  # GPT-4, iPhone15, B2B
        acronym = len(raw) >= 2 and raw.isupper() and raw.isalpha()
        capitalised = raw[0].isupper() and not at_start and raw != "I"
        if mixed or acronym or capitalised:
            entities.add(word)
        following = text[match.end(): match.end() + 2]
        at_start = bool(_SENTENCE_END.match(following)) or following.startswith("\n")
    return Facts(tuple(sorted(numbers)), frozenset(entities), frozenset(words), negated)


def disagreement(a: str, b: str) -> str | None:
    """Why `b` cannot answer for `a` (or the other way round), or None when they agree."""
    fa, fb = facts(a), facts(b)
    if fa.numbers != fb.numbers:
        return "numbers"
    if fa.negated != fb.negated:
        return "negation"
    if not fa.entities <= fb.words or not fb.entities <= fa.words:
        return "entities"
    return None
