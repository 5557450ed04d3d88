"""Configuration mistakes are refused at start, as a user makes them: `edgellm dev` (and `edgellm
deploy-check` for wrangler.toml) run as subprocesses, each mistake answered within seconds by a
non-zero exit and one line that names it and what is accepted, never a traceback and never a
server that starts and then fails every request."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgellm_local.deploy_check import check_vars, load_config

ROOT = Path(__file__).resolve().parents[2]
EDGELLM = Path(sys.executable).with_name("edgellm")
REFUSED_WITHIN_S = 10  # "within seconds", with room for a loaded machine: none of these loads a model


def refused(*args: str) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run([str(EDGELLM), *args], capture_output=True, text=True, timeout=60)
    assert time.monotonic() - started < REFUSED_WITHIN_S, f"took {time.monotonic() - started:.1f} s: {done.stderr[-500:]}"
    return done


def assert_one_line_refusal(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize(("args", "fragments"), [
    (("--var", "EDGE_STAL_MS=500"), ("--var EDGE_STAL_MS", "unknown [vars] name", "did you mean EDGE_STALL_MS?")),
    (("--var", "ZZZ_NOTHING_LIKE_IT=1"), ("unknown [vars] name", "EDGE_STALL_MS", "MAX_MESSAGES")),  # no near one: all of them
    (("--var", "EDGE_STALL_MS"), ("--var 'EDGE_STALL_MS' is not NAME=VALUE",)),
    (("--origin", "ftp://llm.example.com/v1"), ("--origin 'ftp://llm.example.com/v1'", "http:// or https://")),
    (("--origin", "localhost:8080"), ("--origin 'localhost:8080'", "http:// or https://", "e.g. http://127.0.0.1:8080/v1")),
    (("--var", 'ORIGINS=["llm.example.com"]'), ("ORIGINS[0] url", "http:// or https://")),
    (("--ctx-size", "64"), ("--ctx-size 64", "too few to answer anything", "--ctx-size 256 or more")),
    (("--ctx-size", "512", "--slots", "8"), ("each of the 8 slot(s) 64 tokens", "--ctx-size 1024 or more")),
    (("--model", "smollm"), ("unknown stand-in model 'smollm'", "smollm2-135m", "gemma3-270m", ".gguf")),
    (("--port", "65536"), ("--port", "65536 is not a TCP port (0-65535)", "edgellm dev --help")),
    (("--port", "eighty"), ("--port", "not a port number: 'eighty'")),
    (("--slots", "0"), ("--slots", "at least 1")),
    (("--var", "MAX_WAITING_GENERATIONS=many"), ("MAX_WAITING_GENERATIONS must be a whole number of at least 1", "'many'")),
    (("--var", "OPEN_ACCESS=ture"), ("OPEN_ACCESS must be true or false", "'ture'")),
    (("--var", "CONTEXT_WINDOW=4k"), ("CONTEXT_WINDOW must be a whole number of at least 1",)),
    (("--var", "BREAKER=[5]"), ("BREAKER must be a JSON object",)),
    (("--var", 'GUARDRAILS={"moderation": {"prompt": {"S1": "block"}}}'), ("GUARDRAILS moderates", "--guard-model PATH")),
    (("--var", 'GUARDRAILS={"dlp": {"credit_card": "mask"}}'), ("GUARDRAILS dlp: unknown detector 'credit_card'",)),
    (("--var", "GUARD_FAIL=maybe"), ("GUARD_FAIL must be closed or open", "'maybe'")),
], ids=["unknown-var", "unknown-var-far", "var-without-value", "origin-ftp", "origin-no-scheme", "origins-var-no-scheme",
        "ctx-size", "ctx-size-per-slot", "model-neither", "port-range", "port-text", "slots", "var-type", "var-flag",
        "var-number", "var-json", "guardrails-no-guard", "guardrails-bad", "guard-fail"])
def test_a_dev_mistake_is_one_line_at_once(tmp_path: Path, args: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    done = refused("dev", "--no-warm-up", "--port", "0", "--state", str(tmp_path / "state"), *args)
    assert_one_line_refusal(done, *fragments)
    assert not (tmp_path / "state").exists()  # refused before anything was made


def test_a_file_that_is_no_gguf_is_refused_by_name(tmp_path: Path) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("not a model\n")
    done = refused("dev", "--no-warm-up", "--port", "0", "--state", str(tmp_path / "state"), "--model", str(notes))
    assert_one_line_refusal(done, "not a GGUF model file", str(notes))


def wrangler_toml_with(tmp_path: Path, line: str) -> Path:
    """The committed wrangler.toml with one [vars] line set (replacing the committed value, if any)."""
    name = line.split("=", 1)[0].strip()
    kept = [old for old in (ROOT / "wrangler.toml").read_text().splitlines() if not old.startswith(f"{name} =")]
    text = "\n".join(kept).replace("[vars]\n", f"[vars]\n{line}\n", 1)
    path = tmp_path / "wrangler.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(("lines", "fragment"), [
    ('MAX_MESSAGES = "lots"', "MAX_MESSAGES must be a whole number of at least 1, got 'lots'"),
    ('ORIGINS = [{name = "central", url = "https://llm.example.com/v1"}]', "ORIGINS must be a JSON list"),
    ('OPEN_ACCESS = "sure"', "OPEN_ACCESS must be true or false"),
    ('EDGE_STAL_MS = "500"', "unknown [vars] name 'EDGE_STAL_MS': did you mean EDGE_STALL_MS?"),
    ('ADMIN_TOKEN = "hunter2"', "ADMIN_TOKEN is a secret, not a [vars] value"),
    ('MODEL = 7', "MODEL must be a Workers AI model id"),
], ids=["number", "toml-array", "flag", "unknown-name", "secret", "model-type"])
def test_deploy_check_refuses_a_wrangler_toml_vars_mistake(tmp_path: Path, lines: str, fragment: str) -> None:
    config = wrangler_toml_with(tmp_path, lines)
    failing = [c for c in check_vars(load_config(config)) if not c.ok]
    assert [fragment in c.detail for c in failing] == [True], [c.detail for c in failing]
    # and through the command, as `make deploy` runs it (wrangler stood in by `false`: no account needed)
    done = subprocess.run([str(EDGELLM), "deploy-check", "--config", str(config), "--wrangler", shutil.which("false") or "false"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert f"[FAIL] [vars]: {failing[0].detail}" in done.stdout.splitlines()


def test_the_committed_wrangler_toml_vars_pass() -> None:
    assert [c.line() for c in check_vars(load_config(ROOT / "wrangler.toml"))] == [
        f"[ok  ] [vars]: {len(load_config(ROOT / 'wrangler.toml')['vars'])} value(s), each known and readable"]


# Settings each valid alone that together make an edge fail every request of a kind, or publish
# what it must not: `edgellm dev` refuses them at start as it refuses a bad value (the Worker answers
# them `worker_misconfigured`: tests/unit/test_worker_misconfigured.py; the core's table:
# tests/unit/test_config.py).
@pytest.mark.parametrize(("args", "fragments"), [
    (("--var", "EMBEDDING_MODELS=@cf/meta/llama-2-7b-chat-int8,@cf/baai/bge-small-en-v1.5"),
     ("MODEL @cf/meta/llama-2-7b-chat-int8 is listed in EMBEDDING_MODELS", "every chat request would be a 400")),
    (("--model-id", "@cf/baai/bge-small-en-v1.5"), ("MODEL @cf/baai/bge-small-en-v1.5", "embedding model")),
    (("--require-keys", "--var", "METRICS_OPEN=true"), ("METRICS_OPEN is true while API keys are required", "admin token")),
    (("--var", "OPEN_ACCESS=false", "--var", "METRICS_OPEN=true"), ("METRICS_OPEN is true while API keys are required",)),
], ids=["model-is-embedding", "model-id-is-embedding", "metrics-open-with-keys", "metrics-open-with-keys-var"])
def test_a_dev_config_mistake_across_settings_is_one_line_at_once(tmp_path: Path, args: tuple[str, ...],
                                                                   fragments: tuple[str, ...]) -> None:
    done = refused("dev", "--no-warm-up", "--port", "0", "--state", str(tmp_path / "state"), "--no-wrangler-vars", *args)
    assert_one_line_refusal(done, *fragments)
    assert not (tmp_path / "state").exists()


def test_dev_refuses_a_local_index_of_another_width_than_its_embedding_model(tmp_path: Path, tiny_model: Path) -> None:
    """The local semantic index keeps the dimension of its first vector (as Vectorize keeps the one
    it was made with): an embedding model of another width would fail every semantic lookup."""
    import asyncio

    from edgellm.ports import VectorRecord
    from edgellm_local.emulator.vector_index import SqliteVectorIndex
    from tests.support.minilm import minilm_gguf

    state = tmp_path / "state"
    index = SqliteVectorIndex(state / "vectors.sqlite3")
    asyncio.run(index.upsert([VectorRecord("a", [0.5] * 768, "ns", {})]))  # bge-base's width, not MiniLM's 384
    index.close()
    done = refused("dev", "--no-warm-up", "--port", "0", "--state", str(state), "--no-wrangler-vars",
                   "--model", str(tiny_model), "--embedding-model", str(minilm_gguf(tmp_path / "embedding")))
    assert_one_line_refusal(done, "makes 384-dimensional vectors", "vectors.sqlite3", "holds 768", "EMBEDDING_MODELS")


@pytest.mark.parametrize(("lines", "fragment"), [
    ('EMBEDDING_MODELS = "@cf/meta/llama-2-7b-chat-int8"', "MODEL @cf/meta/llama-2-7b-chat-int8 is listed in EMBEDDING_MODELS"),
    ('FALLBACK_MODELS = "@cf/baai/bge-small-en-v1.5"', "FALLBACK_MODELS names @cf/baai/bge-small-en-v1.5"),
    ('METRICS_OPEN = "true"', "METRICS_OPEN is true while API keys are required"),
], ids=["model-is-embedding", "fallback-is-embedding", "metrics-open-with-keys"])
def test_deploy_check_refuses_settings_that_fail_together(tmp_path: Path, lines: str, fragment: str) -> None:
    config = wrangler_toml_with(tmp_path, lines)
    failing = [c for c in check_vars(load_config(config)) if not c.ok]
    assert [fragment in c.detail for c in failing] == [True], [c.detail for c in failing]
