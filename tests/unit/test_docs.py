"""The README and the guides in docs/ point at things that exist: every relative link resolves
(to a file, and to a heading when it names one), every `make` target they name is in the
Makefile, every `edgellm` option they name is in that command's `--help`, and every `[vars]`
name the Worker reads is in the configuration reference. A guide that drifts from the code
fails here, not in a reader's terminal."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from edgellm.vars import VARS

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "bench" / "README.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
SUBCOMMANDS = {"dev": ["dev"], "pull": ["pull"], "publish": ["publish"], "deploy-check": ["deploy-check"],
               "keys create": ["keys", "create"], "keys list": ["keys", "list"], "keys revoke": ["keys", "revoke"],
               "keys rotate": ["keys", "rotate"]}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def code_spans(path: Path) -> list[str]:
    """Inline code and each line of the fenced blocks: where commands and options are named."""
    text = path.read_text()
    lines = [line for block in FENCE.findall(text) for line in block.splitlines()[1:-1]]
    return lines + INLINE.findall(FENCE.sub("", text))


def test_the_guides_exist_and_the_readme_is_a_front_door() -> None:
    names = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert {"getting-started.md", "deploying.md", "api.md", "caching.md", "edge-and-origin.md", "access.md",
            "conversations.md", "pages.md", "operations.md", "architecture.md", "benchmarks.md"} <= names
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 300
    for heading in ("The two commands", "Deploy to Cloudflare", "Known differences between Cloudflare and the local edge",
                    "What works on Cloudflare, and what only locally", "Guides"):
        assert f"## {heading}" in readme or f"### {heading}" in readme, heading


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", path.read_text())):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not a file of the repository
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(target)
    assert broken == []


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_tracker_numbers_or_session_history(path: Path) -> None:
    text = path.read_text()
    found = re.findall(r"(?i)\bissue \d+|\b(?:first|second|third|fourth|fifth|sixth|seventh) pass\b|\bstop \d+\b", text)
    assert found == []


@cache
def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z-]*):", text, re.M))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_named_exists(path: Path) -> None:
    named = {m for span in code_spans(path) for m in re.findall(r"(?:^|[;&|(]\s*|\s)make ([a-z][a-z-]*)", span)}
    assert named - make_targets() == set()


@cache
def options(command: tuple[str, ...]) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "edgellm_local.cli", *command, "--help"], capture_output=True, text=True,
                          timeout=60, check=True)
    return set(re.findall(r"(--[a-z][a-z-]*)", done.stdout))


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_edgellm_option_named_exists(path: Path) -> None:
    unknown = []
    for span in code_spans(path):
        for match in re.finditer(r"edgellm (dev|pull|publish|deploy-check|keys (?:create|list|revoke|rotate))\b", span):
            rest = re.split(r"[;|]|&&|\s#", span[match.end():])[0]  # up to the next command or comment
            for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest):
                if flag not in options(tuple(SUBCOMMANDS[match.group(1)])):
                    unknown.append(f"edgellm {match.group(1)} {flag}")
        for flag in re.findall(r'ARGS="([^"]*)"', span):
            unknown += [f"make dev ARGS {f}" for f in re.findall(r"(--[a-z][a-z-]*)", flag) if f not in options(("dev",))]
    assert unknown == []


def test_the_operations_table_of_dev_options_names_real_options() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text[text.index("## The `edgellm dev` options"):text.index("## Operator routes")]
    named = set(re.findall(r"(--[a-z][a-z-]*)", table))
    assert len(named) > 20 and named - options(("dev",)) == set()


def test_every_var_is_in_the_configuration_reference() -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    reference = text[text.index("## Configuration reference"):text.index("## The `edgellm dev` options")]
    listed = re.findall(r"^\| `([A-Z_]+)` \|", reference, re.M)
    assert sorted(listed) == sorted(VARS)
