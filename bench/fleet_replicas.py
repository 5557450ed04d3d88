"""A fleet of real replicas for the fleet benchmark and tests: llama.cpp servers (xllamacpp's
build of llama-server: slots, `cache_prompt`, `/metrics` with requests processing and deferred,
`prompt_tokens_cached_total`), each a process of its own, one thread each, on OS-chosen ports.

A replica is slowed by an injected fault outside it: its process is stopped and continued on a
duty cycle (SIGSTOP / SIGCONT), as a machine that loses most of its CPU to a noisy neighbour.
`LyingReplica` is a small HTTP server that answers chat completions but reports nonsense load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Replica:
    process: subprocess.Popen[str]
    url: str
    name: str
    _slowing: threading.Event | None = field(default=None, repr=False)
    _slower: threading.Thread | None = field(default=None, repr=False)

    @classmethod
    def start(cls, model: Path, name: str, ctx: int = 4096, parallel: int = 2, threads: int = 1,
              cache_ram_mib: int = 8192) -> "Replica":
        """`cache_ram_mib` bounds its RAM prompt cache (llama-server's default, 8192, holds every
        prompt a test or a workload sends; a serving replica's cache holds only some)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src"), str(ROOT / "local"), os.environ.get("PYTHONPATH", "")])}
        process = subprocess.Popen([sys.executable, "-m", "bench.xllamacpp_server", str(model), str(ctx), str(parallel), str(threads),
                                    str(cache_ram_mib)],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT, env=env)
        assert process.stdout is not None
        try:
            line = process.stdout.readline()  # "URL http://127.0.0.1:PORT": it is listening
            if not line.startswith("URL "):
                raise RuntimeError(f"replica {name} did not start: {line!r}")
        except BaseException:  # a failed start, or the run stopped while it started (SIGTERM, Ctrl-C)
            process.kill()
            process.wait(10)
            raise
        return cls(process, line.split()[1], name)

    @classmethod
    def start_all(cls, model: Path, names: list[str], **settings: Any) -> list["Replica"]:
        """One replica per name, or none: when one fails to start, or the run is stopped while
        they start, those already started are stopped before the error goes on."""
        started: list[Replica] = []
        try:
            for name in names:
                started.append(cls.start(model, name, **settings))
        except BaseException:
            for replica in started:
                replica.stop()
            raise
        return started

    def metrics(self) -> dict[str, float]:
        """Its own counters (`llamacpp:*`), summed by name."""
        out: dict[str, float] = {}
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                try:
                    out[name.split("{")[0]] = out.get(name.split("{")[0], 0.0) + float(value)
                except ValueError:
                    pass
        return out

    def slow(self, stopped_s: float = 0.04, running_s: float = 0.01) -> None:
        """Stop it `stopped_s` out of every `stopped_s + running_s` seconds until `unslow`."""
        if self._slowing is not None:
            return
        stop = self._slowing = threading.Event()

        def cycle() -> None:
            while not stop.is_set() and self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGSTOP)
                stop.wait(stopped_s)
                os.kill(self.process.pid, signal.SIGCONT)
                stop.wait(running_s)
            if self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGCONT)

        self._slower = threading.Thread(target=cycle, daemon=True)
        self._slower.start()

    def unslow(self) -> None:
        if self._slowing is not None and self._slower is not None:
            self._slowing.set()
            self._slower.join(10)
            self._slowing = self._slower = None

    def stop(self) -> None:
        self.unslow()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


LYING_SERVER = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
METRICS = sys.argv[1]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = METRICS.encode()
        self.send_response(200); self.send_header("content-type", "text/plain"); self.send_header("content-length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200); self.send_header("content-type", "text/event-stream"); self.end_headers()
        for piece in ("lie", "s"):
            self.wfile.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": piece}}]}).encode() + b"\n\n")
        self.wfile.write(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(f"URL http://127.0.0.1:{server.server_address[1]}", flush=True)
server.serve_forever()
'''


@dataclass
class LyingReplica:
    """Answers every chat completion (two tokens) and reports `metrics` as its load."""

    process: subprocess.Popen[str]
    url: str
    name: str

    @classmethod
    def start(cls, name: str, metrics: str) -> "LyingReplica":
        process = subprocess.Popen([sys.executable, "-c", LYING_SERVER, metrics], stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        return cls(process, process.stdout.readline().split()[1], name)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


def pool_origins(replicas: list[Any], pool: str = "fleet", **settings: Any) -> str:
    """`ORIGINS` for a pool of `replicas` (llama.cpp's /metrics), primary (the edge is not tried)."""
    return json.dumps([{"pool": pool, "kind": "llama.cpp", "primary": True, "context_window": 4096, **settings,
                        "replicas": [{"name": r.name, "url": r.url} for r in replicas]}])
