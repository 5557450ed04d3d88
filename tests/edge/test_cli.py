"""`edgellm dev` as users run it: a subprocess that serves the tiny model, or says clearly why not."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

EDGELLM = Path(sys.executable).with_name("edgellm")  # the console script `pip install` made
STARTUP_DEADLINE_S = 15  # "a few seconds" with room for a loaded CI machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def dev(*args: str) -> list[str]:
    assert EDGELLM.exists(), f"{EDGELLM} is missing: pip install -e '.[local]'"
    return [str(EDGELLM), "dev", "--threads", "1", *args]  # one thread: see tests/conftest.py tiny_runner


def run_to_exit(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


@pytest.fixture
def running(tiny_model: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    port, state = free_port(), tmp_path / "state"
    process = subprocess.Popen(
        dev("--model", str(tiny_model), "--port", str(port), "--state", str(state)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        yield process, f"http://127.0.0.1:{port}", state
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)


def wait_for_health(url: str, process: subprocess.Popen[str]) -> float:
    started = time.monotonic()
    while time.monotonic() - started < STARTUP_DEADLINE_S:
        assert process.poll() is None, process.communicate()
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"/healthz did not answer within {STARTUP_DEADLINE_S} s")


def test_dev_serves_the_model_and_stops_on_ctrl_c(running: tuple[subprocess.Popen[str], str, Path], tiny_model: Path) -> None:
    process, url, state = running
    wait_for_health(url, process)
    models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    assert models[0]["edgellm"]["gguf_name"] == tiny_model.name
    answer = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0,
    }).json()
    assert answer["usage"]["completion_tokens"] == 4
    assert state.is_dir()  # KV (and R2) state lives where --state says

    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=15)
    # a clean shutdown after Ctrl-C is success (so `make dev` reports no error)
    assert process.returncode == 0
    assert "Traceback" not in err
    assert url in out and tiny_model.name in out  # the banner says where and what
    # `dev` lets uvicorn set up its loop: uvloop's, isolating requests as workerd does
    assert "serving on the edgellm_local.emulator.isolation.IsolatingUVLoop event loop, on uvloop.Loop" in err
    # what startup made is out of the collector's way (a full collection would walk it every time)
    frozen = re.search(r"(\d+) objects made at startup frozen out of the collector's way", err)
    assert frozen is not None and int(frozen.group(1)) > 10_000


def test_dev_keeps_a_conversation_warm_behind_its_fault_injector(running: tuple[subprocess.Popen[str], str, Path]) -> None:
    """`dev` puts every binding behind FaultyAI: a conversation's session must pass through it
    to the slot pool, so the second turn reuses the first one's prompt tokens."""
    process, url, _ = running
    wait_for_health(url, process)
    first = httpx.post(f"{url}/v1/responses", timeout=30, json={
        "input": "Tell me about rivers, lakes, seas and the oceans of the world.", "max_output_tokens": 4, "temperature": 0,
    })
    assert first.status_code == 200, first.text
    second = httpx.post(f"{url}/v1/responses", timeout=30, json={
        "input": "And lakes?", "previous_response_id": first.json()["id"], "max_output_tokens": 4, "temperature": 0,
    })
    assert second.status_code == 200, second.text
    reused = second.json()["usage"]["input_tokens_details"]["cached_tokens"]
    assert reused >= first.json()["usage"]["input_tokens"] // 2 > 0  # at least the first turn's question


def test_dev_help_shows_the_defaults() -> None:
    done = run_to_exit([sys.executable, "-m", "edgellm_local.cli", "dev", "--help"])
    text = " ".join(done.stdout.split())
    assert done.returncode == 0
    for default in ("(default: 8787)", "(default: 127.0.0.1)", "(default: .state)", "(default: fast)"):
        assert default in text, default


