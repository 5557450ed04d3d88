"""Start the real local edge (`edgellm dev`) in its own process for benchmarks, so the load
generator and the server do not share a GIL."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Iterator

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (Linux /proc): a server's cost per request, which a
    busy shared machine blurs far less than wall-clock latency."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def running_edge(model: str | os.PathLike[str] | None = None, state: str | os.PathLike[str] | None = None,
                 extra: list[str] | None = None, code: str | os.PathLike[str] | None = None,
                 pids: dict[str, int] | None = None) -> Iterator[str]:
    """`edgellm dev` on a free port (over `state`, or a fresh temporary one); yields its URL.
    `code`: a directory holding another version's `src/` and `local/` (e.g. `git archive` of a
    commit), run instead of this checkout's, for a before/after comparison in one run."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="edgellm-bench-") as scratch:
        state = state or scratch
        command = [sys.executable, "-m", "edgellm_local.cli", "dev", "--port", str(port), "--state", str(state)]
        if model:
            command += ["--model", str(model)]
        # Its output goes to a file, never to a pipe nobody reads: the edge logs a line per request,
        # and a full pipe (64 KiB, some 700 requests) would block it mid-request.
        output = open(os.path.join(scratch, "edge.log"), "w+b")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if code is not None:
            env["PYTHONPATH"] = os.pathsep.join([os.path.join(code, "src"), os.path.join(code, "local"), os.getcwd()])
        process = subprocess.Popen(command + (extra or []), stdout=output, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        if pids is not None:
            pids[url] = process.pid  # for `cpu_seconds`
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if process.poll() is not None:
                    output.seek(0)
                    raise RuntimeError(output.read().decode(errors="replace") or "edge exited")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                        break
                time.sleep(0.1)
            yield url
        finally:
            process.terminate()
            process.wait(10)
            output.close()
