"""The second check on a semantic candidate: what a cosine cannot see must agree.

Sentence embeddings put "the capital of France" and "the capital of Germany", "2 + 2" and
"2 + 3", "is X safe" and "is X not safe", "miles to km" and "km to miles", "raw" and "cooked"
close together (GPTCache's published table: 5-9% wrong hits at its recommended thresholds). A
paraphrase changes the frame of a question ("tell me", "what is", "how do I"), its grammar
("spiders" / "spider", "eating" / "eat"), case and punctuation; it does not swap one content
word for another, add a condition, change the direction of a relation, or change the numbers,
names or polarity. So a candidate must carry, in any script:

- the same numbers (digits, and the number words one to a billion), as a multiset;
- the same polarity: both negated or neither (a negative word, `n't`, or a word negated by its
  prefix: "unsafe", "non-toxic"; the common words that only start like one are not);
- the same named entities: words written capitalised inside a sentence, acronyms and words mixing
  letters and digits; each one either text names must appear (case aside) in the other;
- the same content words: the words left once the function words and the question's frame are
  removed, lightly stemmed. A content word on each side that the other lacks is a substitution
  (cat / dog, maximum / minimum, raw / cooked, + / -, mg / g), always refused; one side may add
  a single content word ("the capital city"), never a scope word ("except", "only") nor two;
- the same units: the word after each number (1 mg / 1 g, 5 miles / 5 km);
- the same direction: where both texts use a relation word ("to", "into", "from", "than", "vs"),
  the content words they share come in the same order (miles to km / km to miles, a cat bigger
  than a dog / a dog bigger than a cat).

Words are Unicode word characters (`\\w`), so every script is read; Chinese, Japanese and Korean
ideographs and kana, which are written without spaces, count one character a word. A text with
no content word to compare (`readable` False) is one the guard cannot read: the caller then asks
a stricter cosine of it.

Pure functions of two strings (table-driven tests: tests/unit/test_semantic_guard.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
# a CJK character alone, or a run of other word characters (apostrophes and hyphens inside a word
# kept together: "don't", "non-toxic"), or an arithmetic operator standing between numbers or spaces
_TOKEN = re.compile(rf"[{_CJK}]|(?:(?![{_CJK}])\w)+(?:['’\-](?:(?![{_CJK}])\w)+)*|(?<=[\d\s])[-+*/×÷=<>^%](?=[\s\d])")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
_SENTENCE_END = re.compile(r"[.!?:;。！？]\s*$")
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
# English function words and the frames a question is asked in: a paraphrase adds, drops or swaps
# these freely. Everything else is a content word. (Other languages' function words are not
# listed: there every word counts, which only makes the guard stricter.)
FUNCTION_WORDS = frozenset("""
a an the this that these those it its it's i me my mine we us our you your he him his she her they them their
is are was were be been being am do does did done have has had having can could will would shall should may might must
what what's whats which who whom whose when where why how whats
of to in into on onto at by for from with about as than then so and or if
please tell give show explain let know need want like just really actually quite very right exactly
some any there here also again ok okay yes hi hello thanks thank
say said mean meaning called call get got
""".split())
# words that narrow or widen what is asked: never the one word a text may add
SCOPE_WORDS = frozenset({"except", "excluding", "exclude", "only", "but", "besides", "unless", "instead", "per", "each",
                         "every", "all", "any", "most", "least", "first", "last", "same", "different", "both", "either",
                         "after", "before", "while", "during"})
RELATION_WORDS = frozenset({"to", "into", "from", "than", "vs", "versus", "over", "per"})
IRREGULAR = {"wrote": "write", "written": "write", "ate": "eat", "eaten": "eat", "ran": "run", "went": "go", "gone": "go",
             "took": "take", "taken": "take", "made": "make", "gave": "give", "given": "give", "saw": "see", "seen": "see",
             "children": "child", "men": "man", "women": "woman", "people": "person", "feet": "foot", "teeth": "tooth",
             "mice": "mouse", "better": "good", "best": "good"}
STRICT_COSINE = 0.98  # what a candidate must reach where the guard cannot read one of the texts


@dataclass(frozen=True)
class Facts:
    numbers: tuple[str, ...]  # sorted, a multiset
    entities: frozenset[str]  # lower-cased
    words: frozenset[str]  # every word, lower-cased, possessives stripped
    negated: bool
    content: tuple[str, ...]  # the content words, stemmed, in order (relation words marked with a NUL)
    units: tuple[tuple[str, str], ...] = ()  # (number, the word after it), sorted


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


def stem(word: str) -> str:
    """A light, symmetric stemmer: plurals, -ing, -ed and -ly dropped, so that "spiders", "eating",
    "ranked" and "safely" meet "spider", "eat", "rank" and "safe" (not a dictionary: both texts are
    stemmed alike, which is all a comparison needs)."""
    if word in IRREGULAR:
        return IRREGULAR[word]
    if not word.isascii() or not word.isalpha() or len(word) <= 3:
        return word
    for suffix, keep in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("ly", ""), ("es", ""), ("s", "")):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                continue
            if suffix == "es" and not word.endswith(("ches", "shes", "xes", "zes", "oes")):
                continue
            word = word[: -len(suffix)] + keep
            if suffix in ("ing", "ed") and len(word) >= 4 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]  # running -> run, stopped -> stop
            break
    return word


def facts(text: str) -> Facts:
    numbers: list[str] = [n.replace(",", "") for n in _NUMBER.findall(text)]
    entities: set[str] = set()
    words: set[str] = set()
    content: list[str] = []
    units: list[tuple[str, str]] = []
    negated = False
    at_start = True
    number: str | None = None  # the number just read, waiting for its unit
    for match in _TOKEN.finditer(text):
        raw = match.group(0)
        word = _bare(raw)
        words.add(word)
        if number is not None:
            units.append((number, stem(word)))
        number = NUMBER_WORDS.get(word) or (word.replace(",", "") if _NUMBER.fullmatch(word) else None)
        if word in NUMBER_WORDS:
            numbers.append(NUMBER_WORDS[word])
        elif word in NEGATIONS or word.endswith("n't") or _negated_by_prefix(word):
            negated = True
        elif word not in FUNCTION_WORDS and not _NUMBER.fullmatch(word):
            content.append(stem(word))
        elif word in RELATION_WORDS:
            content.append("\0" + word)  # kept in order, as a marker (never compared as a content word)
        has_digit = any(c.isdigit() for c in raw)
        mixed = has_digit and any(c.isalpha() for c in raw)  # GPT-4, iPhone15, B2B
        acronym = len(raw) >= 2 and raw.isupper() and raw.isalpha()
        capitalised = raw[0].isupper() and not at_start and raw != "I"
        if mixed or acronym or capitalised:
            entities.add(word)
        following = text[match.end(): match.end() + 2]
        at_start = bool(_SENTENCE_END.match(following)) or following.startswith("\n")
    return Facts(tuple(sorted(numbers)), frozenset(entities), frozenset(words), negated, tuple(content), tuple(sorted(units)))


def _content_words(f: Facts) -> set[str]:
    return {w for w in f.content if not w.startswith("\0")}


def _order(f: Facts, shared: set[str]) -> tuple[str, ...]:
    """The shared content words in reading order, each once, and the relation words between them."""
    seen: list[str] = []
    for word in f.content:
        if (word in shared or word.startswith("\0")) and word not in seen:
            seen.append(word)
    return tuple(seen)


def readable(text: str) -> bool:
    """Whether the guard can compare this text: it holds a content word or a number."""
    f = facts(text)
    return bool(_content_words(f) or f.numbers)


def disagreement(a: str, b: str) -> str | None:
    """Why `b` cannot answer for `a` (or the other way round), or None when they agree."""
    fa, fb = facts(a), facts(b)
    if fa.numbers != fb.numbers:
        return "numbers"
    if fa.negated != fb.negated:
        return "negation"
    if not fa.entities <= fb.words or not fb.entities <= fa.words:
        return "entities"
    ca, cb = _content_words(fa), _content_words(fb)
    only_a, only_b = ca - cb, cb - ca
    if only_a and only_b:
        return "content"
    extra = only_a or only_b
    if len(extra) > 1 or extra & SCOPE_WORDS:
        return "content"
    if fa.units != fb.units:
        return "numbers"  # another unit to the same number: 1 mg / 1 g, 5 miles / 5 km
    relations = {w for w in fa.content if w.startswith("\0")} & {w for w in fb.content if w.startswith("\0")}
    if relations and _order(fa, ca & cb | relations) != _order(fb, ca & cb | relations):
        return "order"
    return None
