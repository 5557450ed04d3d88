"""The local edge in its own process under a memory and time watchdog, for hostile-input tests.

A regression in these cases (a grammar builder eating memory, a quadratic scan pinning the CPU)
would take an in-process server down with the test run, or hang it. Here the edge is a child
process with an address-space limit (`RLIMIT_AS`): runaway memory kills the child, not the
machine; every wait on it is bounded, so the test FAILS (the edge is gone, or a request timed out)
instead of hanging. The fixture that starts a `WatchedEdge` owns it and stops it.

Run as `python -m tests.support.watched_edge --model M --state S [--env JSON] [--limits JSON]
[--fault SPEC]`: the same app `edgellm dev` serves (`build_app` + `dev_stack`), with the server
limits (`ServerLimits`) a test chooses (a small connection cap, a short body deadline).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_LISTENING = re.compile(r"listening on (http://\S+)")
DEFAULT_MEMORY_LIMIT = 3 * 1024**3  # address space: the tiny model's edge runs in well under 1 GiB resident


def _serve(argv: list[str]) -> int:
    from edgellm.config import Config
    from edgellm_local.edge import EdgeSettings, build_app, dev_stack
    from edgellm_local.doubles.faults import FaultPlan
    from edgellm_local.emulator.hardening import ServerLimits
    from edgellm_local.emulator.server import bind_socket, make_server

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--env", default="{}")
    parser.add_argument("--limits", default="{}")
    parser.add_argument("--fault", action="append", default=[])
    args = parser.parse_args(argv)
    env = {"OPEN_ACCESS": "true", **json.loads(args.env)}
    settings = EdgeSettings(model_path=Path(args.model), state_dir=Path(args.state), config=Config.from_env(env), n_ctx=2048)
    app = build_app(settings)
    app.limits = ServerLimits(**json.loads(args.limits))
    served = dev_stack(app, FaultPlan.parse(args.fault))
    sock = bind_socket("127.0.0.1", 0)
    print(f"watched edge listening on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    make_server(served).run(sockets=[sock])
    return 0


def _limit_memory(limit: int) -> Any:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return apply


@dataclass
class WatchedEdge:
    process: subprocess.Popen[str]
    url: str
    state: Path
    output: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)  # notified on every line of output

    @classmethod
    def start(cls, model: Path, workdir: Path, *, env: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
              faults: tuple[str, ...] = (), memory_limit: int = DEFAULT_MEMORY_LIMIT, start_timeout: float = 60) -> "WatchedEdge":
        state = workdir / "edge-state"
        command = [sys.executable, "-m", "tests.support.watched_edge", "--model", str(model), "--state", str(state),
                   "--env", json.dumps(env or {}), "--limits", json.dumps(limits or {}), *[f"--fault={f}" for f in faults]]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_limit_memory(memory_limit),
                                   cwd=Path(__file__).resolve().parents[2])
        assert process.stdout is not None
        output: list[str] = []
        found: list[str] = []
        ready = threading.Event()
        changed = threading.Condition()

        def read() -> None:  # drains the output for the process's whole life: a full pipe would block it
            for line in process.stdout:  # type: ignore[union-attr]
                with changed:
                    output.append(line)
                    changed.notify_all()
                match = _LISTENING.search(line)
                if match and not found:
                    found.append(match.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(start_timeout) or not found:
            process.kill()
            process.wait(10)
            raise RuntimeError("the watched edge did not start: " + "".join(output))
        return cls(process, found[0], state, output, changed)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return "".join(self.output)

    def wait_log(self, text: str, timeout: float = 30) -> bool:
        """Whether `text` appears in the edge's output within `timeout` (a log line is written
        after the answer it belongs to may have been sent: waited for, never slept on)."""
        with self.changed:
            return self.changed.wait_for(lambda: text in "".join(self.output), timeout)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


if __name__ == "__main__":
    raise SystemExit(_serve(sys.argv[1:]))
