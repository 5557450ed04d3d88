"""`edgellm dev`'s first minute: llama.cpp's threads can be set, start-up says how fast this
machine generates (a short warm-up, with its load), and a bad port is a message, not a traceback."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.edge.test_cli import dev, free_port, run_to_exit


def start_up_lines(args: list[str]) -> list[str]:
    """The lines `edgellm dev` prints up to its "listening" line (then it is stopped)."""
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:  # ends if the process exits
            lines.append(line.rstrip("\n"))
            if "listening on" in line:
                break
    finally:
        process.kill()
        process.communicate(timeout=10)
    return lines


def test_start_up_prints_warm_up_tokens_per_second_on_the_threads_asked(tiny_model: Path, tmp_path: Path) -> None:
    lines = start_up_lines(dev("--model", str(tiny_model), "--port", str(free_port()), "--state", str(tmp_path / "s"),
                               "--threads", "1"))
    warm = [line for line in lines if "warm-up" in line]
    assert len(warm) == 1, lines
    match = re.search(r"warm-up on (\d+) threads.*?: (\d+) tokens/s generating \((\d+) tokens\)", warm[0])
    assert match, warm[0]
    assert match.group(1) == "1" and int(match.group(2)) > 0 and int(match.group(3)) > 0
    assert "load " in warm[0]  # the figure says what load it was measured at
    assert any("listening on" in line for line in lines)


def test_no_warm_up_skips_it(tiny_model: Path, tmp_path: Path) -> None:
    lines = start_up_lines(dev("--model", str(tiny_model), "--port", str(free_port()), "--state", str(tmp_path / "s"),
                               "--no-warm-up"))
    assert any("listening on" in line for line in lines) and not any("warm-up" in line for line in lines)


@pytest.mark.parametrize("args, message", [
    (["--port", "99999"], "99999 is not a TCP port (0-65535)"),
    (["--port", "http"], "not a port number"),
    (["--threads", "0"], "must be at least 1"),
])
def test_bad_numbers_are_a_message_not_a_traceback(tiny_model: Path, tmp_path: Path, args: list[str], message: str) -> None:
    result = run_to_exit(dev("--model", str(tiny_model), "--state", str(tmp_path / "s"), *args))
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_help_names_threads_and_its_default() -> None:
    result = run_to_exit(dev("--help"))
    assert "--threads" in result.stdout and "the machine's cores" in result.stdout
