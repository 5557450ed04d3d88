"""The README and the guides in docs/ point at things that exist: every relative link resolves
(to a file, and to a heading when it names one), every `make` target they name is in the
Makefile, every `edgellm` option they name is in that command's `--help`, and every `[vars]`
name the Worker reads is in the configuration reference. A guide that drifts from the code
fails here, not in a reader's terminal."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
import tomllib
from functools import cache
from pathlib import Path

import pytest

from edgellm.vars import VARS, check_vars

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


# ---- every command a reader is told to run is run here (cheaply), or says which test runs it ----

SHELL_FENCE = re.compile(r"^[ \t]*```(sh|bash|shell|console)\n(.*?)^[ \t]*```", re.M | re.S)
PYTHON_FENCE = re.compile(r"^[ \t]*```python\n(.*?)^[ \t]*```", re.M | re.S)
GUIDES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# Commands that need what a unit test cannot have (a running edge, a Cloudflare account, another
# project's server), each with the test that runs it or its equivalent. A stale entry fails below.
COVERED_ELSEWHERE = {
    r"^curl -s localhost:8787/v1/chat/completions -H 'content-type": "tests/edge/test_readme_examples.py runs it against a local edge",
    r"^curl -sN localhost:8787/v1/chat/completions": "tests/edge/test_readme_examples.py runs it against a local edge",
    r"^curl -s localhost:8787/client/v4/accounts/any/ai/run/": "tests/edge/test_readme_examples.py runs it against a local edge",
    r'^curl -s localhost:8787/v1/chat/completions -H "authorization: Bearer el-': "needs a key: tests/edge/test_access.py sends it with one",
    r'^curl -s "localhost:8787/admin/usage\?': "needs an edge with an admin token: tests/edge/test_usage_writer.py asks /admin/usage",
    r"^URL=https://edgellm\.<your-subdomain>": "needs a deployed Worker; the same request is the README's first curl line",
    r'^for i in 1 2; do curl -s "\$URL/v1/chat/completions"': "needs a deployed Worker; the same request is the README's first curl line",
    r"^curl -X POST localhost:8787/admin/faults": "needs a running edge with an admin token: tests/edge/test_routing.py posts the same plan",
    r"^llama-server ": "llama.cpp's own server (make llama-server builds it; bench/bench_gateway.py runs it)",
    r"^vllm serve ": "vLLM's server (not installed here); tests/edge/test_routing.py runs an OpenAI-compatible origin",
}


def shell_commands(path: Path) -> list[str]:
    """The fenced shell blocks' commands: continuation lines joined, an indented line part of the
    command above it (a quoted body), comments dropped."""
    commands = []
    for _, block in SHELL_FENCE.findall(path.read_text()):
        text = textwrap.dedent(block).replace("\\\n", " ")
        for command in re.split(r"\n(?=\S)", text.strip()):
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def all_shell_commands() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), command) for path in GUIDES for command in shell_commands(path)]


INLINE_COMMAND = re.compile(r"^(?:npx |make |openssl |\.venv/bin/|edgellm |npm |curl |python |pip |[A-Z_]+=\S+ make )")


def inline_commands() -> list[str]:
    """Commands named in the prose (`make deploy`, `npx wrangler login`): each once."""
    spans = (span for path in GUIDES for span in INLINE.findall(FENCE.sub("", path.read_text())))
    return sorted({span for span in spans if INLINE_COMMAND.match(span)})


def without_comment(command: str) -> str:
    return re.split(r"\s+#\s", command)[0].strip()


def run_ok(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = ran(tuple(args), timeout)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (args, done.stdout[-2000:], done.stderr[-2000:])
    return done


@cache  # one `--help` serves every command that names the same subcommand
def ran(args: tuple[str, ...], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def check_command(command: str) -> str:
    """Runs the cheap form of `command` (its `--help`, `make -n`, its Python snippets whole), or
    names the test that runs it; returns how it was checked."""
    for pattern, reason in COVERED_ELSEWHERE.items():
        if re.search(pattern, command):
            return f"covered: {reason}"
    line = without_comment(command)
    for inner in re.findall(r"\$\((\.venv/bin/python -c '[^']*')\)", line):  # a snippet the command runs first
        run_ok(["bash", "-c", inner])
    line = re.sub(r"^(?:[A-Z_]+=\S+ )+", "", line)  # environment assignments before the command
    first, *piped = line.split(" | ")
    for part in piped:  # `openssl rand -hex 32 | npx wrangler secret put ADMIN_TOKEN`: each command of a pipe
        if INLINE_COMMAND.match(part):
            check_command(part)
    line = first
    words = line.split()
    if words == ["npm", "install"]:  # what it installs is there: package.json's packages, at their locked versions
        run_ok(["npm", "ls", "--depth=0", "--offline"], timeout=60)
        return "npm ls"
    if words[0] == "openssl":
        run_ok(["openssl", "version"])
        return "openssl is there"
    if words[:2] == ["pip", "install"]:
        if words[2] == "-e":
            extra = re.search(r"\[(\w+)\]", words[3]).group(1)  # type: ignore[union-attr]
            assert extra in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
            return "the extra exists"
        run_ok([sys.executable, "-c", "; ".join(f"import {name}" for name in words[2:])])
        return "the package imports"
    if words[0] == "python":
        words = [".venv/bin/python", *words[1:]]
    if words[0] in ("edgellm", ".venv/bin/edgellm") and (len(words) == 1 or not re.match(r"^[a-z]", words[1])):
        run_ok([sys.executable, "-m", "edgellm_local.cli", "--help"])
        return "edgellm --help"
    if words[0] == "make":
        run_ok(["make", "-n", words[1]])
        return "make -n"
    if words[0] in ("edgellm", ".venv/bin/edgellm"):
        sub = words[1:3] if words[1] == "keys" else words[1:2]
        run_ok([sys.executable, "-m", "edgellm_local.cli", *sub, "--help"])
        return "edgellm --help"
    if words[:3] == [".venv/bin/python", "-m", "pytest"]:
        paths = [w for w in words[3:] if not w.startswith("-")]
        assert paths and all((ROOT / p).exists() for p in paths), line
        return "pytest paths exist (the suite runs them)"
    if words[:2] == [".venv/bin/python", "-m"]:
        run_ok([sys.executable, "-m", words[2], "--help"])
        return "python -m --help"
    if words[:2] == ["npx", "wrangler"]:
        sub = [w for w in words[2:] if re.fullmatch(r"[a-z][a-z0-9-]*", w)][:3]  # not a NAME, <id> or flag
        help_text = run_ok(["npx", "--no-install", "wrangler", *sub, "--help"], timeout=60).stdout
        flags = {f.split("=")[0] for f in words if f.startswith("--")}
        camel = {f: "--" + re.sub(r"-([a-z])", lambda m: m.group(1).upper(), f[2:]) for f in flags}  # yargs reads both
        assert {f for f in flags if f not in help_text and camel[f] not in help_text} == set(), (line, help_text)
        return "npx wrangler --help"
    if match := re.match(r"^([A-Z_]+) = (.+)$", line, re.S):  # a wrangler.toml [vars] line shown beside commands
        value = tomllib.loads(f"{match.group(1)} = {match.group(2)}")
        assert check_vars(value) == [], line
        return "[vars] value accepted"
    raise AssertionError(f"no test runs this command, and no entry says which does: {command!r}")


@pytest.mark.parametrize(("where", "command"), all_shell_commands(), ids=lambda v: v if v.endswith(".md") else v[:60])
def test_every_command_a_reader_is_told_to_run_runs(where: str, command: str) -> None:
    assert check_command(command)


@pytest.mark.parametrize("command", inline_commands())
def test_every_command_named_in_the_prose_runs(command: str) -> None:
    assert check_command(command)


def test_every_entry_of_the_covered_list_still_names_a_command_and_a_test() -> None:
    commands = [command for _, command in all_shell_commands()] + inline_commands()
    assert [p for p in COVERED_ELSEWHERE if not any(re.search(p, c) for c in commands)] == []
    named = {m for reason in COVERED_ELSEWHERE.values() for m in re.findall(r"(tests/\S+\.py|bench/\S+\.py)", reason)}
    assert named and {n for n in named if not (ROOT / n).exists()} == set()


def python_blocks() -> list[tuple[str, str]]:
    return [(str(path.relative_to(ROOT)), block) for path in GUIDES for block in PYTHON_FENCE.findall(path.read_text())]


@pytest.mark.parametrize(("where", "code"), python_blocks(), ids=lambda v: v if v.endswith(".md") else v.split("\n")[0][:50])
def test_every_python_snippet_compiles_and_its_imports_import(where: str, code: str) -> None:
    """The snippets need a running edge to run whole (the README's are run whole by
    tests/edge/test_readme_examples.py); here each compiles and every module it imports is there."""
    tree = ast.parse(textwrap.dedent(code))
    imports = [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports or "client." in code, code
    run_ok([sys.executable, "-c", "\n".join(imports)], timeout=180)


def numbered_steps(text: str) -> dict[int, str]:
    """A numbered list's items by number (each runs to the next number, or to a paragraph at the margin)."""
    items = re.split(r"(?m)^(\d+)\. ", text)
    return {int(n): re.split(r"\n\n(?=\S)", body)[0] for n, body in zip(items[1::2], items[2::2])}


