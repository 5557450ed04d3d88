"""Moderation verdicts: Llama Guard 3's hazard taxonomy and the parse of its answer.

Llama Guard 3 answers `safe`, or `unsafe` and on the next line the violated categories, comma
separated (Meta's Llama Guard 3 model card, "Hazard Taxonomy and Policy"); Workers AI's
`@cf/meta/llama-guard-3-8b` may also answer that as an object `{safe, categories}` (its model
page's output schema). Both adapters, Workers AI's and the local llama.cpp one, parse with this.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

# The fixed taxonomy (MLCommons AI Safety hazards, as Llama Guard 3 was trained on them).
CATEGORIES: dict[str, str] = {
    "S1": "Violent Crimes",
    "S2": "Non-Violent Crimes",
    "S3": "Sex-Related Crimes",
    "S4": "Child Sexual Exploitation",
    "S5": "Defamation",
    "S6": "Specialized Advice",
    "S7": "Privacy",
    "S8": "Intellectual Property",
    "S9": "Indiscriminate Weapons",
    "S10": "Hate",
    "S11": "Suicide & Self-Harm",
    "S12": "Sexual Content",
    "S13": "Elections",
    "S14": "Code Interpreter Abuse",
}


class UnparsableVerdict(ValueError):
    """The guard answered something that is neither `safe` nor `unsafe` with known categories;
    the caller treats it as a guard failure (`GUARD_FAIL`)."""


@dataclass(frozen=True)
class Verdict:
    safe: bool
    categories: tuple[str, ...] = ()


SAFE = Verdict(True)

_CATEGORY = re.compile(r"S(?:[1-9]|1[0-4])")


def _categories(items: list[Any], answer: object) -> tuple[str, ...]:
    found: list[str] = []
    for item in items:
        name = str(item).strip() if isinstance(item, str) else None
        if name is None or not _CATEGORY.fullmatch(name):
            raise UnparsableVerdict(f"the guard named an unknown category {item!r} in {answer!r}")
        if name not in found:
            found.append(name)
    return tuple(sorted(found, key=lambda c: int(c[1:])))


def parse_verdict(answer: object) -> Verdict:
    """A verdict from the guard's answer: the text form or the object form; anything else raises
    `UnparsableVerdict`. An `unsafe` with no category is unparsable (it cannot be enforced per
    category), and so is a `safe` that names one."""
    if isinstance(answer, Mapping):
        safe = answer.get("safe")
        categories = answer.get("categories", [])
        if not isinstance(safe, bool) or not isinstance(categories, list):
            raise UnparsableVerdict(f"the guard's answer is not {{safe, categories}}: {answer!r}")
        parsed = _categories(categories, answer)
        if safe and parsed or not safe and not parsed:
            raise UnparsableVerdict(f"the guard's answer contradicts itself: {answer!r}")
        return Verdict(safe, parsed)
    if not isinstance(answer, str):
        raise UnparsableVerdict(f"the guard answered a {type(answer).__name__}: {answer!r}")
    lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
    if lines == ["safe"]:
        return SAFE
    if len(lines) == 2 and lines[0] == "unsafe":
        return Verdict(False, _categories(lines[1].split(","), answer))
    raise UnparsableVerdict(f"the guard's answer is neither 'safe' nor 'unsafe' and its categories: {answer!r}")


def guard_answer(response: Any) -> object:
    """The verdict part of an AI binding's result: Workers AI answers `{response, usage}`."""
    if isinstance(response, Mapping) and "response" in response:
        return response["response"]
    raise UnparsableVerdict(f"the guard's result has no `response`: {response!r}")
