"""A real origin for routing tests: a second local edge (`edgellm dev`) in its own process,
on an OS-chosen port, logging every request it receives (`--request-log`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LISTENING = re.compile(r"listening on (http://\S+)")


@dataclass
class OriginProcess:
    process: subprocess.Popen[str]
    url: str
    log: Path

    @classmethod
    def start(cls, model: Path, workdir: Path, *extra: str) -> "OriginProcess":
        log = workdir / "origin-requests.jsonl"
        log.touch()
        command = [sys.executable, "-m", "edgellm_local.cli", "dev", "--model", str(model), "--port", "0",
                   "--state", str(workdir / "origin-state"), "--request-log", str(log), "--threads", "1", *extra]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert process.stdout is not None
        lines = []
        for line in process.stdout:  # the first line names the bound port (no sleeping, no fixed port)
            lines.append(line)
            match = _LISTENING.search(line)
            if match:  # keep draining its output so a chatty origin never blocks on a full pipe
                threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()  # type: ignore[union-attr]
                return cls(process, match.group(1), log)
        process.wait(10)
        raise RuntimeError("the origin did not start: " + "".join(lines))

    def requests(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def generation_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests() if r["path"].startswith("/v1/") and r["method"] == "POST"]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=10)
