"""Abuse benchmark: a bounded loopback load of 200 concurrent clients against the real local
edge (`edgellm dev`, SmolLM2-135M on llama.cpp, its own process), mixing cache HITs, MISSes,
streams, bad requests, bad keys and artifact Range reads, then the key check's cost on the HIT
path (p50 with and without an API key, same run, same edge).

Prints requests sent and answered, statuses and p50/p99 per kind, and the edge's RSS before
and after. Targets: nothing lost (every request answered), no 5xx but 503 with
Retry-After. The machine is shared: figures are indicative, ratios are what to read.

The load runs twice on the same edge: first alone (the baseline), then under attack:
`--trickle` connections from another loopback address (127.0.0.2) trickling a request body at
one byte per 2 s, and prompts too long for the edge that route to a hostile origin, a real second
process (`tests/support/hostile_origin.py`) rotating through headers never sent, pings without a
token, a gzip bomb and garbage SSE. Both phases print sent/answered/lost, the statuses, and the
p99 of a `/healthz` probe (every 50 ms) side by side; attack requests are counted apart (they
should be 502/503/504 with Retry-After, never lost).

    .venv/bin/python -m bench.bench_abuse [--clients 200] [--duration 60] [--trickle 32] [--hostile 8]

`--connections` runs the connection-place rows instead, on this checkout's edge and on a
baseline's (`--before REF`, default main, from `git archive`) in the same run: 520 slow-body
connections from ten loopback addresses (a byte every 2 s, reopened when cut) while `/healthz` is
probed from another address, then 200 clients from one address (`/v1/models`): /healthz answered
or failed, and the one address's answers, 503s and resets, side by side.

    .venv/bin/python -m bench.bench_abuse --connections [--duration 15] [--before main]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import asyncio
import collections
import contextlib
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

from bench.bench_cache import percentile
from bench.edge_process import running_edge
from edgellm_local.llama.model_file import default_model_path

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
def edge(state: Path, origin_url: str | None = None) -> Iterator[tuple[str, int]]:
    """The edge in open mode over `state`; its URL and pid (for its RSS)."""
    env: dict[str, str] = {}
    if origin_url:  # prompts past the edge's window go to it; its budgets are short so an attack costs seconds
        env["ORIGINS"] = json.dumps([{"name": "hostile", "url": origin_url, "context_window": 1_000_000, "timeout_ms": 1500, "total_ms": 6000}])
        env["BREAKER"] = json.dumps({"failures": 1_000_000})
    pids: dict[str, int] = {}
    # stop_within 30: generations may still be running in llama.cpp threads when it is asked to stop
    with running_edge(state=state, extra=["--open"], env=env, pids=pids, ready_within=120, stop_within=30) as url:
        yield url, pids[url]


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
    # the edge holds one address to 64 connections: 50 clients per loopback address
    addresses = [f"127.0.1.{i + 1}" for i in range(max(1, -(-clients // 50)))]
    limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
    async with contextlib.AsyncExitStack() as stack:
        pool = [await stack.enter_async_context(httpx.AsyncClient(base_url=url, timeout=120, limits=limits,
                                                                  transport=httpx.AsyncHTTPTransport(local_address=a, limits=limits)))
                for a in addresses]

        async def worker(w: int) -> None:
            client = pool[w % len(pool)]
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


HOSTILE_MODES = ("no_headers", "pings", "gzip_bomb", "garbage", "endless", "long_line")
TOO_LONG = {"messages": [{"role": "user", "content": "word " * 12000}], "max_tokens": 16}  # past the edge's window: the origin's


@dataclasses.dataclass
class Attack:
    """What the attackers did and saw (counted apart from the load)."""

    trickled: int = 0  # slow-body connections opened
    hostile_sent: int = 0
    hostile_answered: int = 0
    hostile_statuses: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    unannounced: int = 0


async def trickler(host: str, port: int, stop: float, attack: Attack) -> None:
    """One connection from 127.0.0.2 sending a 4 KiB body at one byte per 2 s, reopened when the edge cuts it."""
    while time.monotonic() < stop:
        attack.trickled += 1
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0))
        except OSError:
            await asyncio.sleep(0.5)
            continue
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: edge\r\ncontent-type: application/json\r\ncontent-length: 4096\r\n\r\n{")
            while time.monotonic() < stop and not reader.at_eof():
                await writer.drain()
                with contextlib.suppress(asyncio.TimeoutError):
                    if await asyncio.wait_for(reader.read(1), 2.0) == b"":
                        break  # the edge cut it (its body deadline)
                writer.write(b" ")
        except OSError:
            pass
        finally:
            writer.close()


async def hostile(url: str, origin: Any, stop: float, attack: Attack, workers: int) -> None:
    async def mode_rotation() -> None:
        for i in itertools.count():
            if time.monotonic() >= stop:
                return
            await asyncio.to_thread(origin.set_mode, HOSTILE_MODES[i % len(HOSTILE_MODES)])
            await asyncio.sleep(2)

    async with httpx.AsyncClient(base_url=url, timeout=60, transport=httpx.AsyncHTTPTransport(local_address="127.0.3.1")) as client:
        async def worker() -> None:
            while time.monotonic() < stop:
                attack.hostile_sent += 1
                try:
                    response = await client.post("/v1/chat/completions", json=TOO_LONG, headers={"cf-aig-skip-cache": "true"})
                except httpx.HTTPError as exc:
                    attack.hostile_statuses[type(exc).__name__] += 1
                    continue
                attack.hostile_answered += 1
                attack.hostile_statuses[response.status_code] += 1
                attack.unannounced += response.status_code >= 500 and "retry-after" not in response.headers
        await asyncio.gather(mode_rotation(), *(worker() for _ in range(workers)))


async def healthz_probe(url: str, stop: float) -> tuple[list[float], int]:
    """`/healthz` every 50 ms from its own connection: (latencies, failures)."""
    samples, failed = [], 0
    async with httpx.AsyncClient(base_url=url, timeout=10, transport=httpx.AsyncHTTPTransport(local_address="127.0.2.1")) as client:
        while time.monotonic() < stop:
            started = time.perf_counter()
            try:
                ok = (await client.get("/healthz")).status_code == 200
            except httpx.HTTPError:
                ok = False
            samples.append(time.perf_counter() - started)
            failed += not ok
            await asyncio.sleep(0.05)
    return samples, failed


async def phase(url: str, key: str, blob: str, args: argparse.Namespace, origin: Any | None) -> dict[str, Any]:
    """One run of the load, with the attackers when `origin` is given."""
    stop = time.monotonic() + args.duration
    attack = Attack()
    host, port = url.rsplit("//", 1)[1].split(":")
    jobs = [load(url, key, blob, args.clients, args.duration), healthz_probe(url, stop)]
    if origin is not None:
        jobs += [trickler(host, int(port), stop, attack) for _ in range(args.trickle)]
        jobs.append(hostile(url, origin, stop, attack, args.hostile))
    results = await asyncio.gather(*jobs)
    statuses, latency, by_kind, sent, answered, unannounced = results[0]
    health, health_failed = results[1]
    return {"statuses": statuses, "latency": latency, "by_kind": by_kind, "sent": sent, "answered": answered,
            "unannounced": unannounced, "health": health, "health_failed": health_failed, "attack": attack}


def report(name: str, run: dict[str, Any], args: argparse.Namespace) -> dict[Any, int]:
    print(f"[{name}] {args.clients} clients for {args.duration:.0f} s: sent {run['sent']}, answered {run['answered']}, "
          f"lost {run['sent'] - run['answered']}")
    print(f"[{name}]   statuses: " + ", ".join(f"{s}: {c}" for s, c in sorted(run["statuses"].items())))
    for kind, _ in KINDS:
        samples = run["latency"].get(kind, [])
        if samples:
            print(f"[{name}]   {kind:15s} n={len(samples):6d}  p50 {percentile(samples, 50) * 1000:8.1f} ms  "
                  f"p99 {percentile(samples, 99) * 1000:8.1f} ms  "
                  + " ".join(f"{s}:{c}" for s, c in sorted(run["by_kind"][kind].items(), key=str)))
    health = run["health"]
    print(f"[{name}]   /healthz n={len(health)} p50 {percentile(health, 50) * 1000:.1f} ms, p99 {percentile(health, 99) * 1000:.1f} ms, "
          f"failed {run['health_failed']}")
    attack: Attack = run["attack"]
    if attack.hostile_sent or attack.trickled:
        print(f"[{name}]   attackers: {args.trickle} trickling connections ({attack.trickled} opened), {args.hostile} clients to the "
              f"hostile origin: sent {attack.hostile_sent}, answered {attack.hostile_answered}, "
              f"lost {attack.hostile_sent - attack.hostile_answered}; "
              + ", ".join(f"{s}: {c}" for s, c in sorted(attack.hostile_statuses.items(), key=str)))
    bad = {s: c for s, c in run["statuses"].items() if s >= 500 and s != 503}
    if run["unannounced"] or attack.unannounced:
        bad["5xx without Retry-After"] = run["unannounced"] + attack.unannounced
    if run["sent"] != run["answered"] or attack.hostile_sent != attack.hostile_answered:
        bad["lost"] = run["sent"] - run["answered"] + attack.hostile_sent - attack.hostile_answered
    if run["health_failed"]:
        bad["/healthz failed"] = run["health_failed"]
    return bad


async def slow_body_flood(host: str, port: int, stop: float, addresses: int, per_address: int) -> int:
    """`addresses` x `per_address` connections, each a POST whose body comes a byte every 2 s,
    reopened when the edge answers or closes it, until `stop`; returns how many were opened."""
    opened = 0

    async def one(source: str) -> None:
        nonlocal opened
        while time.monotonic() < stop:
            opened += 1
            try:
                reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            except OSError:
                await asyncio.sleep(0.5)
                continue
            try:
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: edge\r\ncontent-type: application/json\r\n"
                             b"content-length: 100000\r\n\r\n{")
                while time.monotonic() < stop:
                    await writer.drain()
                    try:
                        await asyncio.wait_for(reader.read(65536), 2.0)
                        break  # answered (a 400, a 503) or closed: open another
                    except asyncio.TimeoutError:
                        writer.write(b" ")
            except OSError:
                pass
            finally:
                writer.close()
            await asyncio.sleep(0.2)

    await asyncio.gather(*(one(f"127.0.5.{a + 1}") for a in range(addresses) for _ in range(per_address)))
    return opened


async def one_address_load(url: str, clients: int, duration: float) -> collections.Counter:
    """`clients` concurrent clients from one address (127.0.4.1), each asking `/v1/models` in a
    loop on its own connection: the statuses, and the failures by exception name (resets)."""
    outcomes: collections.Counter = collections.Counter()
    stop = time.monotonic() + duration
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits,
                                 transport=httpx.AsyncHTTPTransport(local_address="127.0.4.1", limits=limits)) as client:
        async def worker() -> None:
            while time.monotonic() < stop:
                try:
                    response = await client.get("/v1/models")
                except httpx.HTTPError as exc:
                    outcomes[type(exc).__name__] += 1
                    continue
                outcomes[response.status_code] += 1
                if response.status_code == 503:
                    outcomes["503 with Retry-After"] += "retry-after" in response.headers
                    await asyncio.sleep(float(response.headers.get("retry-after", "1")))
        await asyncio.gather(*(worker() for _ in range(clients)))
    return outcomes


async def connections_phase(url: str, duration: float) -> dict[str, Any]:
    host, port = url.rsplit("//", 1)[1].split(":")
    stop = time.monotonic() + duration
    opened, (health, health_failed) = await asyncio.gather(slow_body_flood(host, int(port), stop, 10, 52), healthz_probe(url, stop))
    return {"opened": opened, "health": len(health), "health_failed": health_failed, "health_p50": percentile(health, 50),
            "health_p99": percentile(health, 99),
            "one_address": await one_address_load(url, 200, duration)}


def connections_main(args: argparse.Namespace) -> int:
    """The connection-place rows, on a baseline's edge and on this checkout's, in one run."""
    runs = {}
    with tempfile.TemporaryDirectory(prefix="edgellm-before-") as before:
        archive = subprocess.run(["git", "archive", args.before, "src", "local"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        for name, code in ((f"before ({args.before})", before), ("this checkout", None)):
            with running_edge(extra=["--open"], code=code, ready_within=300, stop_within=30) as url:
                runs[name] = asyncio.run(connections_phase(url, args.duration))
    print(f"1-minute load {Path('/proc/loadavg').read_text().split()[0]}; {args.duration:.0f} s per row")
    for name, run in runs.items():
        answered = run["health"] - run["health_failed"]
        print(f"[{name}] 520 slow bodies from 10 addresses ({run['opened']} connections opened): /healthz answered "
              f"{answered}/{run['health']} ({100 * answered / max(1, run['health']):.0f}%), p50 {run['health_p50'] * 1000:.1f} ms, "
              f"p99 {run['health_p99'] * 1000:.1f} ms")
        outcomes = run["one_address"]
        sent = sum(c for k, c in outcomes.items() if k != "503 with Retry-After")
        failed = sum(c for k, c in outcomes.items() if isinstance(k, str) and k != "503 with Retry-After")
        print(f"[{name}] 200 clients from one address: {sent} requests, {failed} lost ({100 * failed / max(1, sent):.1f}%); "
              + ", ".join(f"{k}: {c}" for k, c in sorted(outcomes.items(), key=str)))
    after = runs["this checkout"]
    lost = sum(c for k, c in after["one_address"].items() if isinstance(k, str) and k != "503 with Retry-After")
    ok = after["health_failed"] == 0 and lost == 0
    print("targets: /healthz answered under the flood, nothing lost from one address ->", "met" if ok else "MISSED")
    return 0 if ok else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", action="store_true", help="run the connection-place rows (before/after) instead")
    parser.add_argument("--before", default="main", help="the baseline's git ref for --connections (default %(default)s)")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default %(default)s)")
    parser.add_argument("--hits", type=int, default=300, help="HITs per side for the key-check cost")
    parser.add_argument("--trickle", type=int, default=32, help="slow-body connections in the attack phase")
    parser.add_argument("--hostile", type=int, default=8, help="clients sending to the hostile origin in the attack phase")
    args = parser.parse_args()
    if args.connections:
        return connections_main(args)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.support, from a checkout
    from tests.support.hostile_origin import HostileOriginProcess

    origin = HostileOriginProcess.start()
    try:
        with tempfile.TemporaryDirectory(prefix="edgellm-abuse-") as scratch:
            state = Path(scratch)
            edgellm("publish", str(default_model_path()), "--name", "smollm2", "--target", "local", "--state", str(state))
            made = edgellm("keys", "--state", str(state), "create", "--tenant", "bench", "--rpm", "0").stdout
            key = next(line for line in made.splitlines() if line.startswith("el-"))
            with edge(state, origin.url) as (url, pid):
                manifest = httpx.get(f"{url}/models/smollm2/manifest.json").json()
                digest = next(f["sha256"] for f in manifest.get("shards", manifest.get("blobs", [])))
                blob = f"/models/smollm2/blobs/sha256-{digest}"
                for headers in ({"authorization": f"Bearer {key}"}, {}):  # the keyed tenant and the open one each cache it
                    httpx.post(f"{url}/v1/chat/completions", json=HIT_BODY, headers=headers, timeout=300)
                time.sleep(1)  # the KV write happens after the answer
                before = rss_kib(pid)
                load_before = Path("/proc/loadavg").read_text().split()[0]
                baseline = asyncio.run(phase(url, key, blob, args, None))
                attacked = asyncio.run(phase(url, key, blob, args, origin))
                load_after = Path("/proc/loadavg").read_text().split()[0]
                after = rss_kib(pid)
                p50_key, p50_open = asyncio.run(key_check_cost(url, key, args.hits))
    finally:
        origin.stop()
    print(f"1-minute load {load_before} before, {load_after} after")
    bad = report("baseline", baseline, args)
    bad_attacked = report("under attack", attacked, args)
    print(f"/healthz p99: {percentile(baseline['health'], 99) * 1000:.1f} ms alone vs "
          f"{percentile(attacked['health'], 99) * 1000:.1f} ms under attack")
    print(f"edge RSS before {before / 1024:.0f} MiB, after {after / 1024:.0f} MiB")
    print(f"key check on the HIT path: p50 {p50_key * 1000:.2f} ms with a key vs {p50_open * 1000:.2f} ms without "
          f"(+{(p50_key - p50_open) * 1000:.2f} ms)")
    ok = not bad and not bad_attacked
    print("targets: nothing lost, no 5xx but 503 with Retry-After, /healthz answered ->",
          "met" if ok else f"MISSED (baseline {bad or 'ok'}, under attack {bad_attacked or 'ok'})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
