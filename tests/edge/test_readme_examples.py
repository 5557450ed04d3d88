"""The README's first requests run as a reader runs them: its curl lines through bash and its
Python examples (the openai client, Cloudflare's SDK plain and streamed) as scripts, against a
local edge, with only the address changed. The tiny test model's words are not asserted; the
shapes are (an answer, the cache's MISS then HIT, a stream)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgellm_local.emulator.server import EdgeServer

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SECTION = README[README.index("## A first request"):README.index("## What works on Cloudflare")]
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", SECTION, re.M | re.S)
LOCAL = re.compile(r"(?:http://)?(?:localhost|127\.0\.0\.1):8787")


def at(edge: EdgeServer, code: str) -> str:
    """The example with the README's address replaced by the test edge's."""
    return LOCAL.sub(edge.url, code)


def curl_commands() -> list[str]:
    (shell,) = [code for lang, code in BLOCKS if lang == "sh"]
    return re.split(r"\n(?=curl )", shell.strip())


def test_the_readme_has_the_examples_this_test_runs() -> None:
    assert len(curl_commands()) == 3
    pythons = [code for lang, code in BLOCKS if lang == "python"]
    assert len(pythons) == 2 and "from openai import OpenAI" in pythons[0] and "from cloudflare import Cloudflare" in pythons[1]
    assert "with_streaming_response.run" in pythons[1]


def run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and "Traceback" not in done.stderr, (done.returncode, done.stdout, done.stderr)
    return done


def test_the_curl_lines_answer_and_the_second_ask_is_a_hit(edge: EdgeServer) -> None:
    chat, stream, workers_ai = curl_commands()
    first = run(["bash", "-c", at(edge, chat)]).stdout
    assert first.startswith("HTTP/1.1 200") and re.search(r"(?im)^cf-aig-cache-status: MISS", first), first
    assert '"choices"' in first
    second = run(["bash", "-c", at(edge, chat)]).stdout
    assert re.search(r"(?im)^cf-aig-cache-status: HIT", second), second
    streamed = run(["bash", "-c", at(edge, stream)]).stdout
    assert streamed.count("data: {") >= 2 and streamed.rstrip().endswith("data: [DONE]"), streamed
    answered = run(["bash", "-c", at(edge, workers_ai)]).stdout
    assert '"success":true' in answered.replace(" ", "") and '"response"' in answered, answered


@pytest.mark.parametrize("index", [0, 1], ids=["openai", "cloudflare"])
def test_the_python_examples_run_unchanged_but_for_the_address(edge: EdgeServer, index: int) -> None:
    code = [code for lang, code in BLOCKS if lang == "python"][index]
    out = run([sys.executable, "-c", at(edge, code)]).stdout
    lines = out.splitlines()
    assert len(lines) >= 2 and all(line.strip() for line in lines[:2]), out  # the answer, then the streamed one
