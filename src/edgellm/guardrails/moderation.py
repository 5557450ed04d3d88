"""Moderation verdicts: Llama Guard 3's hazard taxonomy and the parse of its answer.

Llama Guard 3 answers `safe`, or `unsafe` and on the next line the violated categories, comma
separated (Meta's Llama Guard 3 model card, "Hazard Taxonomy and Policy"); Workers AI's
`@cf/meta/llama-guard-3-8b` may also answer that as an object `{safe, categories}` (its model
page's output schema). Both adapters, Workers AI's and the local llama.cpp one, parse with this.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ..ports import GuardError, Verdict

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


class UnparsableVerdict(GuardError):
    """The guard answered something that is neither `safe` nor `unsafe` with known categories;
    the caller treats it as a guard failure (`GUARD_FAIL`)."""


__all__ = ["CATEGORIES", "SAFE", "UnparsableVerdict", "Verdict", "guard_answer", "guard_messages", "parse_verdict"]

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


def guard_messages(messages: list[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The conversation as Llama Guard takes it: user and assistant turns that alternate and start
    with the user (Workers AI's input schema says roles "must alternate between 'user' and
    'assistant'"). A system or developer message is classified as part of the user turn it
    precedes (nothing a caller sends escapes the check); a tool result as part of the user's side;
    consecutive turns of one side are joined; content parts keep their text."""
    turns: list[dict[str, str]] = []
    for message in messages:
        role = message.get("role")
        side = "assistant" if role == "assistant" else "user"
        text = _text(message.get("content"))
        if not text:
            continue
        if turns and turns[-1]["role"] == side:
            turns[-1]["content"] += "\n\n" + text
        else:
            turns.append({"role": side, "content": text})
    if turns and turns[0]["role"] == "assistant":
        turns.insert(0, {"role": "user", "content": "(no prompt)"})
    if not turns:
        raise ValueError("nothing to classify: no message has text")
    return turns


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part.get("text", "") for part in content if isinstance(part, Mapping) and isinstance(part.get("text"), str))
    return ""
