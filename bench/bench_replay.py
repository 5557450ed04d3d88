"""A streamed cache HIT (the replay of a stored answer as SSE) through `edgellm dev`, plain and gzip.

A streamed HIT renders one SSE chunk per stored token, as a live answer does; the browser chat
page and `stream=True` clients (the OpenAI SDK asks for gzip) get their HITs this way. This
measures one: a 64-token answer stored by a MISS, then HITs over a raw keep-alive client (one at a
time), p50 latency to the last byte and the edge's CPU per HIT (`/proc`), without and with
`Accept-Encoding: gzip, deflate`. With `--before DIR` (another version's `src/` and `local/`: a
checkout, or `git archive COMMIT src local | tar -x -C DIR`) that version's edge is measured in
the same rounds, alternating, and the ratios printed.

    .venv/bin/python -m bench.bench_replay [--before DIR] [--rounds 4] [--hits 300] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from typing import Any

import httpx

from bench import raw_http
from bench.edge_process import cpu_seconds, load_average, running_edge

PROMPT = [{"role": "user", "content": "Tell me a long story about the edge."}]
KINDS = {"plain": {}, "gzip": {"Accept-Encoding": "gzip, deflate"}}  # gzip: what httpx and the OpenAI SDK send
EXPECT = ("cf-aig-cache-status", "HIT")


async def stored(url: str, body: dict[str, Any]) -> int:
    """Ask until the answer is a HIT (the MISS's KV write lands after its answer); its event count."""
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(20):
            response = await client.post(url + "/v1/chat/completions", json=body)
            if response.headers.get("cf-aig-cache-status") == "HIT":
                return response.text.count("data: ")
            await asyncio.sleep(0.25)
    raise SystemExit(f"{url}: the answer was never a HIT")


async def main(args: argparse.Namespace) -> None:
    trees = {"this checkout": None, **({f"before ({args.before})": args.before} if args.before else {})}
    pids: dict[str, int] = {}
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(running_edge(code=code, pids=pids)) for name, code in trees.items()}
        requests = {}
        for name, url in urls.items():
            model = httpx.get(url + "/healthz", timeout=10).json()["model"]
            body = {"model": model, "messages": PROMPT, "temperature": 0, "max_tokens": args.max_tokens, "stream": True}
            events = await stored(url, body)
            print(f"{name}: {url}, the stored answer replays as {events} SSE events")
            requests[name] = {kind: raw_http.Prepared.build(url, "POST", "/v1/chat/completions", body, headers) for kind, headers in KINDS.items()}
        latency: dict[tuple[str, str], list[float]] = {}
        cpu: dict[tuple[str, str], list[float]] = {}
        loads = [load_average()]
        for i in range(args.rounds):
            for name in (list(urls) if i % 2 == 0 else list(urls)[::-1]):
                for kind, request in requests[name].items():
                    async with raw_http.connections(request.host, request.port, 1) as conns:
                        await raw_http.latencies(conns, request, 20, EXPECT)  # the connection and code paths warm
                        spent = cpu_seconds(pids[urls[name]])
                        samples, _ = await raw_http.latencies(conns, request, args.hits, EXPECT)
                        cpu.setdefault((name, kind), []).append((cpu_seconds(pids[urls[name]]) - spent) * 1e6 / args.hits)
                    latency.setdefault((name, kind), []).extend(samples)
            loads.append(load_average())
    print(f"\nstreamed HIT, {args.max_tokens}-token answer, {args.rounds} alternating rounds of {args.hits}, load {min(loads):.2f}-{max(loads):.2f}:")
    print(f"{'':<40}{'kind':>6}{'p50 ms':>10}{'p99 ms':>10}{'CPU us/HIT':>12}")
    p50 = {key: statistics.median(v) * 1000 for key, v in latency.items()}
    cpu_per = {key: statistics.median(v) for key, v in cpu.items()}
    for name in trees:
        for kind in KINDS:
            samples = sorted(latency[name, kind])
            print(f"{name:<40}{kind:>6}{p50[name, kind]:>10.3f}{samples[int(len(samples) * 0.99)] * 1000:>10.3f}{cpu_per[name, kind]:>12.0f}")
    if args.before:
        now, before = trees
        for kind in KINDS:
            print(f"{kind}: this checkout / before, p50 {p50[now, kind] / p50[before, kind]:.2f}x, CPU {cpu_per[now, kind] / cpu_per[before, kind]:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="DIR", help="also measure another version's code (a dir with its src/ and local/)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--hits", type=int, default=300, help="HITs per kind per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    asyncio.run(main(parser.parse_args()))
