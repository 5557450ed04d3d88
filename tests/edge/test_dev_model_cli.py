"""`edgellm dev --model NAME` as a user types it: a stand-in's name (local/edgellm_local/llama/stand_ins.py)
serves its registry package's GGUF, found on disk with every network route closed; an unknown name
stops at once with exit 2 and the list of names, not a "model file not found" about a file nobody meant."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from edgellm_local.llama.stand_ins import STAND_INS

from tests.edge.test_cli import dev, free_port, run_to_exit

# Any download would fail at once: proxies to a closed port, hubs offline.
NO_NETWORK = {**os.environ, "HTTP_PROXY": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9",
              "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": "",
              "HF_HUB_OFFLINE": "1", "PIP_NO_INDEX": "1"}


def serving_line(args: list[str]) -> str:
    """The start-up line naming the GGUF llama.cpp serves (then the process is stopped)."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=NO_NETWORK)
    try:
        assert process.stdout is not None
        for line in process.stdout:  # ends if the process exits
            if "-> llama.cpp with" in line:
                return line.strip()
    finally:
        process.kill()
        _, err = process.communicate(timeout=10)
    raise AssertionError(f"edgellm dev exited with {process.returncode} before serving: {err[-2000:]}")


def test_a_stand_in_name_serves_its_packages_gguf(tmp_path: Path) -> None:
    line = serving_line(dev("--model", "smollm2-135m", "--no-warm-up", "--port", str(free_port()),
                            "--state", str(tmp_path / "s")))
    assert line.endswith("llama.cpp with SmolLM2-135M-Instruct.Q4_1.gguf"), line


def test_an_unknown_name_is_exit_2_listing_the_names(tmp_path: Path) -> None:
    done = subprocess.run(dev("--model", "smollm3-135m", "--no-warm-up", "--port", str(free_port()),
                              "--state", str(tmp_path / "s")), capture_output=True, text=True, timeout=60, env=NO_NETWORK)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.startswith("edgellm: error: unknown stand-in model 'smollm3-135m'"), done.stderr
    for name in STAND_INS:
        assert name in done.stderr
    assert "Traceback" not in done.stderr and "model file not found" not in done.stderr
    assert not (tmp_path / "s").exists() or not any((tmp_path / "s").iterdir())  # it stopped before any state


def test_a_missing_gguf_path_is_still_a_missing_file(tmp_path: Path) -> None:
    done = run_to_exit(dev("--model", str(tmp_path / "nope.gguf"), "--port", str(free_port()), "--state", str(tmp_path / "s")))
    assert done.returncode == 2 and "model file not found" in done.stderr, done.stderr