def test_the_readme_and_the_deploy_guide_number_the_same_steps() -> None:
    """A reader moves between the README's short list and the guide: step N is the same step in
    both, so every command the README gives for step N is in the guide's step N."""
    readme = (ROOT / "README.md").read_text()
    readme = readme[readme.index("## Deploy to Cloudflare"):readme.index("## Guides")]
    guide = (ROOT / "docs" / "deploying.md").read_text()
    guide = guide[:guide.index("\n## ")]
    short, long = numbered_steps(readme), numbered_steps(guide)
    assert sorted(short) == sorted(long) == list(range(1, len(long) + 1))
    commands = re.compile(r"^(?:npx |make |openssl |\.venv/bin/edgellm |npm |edgellm )")
    for n, body in short.items():
        named = [c for c in INLINE.findall(FENCE.sub("", body)) + shell_commands_in(body) if commands.match(c)]
        assert [c for c in named if c.split(" …")[0].split(" --target")[0] not in long[n]] == [], n


def shell_commands_in(text: str) -> list[str]:
    return [line.strip() for _, block in SHELL_FENCE.findall(text) for line in block.splitlines() if line.strip()]


def documented_routes(path: Path) -> list[tuple[set[str], str]]:
    """The first column of the `## Routes` table: (methods named, path) per path, where methods
    are the upper-case words before it in the cell (`GET`/`DELETE /v1/responses/{id}`)."""
    text = path.read_text()
    table = text[text.index("## Routes"):]
    table = table[:table.index("\n\n", table.index("|"))]
    found = []
    for row in re.findall(r"^\| (.+?) \|", table, re.M)[1:]:
        methods: set[str] = set()
        for span in INLINE.findall(row):
            methods |= set(re.findall(r"\b[A-Z]{3,}\b", span))
            for doc_path in re.findall(r"(?:^|\s)(/\S*)", span):
                found.append((methods, doc_path))
                methods = set()
    return found


