"""Coalescing benchmark: 20 identical concurrent misses through the flights Durable Object
against one request alone, and the HIT latency beside the figure measured before.

Runs the real local edge (`edgellm dev`, SmolLM2-135M on llama.cpp, the Durable Object
emulation and request isolation on) in its own process, and measures from this one:
- one miss alone: time to last byte;
- N identical misses sent at once: generations run (N minus the `coalesced` counter) and time to
  last byte (p50 and the slowest), against the single request's;
- HIT p50/p99 (HITs never touch the object), beside `/healthz` (a fixed body through the same
  server) measured in the same run, and beside the figures `bench.bench_cache` recorded before
  this change (bench/README.md).
Figures come from a shared, busy machine: read the ratios, not the absolute times.

    .venv/bin/python -m bench.bench_coalescing [--clients 20] [--hits 200]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import httpx

from bench.bench_cache import percentile, sequential
from bench.edge_process import running_edge

TOKEN = "bench-token"
# bench/README.md, bench.bench_cache on main before this change (fast server, load ~6 on 2 cores):
# HIT p50 1.8 ms; and the cache benchmark's HIT/fixed-body throughput ratio 0.90x
PREVIOUS_HIT_P50_MS = 1.8


def body(nonce: str) -> dict:
    return {"messages": [{"role": "user", "content": f"Write a short story about a lighthouse ({nonce})."}],
            "temperature": 0, "max_tokens": 128}


async def last_byte(client: httpx.AsyncClient, payload: dict) -> float:
    start = time.perf_counter()
    response = await client.post("/v1/chat/completions", json=payload)
    response.raise_for_status()
    return time.perf_counter() - start


async def coalesced(client: httpx.AsyncClient) -> int:
    stats = await client.get("/admin/cache/stats", headers={"authorization": f"Bearer {TOKEN}"})
    return int(stats.json()["coalesced"])


async def main(args: argparse.Namespace) -> None:
    with running_edge(extra=["--admin-token", TOKEN]) as url:
        limits = httpx.Limits(max_connections=args.clients + 4, max_keepalive_connections=args.clients + 4)
        async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
            await last_byte(client, body("warm-up"))
            alone = await last_byte(client, body(uuid.uuid4().hex))
            before = await coalesced(client)
            shared = body(uuid.uuid4().hex)
            together = await asyncio.gather(*(last_byte(client, shared) for _ in range(args.clients)))
            generations = args.clients - (await coalesced(client) - before)
            while (await client.post("/v1/chat/completions", json=shared)).headers.get("cf-aig-cache-status") != "HIT":
                pass  # the object's KV write lands just after the answers
            hits = await sequential(client, args.hits, "POST", "/v1/chat/completions", "HIT", json=shared)
            fixed = await sequential(client, args.hits, "GET", "/healthz", None)

    print(f"{args.clients} identical concurrent misses through the flights Durable Object (SmolLM2-135M, 2 shared cores)")
    print(f"  generations run: {generations} (without coalescing: {args.clients})")
    print(f"  time to last byte: alone {alone * 1000:.0f} ms; together p50 {percentile(together, 50) * 1000:.0f} ms, "
          f"slowest {max(together) * 1000:.0f} ms ({max(together) / alone:.2f}x the single request)")
    print(f"  HIT p50 {percentile(hits, 50) * 1000:.2f} ms / p99 {percentile(hits, 99) * 1000:.2f} ms "
          f"(before this change: p50 {PREVIOUS_HIT_P50_MS} ms); /healthz same run p50 {percentile(fixed, 50) * 1000:.2f} ms "
          f"(HIT/healthz {percentile(hits, 50) / percentile(fixed, 50):.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--hits", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
