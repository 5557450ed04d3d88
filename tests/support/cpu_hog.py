"""A CPU hog for tests and scripts that must hold under load: N busy-loop processes for the
length of a `with` block, stopped (killed and reaped) when it ends, whatever happened inside. They
stay in the caller's process group, so whatever kills that group (`.ci/run`'s budget) kills them too."""

from __future__ import annotations

import subprocess
import sys


class CpuHog:
    """`with CpuHog(2):` runs two processes spinning a core each (two busy loops)."""

    def __init__(self, count: int = 2) -> None:
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> "CpuHog":
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                      for _ in range(self.count)]
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
