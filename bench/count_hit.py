"""Instructions per request of a cache HIT and of `/healthz` in the edge's core, counted, not timed.

On a shared VM the clock speed and the neighbours change from run to run, so a few microseconds
of a HIT disappear in timing noise; an instruction count does not move. This runs the local edge's
app in-process (`EdgeApp._answer`: routing, the core, encoding, headers; no socket) under
valgrind's callgrind with instrumentation off, switches it on around N requests of one kind
(`callgrind_control -i on/off`), and prints what those requests executed, per request, for a HIT,
a HIT asked for gzip (`Accept-Encoding: gzip, deflate`, as httpx and the OpenAI SDK ask) and
`/healthz` (llama.cpp's idle threads wait passively, `OMP_WAIT_POLICY=passive`, so they count
nothing). The usage writer's and the access log's threads are counted too: they are part of
what a request costs (the writer commits by batch size while counting, and what is left inside
the count, so the figure does not depend on how slowly valgrind runs). `--before DIR` counts another version's `src/` and `local/` the same way.
`--asgi` counts through the ASGI app instead (`EdgeApp.__call__` on the isolating event loop, as
`edgellm dev` serves: the request's context, the server's send and receive, the disconnect
watcher), still without the HTTP server.

    .venv/bin/python -m bench.count_hit [--requests 1000] [--before DIR] [--asgi]

Needs valgrind (`apt-get install valgrind`); about a minute per count (the model loads under it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BODY = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 16}).encode()
KINDS = ("hit", "hit-gzip", "healthz")


def _request(kind: str):  # type: ignore[no-untyped-def]
    from edgellm.http import Request

    if kind == "healthz":
        return Request("GET", "http://127.0.0.1:8787/healthz", {"host": "127.0.0.1:8787"}, b"")
    headers = {"host": "127.0.0.1:8787", "content-type": "application/json", "content-length": str(len(BODY))}
    if kind == "hit-gzip":
        headers["accept-encoding"] = "gzip, deflate"
    return Request("POST", "http://127.0.0.1:8787/v1/chat/completions", headers, BODY)


def _asgi(app, request):  # type: ignore[no-untyped-def]
    """`request` as an ASGI call of `app`: its scope, and a receive that gives the body once and
    then waits, as a server's does while the client stays."""
    from urllib.parse import urlsplit

    url = urlsplit(request.url)
    scope = {"type": "http", "method": request.method, "path": url.path, "raw_path": url.path.encode(), "query_string": b"",
             "scheme": "http", "http_version": "1.1", "server": ("127.0.0.1", 8787), "client": ("127.0.0.1", 50000),
             "headers": [(k.encode(), v.encode()) for k, v in request.headers.items()]}
    given = False

    async def receive() -> dict:
        nonlocal given
        if given:
            await asyncio.Event().wait()
        given = True
        return {"type": "http.request", "body": request.body, "more_body": False}

    return lambda send: app(scope, receive, send)


