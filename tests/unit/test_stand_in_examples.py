"""The pages' placeholders and the example questions of the README and the guides are questions `bench.bench_models`
scores, so none can change (or be added) without the stand-in model being measured on it."""

from __future__ import annotations

import re
from pathlib import Path

from bench.bench_models import QUESTIONS

ROOT = Path(__file__).resolve().parents[2]
ASKED = {turn for q in QUESTIONS for turn in q.turns}


def placeholders() -> list[tuple[str, str]]:
    return [(page.name, text) for page in sorted((ROOT / "public").glob("*.html"))
            for text in re.findall(r'<textarea[^>]*?placeholder="([^"]+)"', page.read_text(), re.S)]


def readme_questions() -> list[str]:
    """The README's and the guides' example questions (chat messages and Responses inputs)."""
    readme = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    user = re.findall(r'"role":\s*"user",\s*"content":\s*"([^"]+)"', readme)
    responses = re.findall(r'responses\.create\([^)]*?input="([^"]+)"', readme)
    return user + responses


def test_every_prompt_placeholder_is_a_scored_question() -> None:
    found = placeholders()
    assert found, "no prompt placeholder found in public/*.html"
    assert [(page, text) for page, text in found if text not in ASKED] == []


def test_every_readme_example_question_is_a_scored_question() -> None:
    found = readme_questions()
    assert len(found) >= 5, found
    assert sorted({text for text in found if text not in ASKED}) == []
