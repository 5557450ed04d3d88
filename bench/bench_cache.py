"""Cache benchmark: HIT against MISS for a 128-token answer, and HIT against a fixed body.

Runs the real local edge (`edgellm dev`, SmolLM2-135M on llama.cpp) in its own process and
measures from this one, in a single run:
- p50/p99 latency and requests per second of MISSes (`Cache-Control: no-cache`: the cache is
  not read, the model generates, the answer is written) and of HITs for the same request;
- HIT throughput against `/healthz`, a minimal route through the same server and router that
  returns a small fixed JSON body.
- HIT p50 and throughput on two local edges running side by side, measured in alternating rounds: `--server baseline`
  (uvicorn on h11 and the asyncio loop, static files probed before routing: the edge before issue
  12) and the default `--server fast` (httptools + uvloop, API paths routed first).
Targets (issue 3): MISS/HIT latency ratio >= 100x; HIT throughput >= 0.5x the fixed body's.
Figures from a shared, busy 2-core machine vary from run to run: compare ratios within one run.

    .venv/bin/python -m bench.bench_cache [--misses 8] [--hits 400] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time

import httpx

from bench.edge_process import cpu_seconds, running_edge

BODY = {
    "messages": [{"role": "user", "content": "Write a long, detailed story about a lighthouse keeper and a storm."}],
    "temperature": 0,
    "max_tokens": 128,
}


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def timed(client: httpx.AsyncClient, method: str, path: str, **kwargs) -> tuple[float, httpx.Response]:
    start = time.perf_counter()
    response = await client.request(method, path, **kwargs)
    return time.perf_counter() - start, response


async def sequential(client: httpx.AsyncClient, n: int, method: str, path: str, expect: str | None, **kwargs) -> list[float]:
    samples = []
    for _ in range(n):
        elapsed, response = await timed(client, method, path, **kwargs)
        response.raise_for_status()
        if expect is not None:
            assert response.headers.get("cf-aig-cache-status") == expect, response.headers
        samples.append(elapsed)
    return samples


async def throughput(client: httpx.AsyncClient, total: int, concurrency: int, method: str, path: str, **kwargs) -> float:
    queue = list(range(total))

    async def worker() -> None:
        while queue:
            queue.pop()
            response = await client.request(method, path, **kwargs)
            response.raise_for_status()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - start)


def row(name: str, samples: list[float], rps: float | None = None) -> str:
    p50, p99 = percentile(samples, 50) * 1000, percentile(samples, 99) * 1000
    rate = f"{rps:10.1f}" if rps is not None else f"{1 / statistics.mean(samples):10.1f}"
    return f"{name:<22}{len(samples):>6}{p50:>12.2f}{p99:>12.2f}{rate}"


# the server comparison's cached request: a short answer, so setting up two edges costs two short
# generations; what is measured is the HIT path, where the body size matters little
SERVER_BODY = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "max_tokens": 16}


async def compare_servers(args: argparse.Namespace, rounds: int = 6) -> None:
    """HIT p50 and throughput on a baseline and a fast edge running side by side, in alternating
    rounds (ABBA...), so neither always meets the machine's quieter moments."""
    kinds = ("baseline", "fast")
    with contextlib.ExitStack() as stack:
        urls = {kind: stack.enter_context(running_edge(extra=["--server", kind])) for kind in kinds}
        limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
        clients = {kind: httpx.AsyncClient(base_url=url, timeout=300, limits=limits) for kind, url in urls.items()}
        try:
            for client in clients.values():
                (await client.post("/v1/chat/completions", json=SERVER_BODY)).raise_for_status()
            await asyncio.sleep(0.2)  # let the write-behinds land
            for client in clients.values():
                await sequential(client, 20, "POST", "/v1/chat/completions", "HIT", json=SERVER_BODY)  # warm up
            latencies: dict[str, list[float]] = {k: [] for k in kinds}
            rates: dict[str, list[float]] = {k: [] for k in kinds}
            for i in range(rounds):
                for kind in kinds if i % 2 == 0 else kinds[::-1]:
                    latencies[kind] += await sequential(clients[kind], args.hits // rounds, "POST", "/v1/chat/completions", "HIT", json=SERVER_BODY)
                    rates[kind].append(await throughput(clients[kind], args.hits // rounds * 2, args.concurrency, "POST", "/v1/chat/completions", json=SERVER_BODY))
        finally:
            for client in clients.values():
                await client.aclose()
    print(f"\nHIT through the local edge's HTTP server, same run, {rounds} alternating rounds:")
    print(f"{'':<22}{'n':>6}{'p50 ms':>12}{'p99 ms':>12}{'req/s':>10}")
    median = {k: statistics.median(v) for k, v in rates.items()}
    print(row("baseline (h11)", latencies["baseline"], median["baseline"]))
    print(row("fast (httptools+uvloop)", latencies["fast"], median["fast"]))
    print(f"fast / baseline: throughput {median['fast'] / median['baseline']:.2f}x (median of rounds), p50 "
          f"{percentile(latencies['fast'], 50) * 1000:.2f} ms vs {percentile(latencies['baseline'], 50) * 1000:.2f} ms")


async def compare_code(args: argparse.Namespace, rounds: int = 6) -> None:
    """Issue 26: HIT and `/healthz` p50 on an edge running `--before` (another version's code, e.g.
    `git archive <commit> src local`) beside one running this checkout, in alternating rounds, then
    a long run of HITs at concurrency on both (alternating windows), each window's p50 printed: the
    per-request usage INSERT grew slower with the table; the batched writer does not."""
    kinds = ("before", "after")
    with contextlib.ExitStack() as stack:
        pids: dict[str, int] = {}
        urls = {"before": stack.enter_context(running_edge(code=args.before, pids=pids)), "after": stack.enter_context(running_edge(pids=pids))}
        pid = {kind: pids[url] for kind, url in urls.items()}
        limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
        clients = {kind: httpx.AsyncClient(base_url=url, timeout=300, limits=limits) for kind, url in urls.items()}
        try:
            for client in clients.values():
                (await client.post("/v1/chat/completions", json=SERVER_BODY)).raise_for_status()
            await asyncio.sleep(0.5)  # let the write-behinds land
            for client in clients.values():
                await sequential(client, 20, "POST", "/v1/chat/completions", "HIT", json=SERVER_BODY)  # warm up
            hit: dict[str, list[float]] = {k: [] for k in kinds}
            fixed: dict[str, list[float]] = {k: [] for k in kinds}
            rates: dict[str, list[float]] = {k: [] for k in kinds}
            fixed_rates: dict[str, list[float]] = {k: [] for k in kinds}
            cpu: dict[tuple[str, str], float] = {(k, what): 0.0 for k in kinds for what in ("hit", "fixed")}
            n = args.hits // rounds
            for i in range(rounds):
                for kind in kinds if i % 2 == 0 else kinds[::-1]:
                    c = clients[kind]
                    spent = cpu_seconds(pid[kind])
                    hit[kind] += await sequential(c, n, "POST", "/v1/chat/completions", "HIT", json=SERVER_BODY)
                    rates[kind].append(await throughput(c, n * 2, args.concurrency, "POST", "/v1/chat/completions", json=SERVER_BODY))
                    cpu[kind, "hit"] += cpu_seconds(pid[kind]) - spent
                    spent = cpu_seconds(pid[kind])
                    fixed[kind] += await sequential(c, n, "GET", "/healthz", None)
                    fixed_rates[kind].append(await throughput(c, n * 2, args.concurrency, "GET", "/healthz"))
                    cpu[kind, "fixed"] += cpu_seconds(pid[kind]) - spent
            print(f"\nHIT beside /healthz, before ({args.before}) and after (this checkout), same run, {rounds} alternating rounds:")
            print(f"{'':<22}{'n':>6}{'p50 ms':>12}{'p99 ms':>12}{'req/s':>10}")
            for kind in kinds:
                print(row(f"{kind}: HIT", hit[kind], statistics.median(rates[kind])))
                print(row(f"{kind}: /healthz", fixed[kind], statistics.median(fixed_rates[kind])))
            per = 1000 / (n * 3 * rounds)  # ms of the edge's CPU per request (its threads included)
            for kind in kinds:
                print(f"{kind}: edge CPU per request: HIT {cpu[kind, 'hit'] * per:.3f} ms, /healthz {cpu[kind, 'fixed'] * per:.3f} ms "
                      f"({cpu[kind, 'hit'] / cpu[kind, 'fixed']:.2f}x)")
            for kind in kinds:
                print(f"{kind}: HIT p50 / /healthz p50 = {percentile(hit[kind], 50) / percentile(fixed[kind], 50):.2f}x (target <= 1.3x); "
                      f"HIT req/s / /healthz req/s = {statistics.median(rates[kind]) / statistics.median(fixed_rates[kind]):.2f}x")
            if args.long:
                window = max(1000, args.long // 10)
                print(f"\nlong run: {args.long} HITs per edge at concurrency {args.concurrency}, windows of {window}, alternating; p50 ms per window:")
                p50s: dict[str, list[float]] = {k: [] for k in kinds}
                cpus: dict[str, list[float]] = {k: [] for k in kinds}
                for i in range(args.long // window):
                    for kind in kinds if i % 2 == 0 else kinds[::-1]:
                        spent = cpu_seconds(pid[kind])
                        p50s[kind].append(percentile(await concurrent_latencies(clients[kind], window, args.concurrency), 50) * 1000)
                        cpus[kind].append((cpu_seconds(pid[kind]) - spent) * 1000 / window)
                for kind in kinds:
                    print(f"{kind:<8} p50 ms " + " ".join(f"{v:6.2f}" for v in p50s[kind])
                          + f"   last/first window: {p50s[kind][-1] / p50s[kind][0]:.2f}x")
                    print(f"{kind:<8} CPU ms " + " ".join(f"{v:6.3f}" for v in cpus[kind])
                          + f"   last/first window: {cpus[kind][-1] / cpus[kind][0]:.2f}x")
        finally:
            for client in clients.values():
                await client.aclose()


async def concurrent_latencies(client: httpx.AsyncClient, total: int, concurrency: int) -> list[float]:
    """Each request's latency while `concurrency` clients send `total` HITs."""
    queue, samples = list(range(total)), []

    async def worker() -> None:
        while queue:
            queue.pop()
            elapsed, response = await timed(client, "POST", "/v1/chat/completions", json=SERVER_BODY)
            response.raise_for_status()
            samples.append(elapsed)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def main(args: argparse.Namespace) -> None:
    if args.before:
        await compare_code(args)
        return
    if args.servers_only:
        await compare_servers(args)
        return
    with running_edge() as url:
        limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            _, first = await timed(client, "POST", "/v1/chat/completions", json=BODY)
            tokens = first.json()["usage"]["completion_tokens"]
            await asyncio.sleep(0.2)  # let the write-behind land
            miss = await sequential(client, args.misses, "POST", "/v1/chat/completions", "MISS",
                                    json=BODY, headers={"cache-control": "no-cache"})
            await sequential(client, 20, "POST", "/v1/chat/completions", "HIT", json=BODY)  # warm up
            hit = await sequential(client, args.hits, "POST", "/v1/chat/completions", "HIT", json=BODY)
            fixed = await sequential(client, args.hits, "GET", "/healthz", None)
            hit_rps = await throughput(client, args.hits * 2, args.concurrency, "POST", "/v1/chat/completions", json=BODY)
            fixed_rps = await throughput(client, args.hits * 2, args.concurrency, "GET", "/healthz")

    print(f"answer: {tokens} completion tokens (SmolLM2-135M Q4_1 on llama.cpp, 2 cores)")
    print(f"{'':<22}{'n':>6}{'p50 ms':>12}{'p99 ms':>12}{'req/s':>10}")
    print(row("MISS (generate)", miss))
    print(row("HIT (from KV)", hit, hit_rps))
    print(row("fixed body /healthz", fixed, fixed_rps))
    print(f"MISS/HIT latency ratio p50: {percentile(miss, 50) / percentile(hit, 50):.0f}x "
          f"(p99: {percentile(miss, 99) / percentile(hit, 99):.0f}x; target >= 100x)")
    print(f"HIT throughput / fixed-body throughput at concurrency {args.concurrency}: "
          f"{hit_rps / fixed_rps:.2f}x (target >= 0.5x)")
    await compare_servers(args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", type=int, default=8)
    parser.add_argument("--hits", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--servers-only", action="store_true", help="only the baseline/fast server comparison")
    parser.add_argument("--before", metavar="DIR", help="compare with another version's code (a dir with its src/ and local/), side by side")
    parser.add_argument("--long", type=int, default=0, metavar="N", help="with --before: N HITs per edge in a long run, p50 per window")
    asyncio.run(main(parser.parse_args()))
