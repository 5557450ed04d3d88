"""The README's first requests run as a reader runs them: its curl lines through bash and its
Python examples (the openai client, Cloudflare's SDK plain and streamed) as scripts, against a
local edge serving the stand-in model `make dev` serves (SmolLM2-135M), with only the address
changed; and the pages' own example questions are asked as the pages ask them. Every example is
deterministic (temperature 0), so each answer is the model's one answer to it, and it must
contain the fact the example asks for: an example the stand-in gets wrong is a first hour spent
wondering whether the edge is broken."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from edgellm.config import Config
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.model_file import default_model_path
from edgellm_local.llama.runner import LlamaCppRunner

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SECTION = README[README.index("## A first request"):README.index("## What works on Cloudflare")]
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", SECTION, re.M | re.S)
LOCAL = re.compile(r"(?:http://)?(?:localhost|127\.0\.0\.1):8787")
PYTHON_PAGE = (ROOT / "public" / "js" / "python-page.mjs").read_text()
# The fact each example question asks for: every word must be in the answer (case-insensitive).
FACTS = {
    "What is the capital of France?": ("paris",),
    "What is the capital of Japan?": ("tokyo",),
    "Name three primary colours.": ("red", "blue", "yellow"),
    "What is 2 + 2?": ("4",),
}


def at(edge: EdgeServer, code: str) -> str:
    """The example with the README's address replaced by the test edge's."""
    return LOCAL.sub(edge.url, code)


def curl_commands() -> list[str]:
    (shell,) = [code for lang, code in BLOCKS if lang == "sh"]
    return re.split(r"\n(?=curl )", shell.strip())


def states(answer: str, question: str) -> bool:
    words = set(re.findall(r"[a-z0-9]+", answer.lower()))
    return all(fact in words for fact in FACTS[question])


def placeholders() -> list[tuple[str, str]]:
    return [(page.name, text) for page in sorted((ROOT / "public").glob("*.html"))
            for text in re.findall(r'<textarea[^>]*?placeholder="([^"]+)"', page.read_text(), re.S)]


def python_page_request() -> dict:
    """The body the Python page's editable example posts (its `question` and its `json=`)."""
    code = re.search(r"const EXAMPLE = `(.*?)`;", PYTHON_PAGE, re.S).group(1)  # type: ignore[union-attr]
    tree = ast.parse(code)
    scope: dict = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["question"]:
            scope["question"] = ast.literal_eval(node.value)
    (post,) = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func) == "requests.post"]
    (body,) = [k.value for k in post.keywords if k.arg == "json"]
    return {"question": scope["question"], "body": eval(compile(ast.Expression(body), "example", "eval"), {}, scope)}


@pytest.fixture(scope="module")
def smollm2_runner() -> LlamaCppRunner:
    return LlamaCppRunner(default_model_path(), n_ctx=2048, n_parallel=1, threads=1).load()


@pytest.fixture
def edge(start_edge: Callable[..., EdgeServer], smollm2_runner: LlamaCppRunner) -> EdgeServer:
    """A local edge as `make dev` starts it: the stand-in model, the answer cache on."""
    config = Config(open_access=True)
    return start_edge(config=config, ai=LlamaCppAI.for_config(config, smollm2_runner))


def test_the_readme_has_the_examples_this_test_runs() -> None:
    assert len(curl_commands()) == 3
    pythons = [code for lang, code in BLOCKS if lang == "python"]
    assert len(pythons) == 2 and "from openai import OpenAI" in pythons[0] and "from cloudflare import Cloudflare" in pythons[1]
    assert "with_streaming_response.run" in pythons[1]


def test_every_example_question_is_deterministic_and_has_its_fact() -> None:
    """A new example question needs its fact here, and temperature 0, or this test cannot hold it."""
    asked = re.findall(r'"content": "([^"]+\?|[^"]+\.)"', SECTION) + re.findall(r'prompt[=:]\s*"([^"]+)"', SECTION)
    asked += [text for _, text in placeholders()] + [python_page_request()["question"]]
    assert sorted({q for q in asked if q not in FACTS and not q.startswith("You are")}) == []
    for command in curl_commands():
        assert re.search(r'"temperature":\s*0\b', command), command
    for _, code in BLOCKS:
        if code.lstrip().startswith(("from openai", "import json")):
            assert code.count("temperature=0") == 2, code


def run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.returncode, done.stdout, done.stderr)
    return done


def streamed_text(sse: str, field: str) -> str:
    pieces = []
    for line in sse.splitlines():
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            pieces.append(event["choices"][0]["delta"].get("content") or "" if field == "delta" else event.get("response") or "")
    return "".join(pieces)


def test_the_curl_lines_answer_right_and_the_second_ask_is_a_hit(edge: EdgeServer) -> None:
    chat, stream, workers_ai = curl_commands()
    first = run(["bash", "-c", at(edge, chat)]).stdout
    assert first.startswith("HTTP/1.1 200") and re.search(r"(?im)^cf-aig-cache-status: MISS", first), first
    answer = json.loads(first.split("\n\n", 1)[1])["choices"][0]["message"]["content"]
    assert states(answer, "What is the capital of France?"), answer
    second = run(["bash", "-c", at(edge, chat)]).stdout
    assert re.search(r"(?im)^cf-aig-cache-status: HIT", second), second
    streamed = run(["bash", "-c", at(edge, stream)]).stdout
    assert streamed.count("data: {") >= 2 and streamed.rstrip().endswith("data: [DONE]"), streamed
    assert states(streamed_text(streamed, "delta"), "Name three primary colours."), streamed
    answered = json.loads(run(["bash", "-c", at(edge, workers_ai)]).stdout)
    assert answered["success"] is True and states(answered["result"]["response"], "What is 2 + 2?"), answered


@pytest.mark.parametrize("index", [0, 1], ids=["openai", "cloudflare"])
def test_the_python_examples_run_unchanged_but_for_the_address_and_answer_right(edge: EdgeServer, index: int) -> None:
    code = [code for lang, code in BLOCKS if lang == "python"][index]
    out = run([sys.executable, "-c", at(edge, code)]).stdout
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) >= 2, out  # the answer, then the streamed one
    first, streamed = lines[0], "\n".join(lines[1:])
    if index == 0:
        assert states(first, "What is the capital of France?") and states(streamed, "Name three primary colours."), out
    else:
        assert states(first, "What is 2 + 2?") and states(streamed, "What is 2 + 2?"), out


@pytest.mark.parametrize(("page", "question"), placeholders())
def test_the_pages_example_question_is_answered_right(edge: EdgeServer, page: str, question: str) -> None:
    """Asked as the chat and device pages ask it (the question alone), deterministically."""
    answer = httpx.post(f"{edge.url}/v1/chat/completions", timeout=300, json={
        "messages": [{"role": "user", "content": question}], "temperature": 0, "max_tokens": 64}).json()
    assert states(answer["choices"][0]["message"]["content"], question), answer


def test_the_python_pages_example_is_answered_right(edge: EdgeServer) -> None:
    example = python_page_request()
    assert example["body"]["temperature"] == 0
    answer = httpx.post(f"{edge.url}/v1/chat/completions", json=example["body"], timeout=300).json()
    assert states(answer["choices"][0]["message"]["content"], example["question"]), answer
