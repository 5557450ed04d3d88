"""Reproduce, with xllamacpp alone, the hang of an `xllamacpp.Server` dropped right after it starts.

Upstream-ready: each try is a fresh Python process that does nothing but

    server = xllamacpp.Server(params)   # returns once the init thread has set its promise
    del server                          # ~Server(): terminate() the queue, then join the init thread

and must exit. `Server::Server` returns as soon as the init thread sets its promise, which that
thread does just *before* it enters `server_context::start_loop()`; `~Server` calls
`terminate()` and joins. When the drop wins that window the stop is lost (the loop is entered
after `running` was cleared, or (re)arms its state on entry), and the process sits for ever: the
main thread in `xllamacpp::Server::~Server` (joining), the init thread in
`server_queue::start_loop` waiting for tasks. `--wait-ready` applies the mitigation the local
edge uses (`edgellm_local.llama.embedded_server.wait_until_serving`): one request that goes through the task queue
(`handle_metrics`, a METRICS task) before the drop, so the loop is known to be running.

Each try runs in a subprocess with a hard timeout of its own (then killed), so
the script never hangs the shell that runs it. `--load N` starts N busy loops for the run (and
stops them), which widens the window on a small machine.

    python -m tests.support.xllamacpp_drop_hang --tries 100            # writes a tiny GGUF
    python -m tests.support.xllamacpp_drop_hang --tries 100 --load 2 --model some.gguf
    python -m tests.support.xllamacpp_drop_hang --tries 100 --load 2 --wait-ready
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.cpu_hog import CpuHog

# The whole of a try: this text is what an upstream report would carry.
TRY_SOURCE = """
import sys, xllamacpp
params = xllamacpp.CommonParams()
params.model.path = sys.argv[1]
params.n_ctx = 512
params.n_parallel = 1
params.verbosity = -1
if sys.argv[2] == "wait-ready":
    params.endpoint_metrics = True
server = xllamacpp.Server(params)
if sys.argv[2] == "wait-ready":
    server.handle_metrics()  # a task through the queue: answered only once start_loop runs
del server
print("dropped", flush=True)
"""


@dataclass
class TryOutcome:
    """One try: `hung` when it did not exit within the timeout (then it was killed)."""

    index: int
    seconds: float
    hung: bool
    returncode: int | None


@dataclass
class RunReport:
    tries: list[TryOutcome] = field(default_factory=list)

    @property
    def hangs(self) -> list[int]:
        return [t.index for t in self.tries if t.hung]

    @property
    def failures(self) -> list[int]:
        """Tries that exited, but not cleanly (a crash is not the hang, but it is not fine either)."""
        return [t.index for t in self.tries if not t.hung and t.returncode != 0]

    def summary(self, label: str) -> str:
        first = self.hangs[0] if self.hangs else None
        slowest = max((t.seconds for t in self.tries if not t.hung), default=0.0)
        return (f"{label}: {len(self.hangs)} hung of {len(self.tries)} tries"
                f" (first at try {first}); {len(self.failures)} other failures;"
                f" slowest clean exit {slowest:.2f} s")


def run_try(index: int, model: Path, mode: str, timeout: float) -> TryOutcome:
    """One fresh interpreter creating and dropping one Server; killed on timeout."""
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", TRY_SOURCE, str(model), mode],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        code = proc.wait(timeout=timeout)
        return TryOutcome(index, time.monotonic() - started, False, code)
    except subprocess.TimeoutExpired:
        proc.kill()  # one process, no children: llama.cpp's threads die with it
        proc.wait()
        return TryOutcome(index, time.monotonic() - started, True, None)
    finally:
        if proc.poll() is None:  # this script interrupted mid-try: never leave a hung try behind
            proc.kill()
            proc.wait()


def run(model: Path, tries: int, mode: str, timeout: float, load: int, stop_at_first: bool) -> RunReport:
    report = RunReport()
    with CpuHog(load):
        for index in range(1, tries + 1):
            outcome = run_try(index, model, mode, timeout)
            report.tries.append(outcome)
            if outcome.hung and stop_at_first:
                break
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: write a tiny random one)")
    parser.add_argument("--tries", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds before a try counts as hung")
    parser.add_argument("--load", type=int, default=0, help="busy loops to run meanwhile")
    parser.add_argument("--wait-ready", action="store_true", help="drop only after a queued request answered")
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first hang")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            from tests.support.tiny_gguf import write_tiny_gguf

            model = write_tiny_gguf(Path(scratch) / "tiny.gguf")
        mode = "wait-ready" if args.wait_ready else "drop-at-once"
        report = run(model, args.tries, mode, args.timeout, args.load, args.stop_at_first)
    print(report.summary(f"{mode}, load {args.load}, {model.name}"))
    return 1 if report.hangs else 0


if __name__ == "__main__":
    raise SystemExit(main())
