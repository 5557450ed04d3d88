"""Ctrl-C on `make dev` is a clean stop, as a developer ends it every day: the terminal sends
SIGINT to make and the edge alike (the foreground process group), the edge drains and exits 0,
and make says nothing about it (it printed "*** [Makefile: dev] Error 130" while the edge exited
130). The real Makefile's recipe runs, its set-up steps taken as done (`-o`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.edge.test_cli import free_port, wait_for_health

ROOT = Path(__file__).resolve().parents[2]


def test_ctrl_c_on_make_dev_stops_without_an_error(tiny_model: Path, tmp_path: Path) -> None:
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is missing (it is how the README's two commands run)")
    port, state = free_port(), tmp_path / "state"
    done_already = ["-o", "setup", "-o", "vendor-python", "-o", "vendor-wllama", "-o", f"{state}/.published-smollm2-135m"]
    process = subprocess.Popen([make, "--no-print-directory", "-C", str(ROOT), *done_already, "dev", f"PORT={port}",
                                f"STATE={state}", f"MODEL={tiny_model}", "ARGS=--threads 1 --no-warm-up"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_health(f"http://127.0.0.1:{port}", process)
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate(timeout=10)
    assert "EdgeLLM local edge stopped" in out, (out, err)
    assert "***" not in err and "Error 130" not in err, err
    assert "Traceback" not in out + err