def covers(doc_path: str, template: str) -> bool:
    """A doc's `{anything}` is one segment, a trailing `/*` or `/...` any rest."""
    route = re.sub(r"\{[^}]*\}", "{}", template)
    wild = doc_path.endswith(("/*", "/..."))
    doc = doc_path.rsplit("/", 1)[0] if wild else doc_path
    pattern = re.sub(r"\\\{[^}]*\\\}", "[^/]+", re.escape(doc)) + ("(?:/.*)?" if wild else "")
    return re.fullmatch(pattern, route) is not None


@pytest.mark.parametrize("name", ["README.md", "docs/api.md"])
def test_every_route_of_the_app_is_in_the_route_tables(name: str) -> None:
    """The app's routing table is the truth; a route missing from a reader's table is a route
    nobody finds. docs/api.md, the reference, also names every method of each."""
    from edgellm.app import ROUTES

    table = documented_routes(ROOT / name)
    missing = []
    for route in ROUTES.routes:
        rows = [methods for methods, doc_path in table if covers(doc_path, route.template)]
        if not rows:
            missing.append(route.template)
        elif name == "docs/api.md" and not set(route.methods) - {"HEAD"} <= set().union(*rows):
            missing.append(f"{sorted(route.methods)} {route.template}")
    assert missing == []


PAGES = {"/": "index.html", "/tokenizer": "tokenizer.html", "/chat": "chat.html", "/python": "python.html",
         "/device": "device.html", "/usage": "usage.html"}


def navigation(page: Path) -> list[tuple[str, str, bool]]:
    nav = re.search(r'<nav aria-label="Pages">(.*?)</nav>', page.read_text(), re.S)
    assert nav, page.name
    return [(href, text, bool(current)) for href, current, text in
            re.findall(r'<a href="([^"]+)"( aria-current="page")?>([^<]+)</a>', nav.group(1))]


@pytest.mark.parametrize("page", sorted((ROOT / "public").glob("*.html")), ids=lambda p: p.name)
def test_every_page_has_the_one_navigation_to_every_page(page: Path) -> None:
    """One navigation on every page, listing every page (a page missing from it is a page a
    reader never finds), the page itself marked current."""
    assert {p.name for p in (ROOT / "public").glob("*.html")} == set(PAGES.values())
    links = navigation(page)
    assert [(href, text) for href, text, _ in links] == [(href, text) for href, text, _ in navigation(ROOT / "public" / "index.html")]
    assert set(PAGES) <= {href for href, _, _ in links}
    assert [href for href, _, current in links if current] == [next(h for h, f in PAGES.items() if f == page.name)]
