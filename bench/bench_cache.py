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
Targets: MISS/HIT latency ratio >= 100x; HIT throughput >= 0.5x the fixed body's.
Figures from a shared, busy 2-core machine vary from run to run: compare ratios within one run.

- with `--litellm PATH` (or $EDGELLM_LITELLM): the edge's HIT and `/healthz` beside LiteLLM's proxy
  with its response cache on (its own process, in front of the same edge), the same request from
  the same raw keep-alive client, 1 and 16 clients, alternating rounds; wrk's figures too when
  `wrk` is on PATH. Targets: HIT >= 10x LiteLLM's (p50 and req/s), HIT p50 <= 1.3x
  `/healthz`.

    .venv/bin/python -m bench.bench_cache [--misses 8] [--hits 400] [--concurrency 16]
    .venv/bin/python -m bench.bench_cache --litellm litellm-venv/bin/litellm [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from bench import raw_http
from bench.edge_process import cpu_seconds, free_port, load_average, running_edge
from bench.peer_litellm import HIT_HEADER, find_litellm, running_litellm, version

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
    """HIT and `/healthz` p50 on an edge running `--before` (another version's code, e.g.
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
            loads = [load_average()]
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
                loads.append(load_average())
            print(f"\nHIT beside /healthz, before ({args.before}) and after (this checkout), same run, {rounds} alternating rounds, "
                  f"load {min(loads):.2f}-{max(loads):.2f}:")
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
                loads = [load_average()]
                for i in range(args.long // window):
                    for kind in kinds if i % 2 == 0 else kinds[::-1]:
                        spent = cpu_seconds(pid[kind])
                        p50s[kind].append(percentile(await concurrent_latencies(clients[kind], window, args.concurrency), 50) * 1000)
                        cpus[kind].append((cpu_seconds(pid[kind]) - spent) * 1000 / window)
                    loads.append(load_average())
                print("load    per window " + " ".join(f"{v:6.2f}" for v in loads[1:]))
                for kind in kinds:
                    print(f"{kind:<8} p50 ms " + " ".join(f"{v:6.2f}" for v in p50s[kind])
                          + f"   last/first window: {p50s[kind][-1] / p50s[kind][0]:.2f}x"
                          + f", median of the last 3 / first 3: {statistics.median(p50s[kind][-3:]) / statistics.median(p50s[kind][:3]):.2f}x")
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


WRK_SCRIPT = """wrk.method = "{method}"
wrk.body = [[{body}]]
wrk.headers["Content-Type"] = "application/json"
"""
GZIP_CLIENT = {"Accept-Encoding": "gzip, deflate"}  # httpx's (and so the OpenAI SDK's) default


def run_wrk(url: str, request: raw_http.Prepared, connections: int, seconds: float, scratch: str) -> tuple[float, float, float]:
    """(p50 ms, p99 ms, req/s) from wrk (one thread: the machine has two cores and a server to run)."""
    head, _, body = request.data.partition(b"\r\n\r\n")
    method, path = head.split(b" ", 2)[:2]
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    for line in head.decode().split("\r\n")[1:]:  # the request's own headers; wrk writes Host, and the script the body's
        if line.split(":")[0].lower() not in ("host", "connection", "content-type", "content-length"):
            command += ["-H", line]
    if body:
        script = os.path.join(scratch, "post.lua")
        with open(script, "w") as f:
            f.write(WRK_SCRIPT.format(method=method.decode(), body=body.decode()))
        command += ["-s", script]
    out = subprocess.run(command + [url + path.decode()], capture_output=True, text=True, timeout=seconds + 30).stdout
    if "Non-2xx" in out:
        raise RuntimeError(f"wrk saw errors: {out}")

    def ms(label: str) -> float:
        value, unit = re.search(rf"{label}\s+([\d.]+)(us|ms|s)", out).groups()  # type: ignore[union-attr]
        return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]

    return ms("50%"), ms("99%"), float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]


async def warm_hit(url: str, body: dict, is_hit) -> None:
    """Send the request until its answer comes from the cache (the first generates; the write-behind lands after)."""
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for _ in range(100):
            response = await client.post("/v1/chat/completions", json=body)
            response.raise_for_status()
            if is_hit(response.headers):
                return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never answered from its cache")


async def compare_litellm(args: argparse.Namespace) -> None:
    """The edge's HIT against LiteLLM's cache HIT and the edge's own `/healthz`, same run.

    LiteLLM's proxy runs in its own process in front of this same edge: its HITs never reach the
    upstream, so the upstream only answers its one warm-up request, and a second edge (a second
    model in memory on a 2-core machine) would only take CPU from what is measured. The client is
    `raw_http` (a request rendered once, read by Content-Length): httpx costs more per request than
    the edge's HIT does. Its own cost is measured too, against a socket server that answers from
    memory in a process of its own (the "client floor")."""
    binary = find_litellm(args.litellm)
    if binary is None:
        return
    kinds = ("EdgeLLM HIT", "EdgeLLM /healthz", "LiteLLM HIT", "client floor", "EdgeLLM HIT, gzip")
    clients = (1, args.concurrency)
    floor_port = free_port()
    floor = subprocess.Popen([sys.executable, "-m", "bench.raw_http", str(floor_port)])
    pids: dict[str, int] = {}
    try:
        with running_edge(pids=pids) as edge_url:
            model = httpx.get(edge_url + "/healthz", timeout=10).json()["model"]
            body = {**SERVER_BODY, "model": model}  # the same bytes to both: LiteLLM serves the edge's model id under its own name
            with running_litellm(binary, edge_url, model, pids=pids) as litellm_url:
                await warm_hit(edge_url, body, lambda h: h.get("cf-aig-cache-status") == "HIT")
                await warm_hit(litellm_url, body, lambda h: HIT_HEADER in h)
                floor_url = f"http://127.0.0.1:{floor_port}"
                targets = {
                    "EdgeLLM HIT": (edge_url, raw_http.Prepared.build(edge_url, "POST", "/v1/chat/completions", body), ("cf-aig-cache-status", "HIT")),
                    "EdgeLLM /healthz": (edge_url, raw_http.Prepared.build(edge_url, "GET", "/healthz"), None),
                    "LiteLLM HIT": (litellm_url, raw_http.Prepared.build(litellm_url, "POST", "/v1/chat/completions", body), (HIT_HEADER, None)),
                    "client floor": (floor_url, raw_http.Prepared.build(floor_url, "GET", "/healthz"), None),
                    # what httpx and the OpenAI SDK ask for: the same HIT, gzip-compressed by the local edge
                    "EdgeLLM HIT, gzip": (edge_url, raw_http.Prepared.build(edge_url, "POST", "/v1/chat/completions", body, GZIP_CLIENT),
                                          ("cf-aig-cache-status", "HIT")),
                }
                pid = {"EdgeLLM HIT": pids[edge_url], "EdgeLLM /healthz": pids[edge_url], "LiteLLM HIT": pids[litellm_url], "client floor": floor.pid,
                       "EdgeLLM HIT, gzip": pids[edge_url]}
                print(f"\nLiteLLM {version(binary)} (proxy, in-memory response cache) in front of the edge; "
                      f"{args.rounds} alternating rounds, raw keep-alive client, same request:")
                lat = {(k, c): [] for k in kinds for c in clients}
                rps = {(k, c): [] for k in kinds for c in clients}
                cpu = {(k, c): 0.0 for k in kinds for c in clients}
                loads = [load_average()]
                for i in range(args.rounds):
                    order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
                    for kind in order:
                        url, request, expect = targets[kind]
                        for c in clients:
                            n = args.hits // args.rounds * (1 if c == 1 else 4)
                            async with raw_http.connections(request.host, request.port, c) as conns:
                                await raw_http.latencies(conns, request, c * 3, expect)  # warm each connection
                                spent = cpu_seconds(pid[kind])
                                samples, rate = await raw_http.latencies(conns, request, n, expect)
                                cpu[kind, c] += (cpu_seconds(pid[kind]) - spent) * 1000 / n / args.rounds
                            lat[kind, c] += samples
                            rps[kind, c].append(rate)
                    loads.append(load_average())
                p50 = {key: percentile(v, 50) * 1000 for key, v in lat.items()}
                rate = {key: statistics.median(v) for key, v in rps.items()}
                print(f"{'':<20}{'clients':>8}{'n':>7}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}{'CPU ms/req':>12}")
                for kind in kinds:
                    for c in clients:
                        print(f"{kind:<20}{c:>8}{len(lat[kind, c]):>7}{p50[kind, c]:>10.3f}{percentile(lat[kind, c], 99) * 1000:>10.3f}"
                              f"{rate[kind, c]:>10.0f}{cpu[kind, c]:>12.3f}")
                print(f"load average (1 min) over the rounds: {min(loads):.2f}-{max(loads):.2f}")
                edge, health, peer, base, gzipped = kinds
                for c in clients:
                    print(f"{c:>2} client(s): LiteLLM/EdgeLLM HIT p50 {p50[peer, c] / p50[edge, c]:.1f}x, "
                          f"EdgeLLM/LiteLLM req/s {rate[edge, c] / rate[peer, c]:.1f}x (target >= 10x); "
                          f"HIT/healthz p50 {p50[edge, c] / p50[health, c]:.2f}x (target <= 1.3x), "
                          f"less the client floor's {p50[base, c]:.3f} ms: {(p50[edge, c] - p50[base, c]) / (p50[health, c] - p50[base, c]):.2f}x; "
                          f"server CPU per HIT, EdgeLLM/healthz {cpu[edge, c] / cpu[health, c]:.2f}x; "
                          f"a gzip client's HIT/HIT p50 {p50[gzipped, c] / p50[edge, c]:.2f}x, CPU {cpu[gzipped, c] / cpu[edge, c]:.2f}x")
                if shutil.which("wrk") is None:
                    print("wrk: not on PATH (apt-get install wrk): its cross-check is skipped")
                    return
                await asyncio.to_thread(wrk_rounds, targets, kinds, clients, args)
    finally:
        floor.terminate()
        floor.wait(10)


def wrk_rounds(targets: dict, kinds: tuple[str, ...], clients: tuple[int, ...], args: argparse.Namespace) -> None:
    """The same targets through wrk (C, one thread), `--rounds` alternating rounds of 2 s: a client
    that costs less than any Python one, so its ratios are the servers' own. As many rounds as the
    raw client's: with 3, one busy moment of the shared machine moved a median by 0.3x."""
    figures: dict[tuple[str, int], list[tuple[float, float, float]]] = {(k, c): [] for k in kinds for c in clients}
    loads = [load_average()]
    with tempfile.TemporaryDirectory(prefix="edgellm-wrk-") as scratch:
        for i in range(args.rounds):
            order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
            for kind in order:
                url, request, _ = targets[kind]
                for c in clients:
                    figures[kind, c].append(run_wrk(url, request, c, 2, scratch))
            loads.append(load_average())
    print(f"\nwrk -t1 ({args.rounds} alternating rounds of 2 s; medians of the rounds), load {min(loads):.2f}-{max(loads):.2f}:")
    print(f"{'':<20}{'clients':>8}{'p50 ms':>10}{'p99 ms':>10}{'req/s':>10}")
    med = {key: tuple(statistics.median(f[j] for f in v) for j in range(3)) for key, v in figures.items()}
    for kind in kinds:
        for c in clients:
            print(f"{kind:<20}{c:>8}{med[kind, c][0]:>10.3f}{med[kind, c][1]:>10.3f}{med[kind, c][2]:>10.0f}")
    edge, health, peer, _, gzipped = kinds
    for c in clients:
        print(f"{c:>2} client(s), wrk: LiteLLM/EdgeLLM HIT p50 {med[peer, c][0] / med[edge, c][0]:.1f}x, "
              f"EdgeLLM/LiteLLM req/s {med[edge, c][2] / med[peer, c][2]:.1f}x (target >= 10x); "
              f"HIT/healthz p50 {med[edge, c][0] / med[health, c][0]:.2f}x (target <= 1.3x); "
              f"a gzip client's HIT/HIT p50 {med[gzipped, c][0] / med[edge, c][0]:.2f}x")


async def main(args: argparse.Namespace) -> None:
    if args.litellm is not None or os.environ.get("EDGELLM_LITELLM"):
        await compare_litellm(args)
        return
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
    parser.add_argument("--litellm", metavar="PATH", help="LiteLLM's `litellm` script (its own venv; default $EDGELLM_LITELLM): "
                        "the edge's HIT beside LiteLLM's cache HIT and /healthz, same run")
    parser.add_argument("--rounds", type=int, default=5, help="with --litellm: alternating rounds")
    asyncio.run(main(parser.parse_args()))
