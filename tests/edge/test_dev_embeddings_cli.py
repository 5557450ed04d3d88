"""`edgellm dev` with its embedding stand-in, as users run it: the openai client's embeddings in
float and base64, the cloudflare SDK's `ai.run` with the bge id, and the semantic cache over the
state directory's SQLite index, all through the real CLI process; `--embedding-model none`
serves no embeddings."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.edge.test_cli import dev, free_port, wait_for_health
from tests.support.minilm import BGE, minilm_gguf


@pytest.fixture(scope="module")
def minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return minilm_gguf(tmp_path_factory.mktemp("embedding"))


def start(tiny_model: Path, state: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    process = subprocess.Popen(dev("--model", str(tiny_model), "--port", str(port), "--state", str(state), *extra),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture
def served(tiny_model: Path, minilm: Path, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    # the error bound off: with it on, a new namespace serves no semantic hit before its evidence
    # (docs/embeddings.md), and this test is about the plumbing, not the bound
    process, url = start(tiny_model, tmp_path / "state", "--embedding-model", str(minilm), "--var", "SEMANTIC_MAX_ERROR=off")
    try:
        wait_for_health(url, process)
        yield url, tmp_path / "state"
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate(timeout=10)


def test_clients_and_the_semantic_cache_against_edgellm_dev(served: tuple[str, Path]) -> None:
    from cloudflare import Cloudflare
    from openai import OpenAI

    url, state = served
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    floats = client.embeddings.create(model=BGE, input=["hello world"], encoding_format="float").data[0].embedding
    packed = client.embeddings.create(model=BGE, input=["hello world"]).data[0].embedding
    assert len(floats) == 384 and max(abs(a - b) for a, b in zip(floats, packed)) < 1e-6
    result = Cloudflare(api_token="unused", base_url=url + "/client/v4", max_retries=0).ai.run(BGE, account_id="local", text="hello world")
    assert result["shape"] == [1, 384]  # type: ignore[index]

    def ask(text: str, **headers: str) -> httpx.Response:
        return httpx.post(url + "/v1/chat/completions", timeout=60, headers={"x-edgellm-semantic-cache": "on", **headers},
                          json={"messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": 4})

    assert ask("What is the capital of France?").headers["cf-aig-cache-status"] == "MISS"
    # The vector is written after the answer (waitUntil): poll for its HIT, each try a real request.
    # A try that misses must store nothing (`no-store`): stored, its own exact entry would answer
    # the next try, and no later try could be the semantic HIT this waits for.
    for _ in range(100):
        again = ask("What is the capital city of France?", **{"cache-control": "no-store"})
        if again.headers["cf-aig-cache-status"] == "HIT":
            break
    else:
        raise AssertionError("the paraphrase never met the first question's vector")
    assert again.headers["x-edgellm-cache-match"].startswith("semantic; score=")
    assert (state / "vectors.sqlite3").is_file()  # the index lives with the edge's other state


def test_embedding_model_none_serves_no_embeddings(tiny_model: Path, tmp_path: Path) -> None:
    process, url = start(tiny_model, tmp_path / "state", "--embedding-model", "none")
    try:
        wait_for_health(url, process)
        response = httpx.post(url + "/v1/embeddings", json={"model": BGE, "input": "x"}, timeout=30)
        assert response.status_code == 404 and response.json()["error"]["param"] == "model"
        assert BGE not in [m["id"] for m in httpx.get(url + "/v1/models", timeout=30).json()["data"]]
    finally:
        process.kill()
        process.communicate(timeout=10)