def test_port_already_taken(tiny_model: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_to_exit(dev("--model", str(tiny_model), "--port", str(port), "--state", str(tmp_path)))
    assert result.returncode != 0
    assert f"port {port}" in result.stderr and "already in use" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.gguf", "model file not found"),
        (lambda d: d, "directory"),
        (lambda d: _write(d / "model.bin", b"PK\x03\x04 not a model at all"), "not a GGUF"),
        (lambda d: _write(d / "empty.gguf", b""), "not a GGUF"),
        (lambda d: _write(d / "truncated.gguf", b"GGUF\x03\x00\x00\x00garbage"), "could not load"),
    ],
    ids=["missing", "directory", "not-gguf", "empty", "truncated"],
)
def test_bad_model_file(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    model = make(tmp_path)
    result = run_to_exit(dev("--model", str(model), "--port", str(free_port()), "--state", str(tmp_path / "state")))
    assert result.returncode != 0
    assert message in result.stderr and str(model) in result.stderr
    assert "Traceback" not in result.stderr


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


WRANGLER_TOML = """name = "edge-under-test"
main = "src/entry.py"

[vars]
MODEL = "@cf/test/from-wrangler"
FALLBACK_MODELS = ""
RUN_MIN_TOKENS_PER_SECOND = "4"
OPEN_ACCESS = "false"
"""


def serve_once(args: list[str], cwd: Path) -> tuple[list[str], str]:
    """Start `edgellm dev` in `cwd`, read the served model ids, stop it; its banner and the ids."""
    port = free_port()
    process = subprocess.Popen(dev(*args, "--port", str(port)), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for_health(url, process)
        ids = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=10).json()["data"]]
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)
    assert process.returncode == 0, err
    return ids, out


def test_dev_runs_with_the_workers_wrangler_vars_unless_told_not_to(tiny_model: Path, tmp_path: Path) -> None:
    """The local edge and the deployed Worker run with the same [vars]: read from ./wrangler.toml
    (or --config, as wrangler's), named in one start line; flags win over them; --no-wrangler-vars
    goes back to the built-in defaults. OPEN_ACCESS follows the edge's address (loopback: open)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "wrangler.toml").write_text(WRANGLER_TOML)
    common = ["--model", str(tiny_model), "--state", str(tmp_path / "state"), "--no-warm-up"]

    ids, out = serve_once(common, project)
    assert ids[0] == "@cf/test/from-wrangler" and "@cf/meta/llama-2-7b-chat-hf-lora" not in ids  # both vars took effect
    lines = [line for line in out.splitlines() if "[vars]" in line]
    assert len(lines) == 1 and str((project / "wrangler.toml").resolve()) in lines[0], out
    assert "OPEN ACCESS" in out  # on loopback, whatever the deployment's OPEN_ACCESS says

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = project / "wrangler.toml"
    ids, out = serve_once([*common, "--config", str(config), "--model-id", "@cf/test/from-the-flag"], elsewhere)
    assert ids[0] == "@cf/test/from-the-flag" and "@cf/meta/llama-2-7b-chat-hf-lora" not in ids  # the flag wins, the file still read
    assert str(config.resolve()) in next(line for line in out.splitlines() if "[vars]" in line)

    ids, out = serve_once([*common, "--no-wrangler-vars"], project)
    assert ids[:2] == ["@cf/meta/llama-2-7b-chat-int8", "@cf/meta/llama-2-7b-chat-hf-lora"]  # the built-in defaults
    assert "--no-wrangler-vars" in next(line for line in out.splitlines() if "[vars]" in line)


def test_a_wrangler_toml_dev_cannot_use_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "wrangler.toml").write_text('[vars]\nRUN_MIN_TOKENS_PER_SECOND = "fast"\n')
    done = subprocess.run(dev("--port", "0", "--state", str(tmp_path / "state")), cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"edgellm: error: wrangler.toml [vars]: RUN_MIN_TOKENS_PER_SECOND must be a number above 0, got 'fast' (or --no-wrangler-vars)"]
    missing = subprocess.run(dev("--port", "0", "--config", str(tmp_path / "nope.toml")), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no such file" in missing.stderr
