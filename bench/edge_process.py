"""Start the real local edge (`edgellm dev`) in its own process for benchmarks, so the load
generator and the server do not share a GIL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, Iterator, Mapping

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load_average() -> float:
    """The 1-minute load average, to print beside every figure taken on a shared machine."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def cpu_seconds(pid: int) -> float:
    """User + system CPU a process has used (Linux /proc): a server's cost per request, which a
    busy shared machine blurs far less than wall-clock latency."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interrupt_on_stop_signals() -> None:
    """SIGTERM and SIGHUP (a `kill`, a CI timeout, a closed terminal) end a benchmark as Ctrl-C
    does: KeyboardInterrupt, raised where the run is, so every `finally` and `with` that stops a
    server runs. Left at their defaults they end the benchmark's process alone, and the servers
    it started run on, orphaned. For a benchmark's `__main__` only: a test calling its `main`
    keeps pytest's own handling."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for stop_signal in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop_signal, interrupt)


def stop(process: subprocess.Popen[Any], within: float) -> None:
    """Ask `process` to stop (SIGTERM), and kill it when it has not within `within` seconds: a
    benchmark never leaves a server running on the shared machine."""
    process.terminate()
    try:
        process.wait(within)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


@contextlib.contextmanager
def running_process(name: str, command: list[str], health_url: str, *, ready_within: float,
                    stop_within: float = 10, env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                    log: str | os.PathLike[str] | None = None, pids: dict[str, int] | None = None,
                    url: str | None = None) -> Iterator[subprocess.Popen[Any]]:
    """Run `command` until the block ends: wait (at most `ready_within` seconds) for `health_url`
    to answer 200, yield the process, then stop it (terminate, then kill) whatever happens. Its
    output goes to the file `log` (a temporary one when None), never to a pipe nobody reads: a
    server logging a line per request would fill a pipe (64 KiB) and block mid-request. When it
    exits or the deadline passes first, the error holds the output's tail. `pids[url]` gets its
    pid (for `cpu_seconds`)."""
    with (open(log, "w+b") if log is not None else tempfile.TemporaryFile()) as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        if pids is not None:
            pids[url or health_url] = process.pid
        try:
            _wait_healthy(name, process, output, health_url, time.monotonic() + ready_within)
            yield process
        finally:
            stop(process, stop_within)


def _wait_healthy(name: str, process: subprocess.Popen[Any], output: IO[bytes], health_url: str, deadline: float) -> None:
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {_tail(output)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(health_url, timeout=1).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not become healthy in time: {_tail(output)}")
        time.sleep(0.1)


def _tail(output: IO[bytes]) -> str:
    output.seek(0)
    return output.read()[-2000:].decode(errors="replace") or "(no output)"


@contextlib.contextmanager
def running_edge(model: str | os.PathLike[str] | None = None, state: str | os.PathLike[str] | None = None,
                 extra: list[str] | None = None, code: str | os.PathLike[str] | None = None,
                 pids: dict[str, int] | None = None, env: Mapping[str, str] | None = None,
                 ready_within: float = 60, stop_within: float = 10) -> Iterator[str]:
    """`edgellm dev` on a free port (over `state`, or a fresh temporary one); yields its URL.
    `code`: a directory holding another version's `src/` and `local/` (e.g. `git archive` of a
    commit), run instead of this checkout's, for a before/after comparison in one run. `env`:
    variables set for it on top of this process's ([vars] such as ORIGINS)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="edgellm-bench-") as scratch:
        command = [sys.executable, "-m", "edgellm_local.cli", "dev", "--port", str(port), "--state", str(state or scratch)]
        if model:
            command += ["--model", str(model)]
        environ = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        if code is not None:
            environ["PYTHONPATH"] = os.pathsep.join([os.path.join(code, "src"), os.path.join(code, "local"), os.getcwd()])
        with running_process("the edge", command + (extra or []), url + "/healthz", ready_within=ready_within,
                             stop_within=stop_within, env=environ, log=os.path.join(scratch, "edge.log"), pids=pids, url=url):
            yield url
