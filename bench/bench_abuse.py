"""Abuse benchmark: a bounded loopback load of 200 concurrent clients against the real local
edge (`edgellm dev`, SmolLM2-135M on llama.cpp, its own process), mixing cache HITs, MISSes,
streams, bad requests, bad keys and artifact Range reads, then the key check's cost on the HIT
path (p50 with and without an API key, same run, same edge).

Prints requests sent and answered, statuses and p50/p99 per kind, and the edge's RSS before
and after. Targets (issue 10): nothing lost (every request answered), no 5xx but 503 with
Retry-After. The machine is shared: figures are indicative, ratios are what to read.

    .venv/bin/python -m bench.bench_abuse [--clients 200] [--duration 60]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import httpx

from bench.bench_cache import percentile
from bench.edge_process import free_port
from edgellm_local.ai import default_model_path

HIT_BODY = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 16}
KINDS = (("hit", 50), ("miss", 4), ("stream", 4), ("bad_request", 15), ("bad_key", 12), ("artifact_range", 15))


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def edgellm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgellm_local.cli", *args], capture_output=True, text=True, check=True)


@contextlib.contextmanager
def edge(state: Path) -> Iterator[tuple[str, int]]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "edgellm_local.cli", "dev", "--open", "--port", str(port), "--state", str(state)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError("the edge exited")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield url, process.pid
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:  # generations still running in llama.cpp threads
            process.kill()
            process.wait(10)


async def one(client: httpx.AsyncClient, kind: str, key: str, blob: str, n: int) -> httpx.Response:
    auth = {"authorization": f"Bearer {key}"}
    if kind == "hit":
        return await client.post("/v1/chat/completions", json=HIT_BODY, headers=auth)
    if kind == "miss":
        body = {**HIT_BODY, "messages": [{"role": "user", "content": f"Count to three, take {n}."}], "max_tokens": 8}
        return await client.post("/v1/chat/completions", json=body, headers=auth)
    if kind == "stream":
        body = {**HIT_BODY, "stream": True, "max_tokens": 8}
        async with client.stream("POST", "/v1/chat/completions", json=body, headers={**auth, "cf-aig-skip-cache": "true"}) as r:
            async for _ in r.aiter_bytes():
                pass
            return r
    if kind == "bad_request":
        return await client.post("/v1/chat/completions", content=b'{"messages": [', headers=auth)
    if kind == "bad_key":
        return await client.post("/v1/chat/completions", json=HIT_BODY, headers={"authorization": "Bearer el-badbadbadbad.nope-nope-nope-nope-nope"})
    start = random.randrange(0, 1 << 20)
    return await client.get(blob, headers={"range": f"bytes={start}-{start + 65535}"})


async def load(url: str, key: str, blob: str, clients: int, duration: float) -> tuple[collections.Counter, dict, dict, int, int, int]:
    statuses: collections.Counter = collections.Counter()
    latency: dict[str, list[float]] = collections.defaultdict(list)
    by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    sent = answered = unannounced = 0  # unannounced: a 503 without Retry-After
    names, weights = zip(*KINDS)
    stop = time.monotonic() + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        async def worker(w: int) -> None:
            nonlocal sent, answered, unannounced
            rng, n = random.Random(w), 0
            while time.monotonic() < stop:
                kind = rng.choices(names, weights)[0]
                n += 1
                sent += 1
                started = time.perf_counter()
                try:
                    response = await one(client, kind, key, blob, w * 100000 + n)
                except httpx.HTTPError as exc:
                    by_kind[kind][type(exc).__name__] += 1
                    continue
                status = response.status_code
                unannounced += status == 503 and "retry-after" not in response.headers
                answered += 1
                latency[kind].append(time.perf_counter() - started)
                statuses[status] += 1
                by_kind[kind][status] += 1
        await asyncio.gather(*(worker(w) for w in range(clients)))
    return statuses, latency, by_kind, sent, answered, unannounced


async def key_check_cost(url: str, key: str, n: int) -> tuple[float, float]:
    with_key, without = [], []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for i in range(2 * n):
            headers = {"authorization": f"Bearer {key}"} if i % 2 else {}
            started = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=HIT_BODY, headers=headers)
            elapsed = time.perf_counter() - started
            assert response.headers.get("cf-aig-cache-status") == "HIT", response.text
            (with_key if i % 2 else without).append(elapsed)
    return percentile(with_key, 50), percentile(without, 50)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default %(default)s)")
    parser.add_argument("--hits", type=int, default=300, help="HITs per side for the key-check cost")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="edgellm-abuse-") as scratch:
        state = Path(scratch)
        edgellm("publish", str(default_model_path()), "--name", "smollm2", "--target", "local", "--state", str(state))
        made = edgellm("keys", "--state", str(state), "create", "--tenant", "bench", "--rpm", "0").stdout
        key = next(line for line in made.splitlines() if line.startswith("el-"))
        with edge(state) as (url, pid):
            manifest = httpx.get(f"{url}/models/smollm2/manifest.json").json()
            digest = next(f["sha256"] for f in manifest.get("shards", manifest.get("blobs", [])))
            blob = f"/models/smollm2/blobs/sha256-{digest}"
            for headers in ({"authorization": f"Bearer {key}"}, {}):  # the keyed tenant and the open one each cache it
                httpx.post(f"{url}/v1/chat/completions", json=HIT_BODY, headers=headers, timeout=300)
            time.sleep(1)  # the KV write happens after the answer
            before = rss_kib(pid)
            statuses, latency, by_kind, sent, answered, unannounced = asyncio.run(load(url, key, blob, args.clients, args.duration))
            after = rss_kib(pid)
            p50_key, p50_open = asyncio.run(key_check_cost(url, key, args.hits))
    print(f"{args.clients} clients for {args.duration:.0f} s: sent {sent}, answered {answered}, lost {sent - answered}")
    print("statuses: " + ", ".join(f"{s}: {c}" for s, c in sorted(statuses.items())))
    for kind, _ in KINDS:
        samples = latency.get(kind, [])
        if samples:
            print(f"  {kind:15s} n={len(samples):6d}  p50 {percentile(samples, 50) * 1000:8.1f} ms  p99 {percentile(samples, 99) * 1000:8.1f} ms  "
                  + " ".join(f"{s}:{c}" for s, c in sorted(by_kind[kind].items(), key=str)))
    print(f"edge RSS before {before / 1024:.0f} MiB, after {after / 1024:.0f} MiB")
    print(f"key check on the HIT path: p50 {p50_key * 1000:.2f} ms with a key vs {p50_open * 1000:.2f} ms without "
          f"(+{(p50_key - p50_open) * 1000:.2f} ms)")
    bad = {s: c for s, c in statuses.items() if s >= 500 and s != 503}
    if unannounced:
        bad["503 without Retry-After"] = unannounced
    ok = sent == answered and not bad
    print("targets: nothing lost, no 5xx but 503 with Retry-After ->", "met" if ok else f"MISSED ({bad or 'lost requests'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