async def _serve(state: Path, kind: str | None, requests: int, asgi: bool = False) -> None:
    """kind None: answer the question once so the state holds its entry; else count `requests`
    (through `EdgeApp.__call__` when `asgi`)."""
    from edgellm.config import Config
    from edgellm_local.edge import EdgeSettings, build_app
    from edgellm_local.llama.model_file import default_model_path

    app = build_app(EdgeSettings(model_path=default_model_path(), state_dir=state, public_dir=None,
                                 config=Config.from_env({"OPEN_ACCESS": "true"})))
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    try:
        if kind is None:
            await app._answer(_request("hit"), send)
            await app.drain()
            return
        def answer(request):  # type: ignore[no-untyped-def]
            return _asgi(app, request)(send) if asgi else app._answer(request, send)

        await answer(_request(kind))  # its code paths warm, and a HIT's answer kept
        status = dict(sent[0]["headers"]).get(b"cf-aig-cache-status")
        if kind.startswith("hit") and status != b"HIT":
            raise SystemExit(f"expected a HIT, got {status!r}")
        usage = app.deps.usage
        usage.flush()  # type: ignore[union-attr]  # the warm-up's row written before the count
        # the writer commits by batch size alone while counting, and what is left at the end: a
        # commit per elapsed `flush_interval` would make the count depend on how slowly valgrind
        # runs (a run's HIT varied by a tenth); the rows still cost what they cost, all counted
        usage.flush_interval = 3600.0  # type: ignore[union-attr]
        control = ["callgrind_control", "-i"]
        subprocess.run([*control, "on", str(os.getpid())], check=True, capture_output=True)
        for _ in range(requests):
            await answer(_request(kind))
            sent.clear()
        usage.flush()  # type: ignore[union-attr]
        subprocess.run([*control, "off", str(os.getpid())], check=True, capture_output=True)
    finally:
        app.deps.usage.close()  # type: ignore[union-attr]


def _env(code: str | None) -> dict[str, str]:
    """This environment, running `code`'s `src/` and `local/` instead of this checkout's (`--before`)."""
    if code is None:
        return dict(os.environ)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(code, "src"), os.path.join(code, "local"), os.getcwd()])}


def count(state: Path, kind: str, requests: int, code: str | None, asgi: bool = False) -> int:
    """Instructions per request of `kind`, in a process of its own under callgrind."""
    env = {**_env(code), "OMP_WAIT_POLICY": "passive"}
    with tempfile.TemporaryDirectory(prefix="edgellm-count-") as scratch:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={scratch}/out",
             sys.executable, "-m", "bench.count_hit", "--serve", str(state), kind, str(requests), *(["--asgi"] if asgi else [])],
            env=env, capture_output=True, text=True, timeout=1800)
    match = re.search(r"Collected : ([\d,]+)", out.stderr)
    if out.returncode != 0 or match is None:
        raise RuntimeError(f"callgrind run failed ({out.returncode}): {out.stderr[-2000:]}")
    return int(match.group(1).replace(",", "")) // requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--before", metavar="DIR", help="also count another version's code (a dir with its src/ and local/)")
    parser.add_argument("--asgi", action="store_true", help="count through the ASGI app (EdgeApp.__call__), not EdgeApp._answer")
    parser.add_argument("--serve", nargs=3, metavar=("STATE", "KIND", "N"), help=argparse.SUPPRESS)  # the counted process
    args = parser.parse_args()
    if args.serve:
        state, kind, n = args.serve
        serving = _serve(Path(state), None if kind == "warm" else kind, int(n), args.asgi)
        if args.asgi:  # the isolating loop `edgellm dev` serves on (its asyncio flavour)
            from edgellm_local.emulator import isolation

            isolation.run(serving)
        else:
            asyncio.run(serving)
        return
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind; `make bench` does): nothing counted")
        return
    trees = {"this checkout": None, **({f"before ({args.before})": args.before} if args.before else {})}
    where = "through EdgeApp.__call__ (ASGI) on the isolating loop" if args.asgi else "EdgeApp._answer"
    print(f"instructions per request, {args.requests} requests each, {where} in-process under callgrind:")
    for name, code in trees.items():
        with tempfile.TemporaryDirectory(prefix="edgellm-count-state-") as state:
            subprocess.run([sys.executable, "-m", "bench.count_hit", "--serve", state, "warm", "0"], env=_env(code), check=True,
                           capture_output=True, timeout=600)
            counts = {kind: count(Path(state), kind, args.requests, code, args.asgi) for kind in KINDS}
        print(f"{name:<40} HIT {counts['hit']:>9,}  HIT, gzip {counts['hit-gzip']:>9,}  /healthz {counts['healthz']:>9,}"
              f"  HIT/healthz {counts['hit'] / counts['healthz']:.2f}x")


if __name__ == "__main__":
    main()
