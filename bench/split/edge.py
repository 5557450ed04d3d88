"""The edge host's half of the split benchmark; runs inside the edge namespace.

`python -m bench.split` starts this with a JSON config once the centre's processes are up
(two `ggml-rpc-server`s, one llama-server holding the whole model). Here, each behind its own
`DelayProxy`:

- `llama-bench` with `-ngl N --rpc` (the first layers here, the rest at the centre), twice per
  RTT with two generation lengths: the difference of the proxy's counts between the two runs is
  the per-token traffic (loading, warm-up and set-up cancel out);
- a llama-server split the same way, streaming a completion: time to first token and tokens per
  second as a client next to the edge sees them, and round trips per prompt pass;
- the all-at-the-centre baseline: the centre's llama-server streamed through the proxy;
- once, `llama-bench` with everything here (all at the edge).

It prints one JSON object (the measurements) as its last line of stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.split.build import SERVER_FLAGS
from bench.split.proxy import DelayProxy, TrafficCounts

PROMPT = ("The history of the lighthouse begins with fires lit on hilltops to guide ships home. "
          "Later, towers of stone carried the flame higher, and lenses")


@dataclass(frozen=True)
class EdgeConfig:
    rpc_server: str  # binaries (for their paths only; the centre runs its own)
    bench: str
    server: str
    model: str
    centre: str  # the centre's address
    rpc_bench_port: int  # the ggml-rpc-server llama-bench uses
    rpc_server_port: int  # the one the split llama-server uses (each serves one client at a time)
    http_port: int  # the centre's llama-server
    rtts_ms: list[float]
    layers_at_centre: int = 15
    threads: int = 1
    short_tokens: int = 16
    long_tokens: int = 48
    repetitions: int = 2
    stream_tokens: int = 32
    with_server: bool = True  # False: llama-bench only (no streaming, no all-at-the-centre baseline)
    log_dir: str = ""


@dataclass
class Traffic:
    round_trips: float
    bytes_up: float
    bytes_down: float

    @classmethod
    def per(cls, counts: TrafficCounts, n: float) -> Traffic:
        return cls(counts.round_trips / n, counts.bytes_up / n, counts.bytes_down / n)


@dataclass
class Stream:
    ttft_s: float
    tokens_per_s: float
    tokens: int
    traffic: TrafficCounts | None = None


@dataclass
class RttResult:
    rtt_ms: float
    bench_tokens_per_s: float
    bench_per_token: Traffic
    split_stream: Stream | None = None
    split_prompt_round_trips: int | None = None
    split_stream_per_token: Traffic | None = None
    centre_stream: Stream | None = None
    centre_round_trips_per_request: int | None = None


@dataclass
class EdgeResults:
    edge_tokens_per_s: float
    rtts: list[RttResult] = field(default_factory=list)


def log(message: str) -> None:
    print(f"[edge] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_for_port(host: str, port: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
            writer.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on {host}:{port} after {timeout:.0f} s")
            await asyncio.sleep(0.2)


async def wait_for_health(client: httpx.AsyncClient, url: str, process: asyncio.subprocess.Process | None = None,
                          timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.returncode is not None:
            raise RuntimeError(f"llama-server exited with {process.returncode} while loading")
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get(url + "/health", timeout=2)).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} not healthy after {timeout:.0f} s")
        await asyncio.sleep(0.2)


async def run_llama_bench(config: EdgeConfig, tokens: int, rpc: str | None, name: str) -> dict:
    """One llama-bench generation test (`-p 0 -n tokens`); returns its JSON record."""
    command = [config.bench, "-m", config.model, "-p", "0", "-n", str(tokens), "-r", str(config.repetitions),
               "-t", str(config.threads), "-o", "json"]
    command += ["-ngl", str(config.layers_at_centre), "--rpc", rpc] if rpc else ["-ngl", "0"]
    with open(Path(config.log_dir) / f"{name}.log", "wb") as err:
        process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE, stderr=err)
        try:
            out, _ = await asyncio.wait_for(process.communicate(), timeout=600)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({process.returncode}); see {err.name}")
    (record,) = json.loads(out)
    return record


async def stream_completion(client: httpx.AsyncClient, url: str, tokens: int) -> Stream:
    """Stream `tokens` tokens from a llama-server (greedy, EOS ignored, prompt not cached);
    time to first token and tokens per second after it, as the client sees them."""
    body = {"prompt": PROMPT, "n_predict": tokens, "stream": True, "ignore_eos": True,
            "cache_prompt": False, "temperature": 0.0}
    stamps: list[float] = []
    start = time.perf_counter()
    async with client.stream("POST", url + "/completion", json=body, timeout=300) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if not event.get("stop"):
                stamps.append(time.perf_counter())
    if not stamps:
        raise RuntimeError(f"{url} streamed no tokens")
    rate = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 and stamps[-1] > stamps[0] else 0.0
    return Stream(ttft_s=stamps[0] - start, tokens_per_s=rate, tokens=len(stamps))


async def measured(proxy: DelayProxy, work):
    before = proxy.ledger.snapshot()
    result = await work
    return result, proxy.ledger.snapshot() - before


async def run(config: EdgeConfig) -> EdgeResults:
    os.makedirs(config.log_dir, exist_ok=True)
    centre = config.centre
    async with contextlib.AsyncExitStack() as stack:
        links = {}
        for name, port in (("bench", config.rpc_bench_port), ("server", config.rpc_server_port), ("http", config.http_port)):
            links[name] = await stack.enter_async_context(DelayProxy(centre, port))
        addresses = {name: await link.start() for name, link in links.items()}
        rpc_bench = "%s:%d" % addresses["bench"]
        client = await stack.enter_async_context(httpx.AsyncClient())
        for port in (config.rpc_bench_port, config.rpc_server_port) if config.with_server else (config.rpc_bench_port,):
            await wait_for_port(centre, port)
        centre_url = "http://%s:%d" % addresses["http"]
        if config.with_server:
            await wait_for_health(client, f"http://{centre}:{config.http_port}")

        log("all at the edge: llama-bench, no RPC")
        edge_record = await run_llama_bench(config, config.long_tokens, None, "bench-edge")
        results = EdgeResults(edge_tokens_per_s=float(edge_record["avg_ts"]))

        if config.with_server:
            log(f"starting the split llama-server (-ngl {config.layers_at_centre} --rpc)")
            split_port = free_port()
            server_log = open(Path(config.log_dir) / "llama-server-split.log", "wb")
            stack.callback(server_log.close)
            split = await asyncio.create_subprocess_exec(
                config.server, "-m", config.model, "-ngl", str(config.layers_at_centre), "--rpc", "%s:%d" % addresses["server"],
                "--host", "127.0.0.1", "--port", str(split_port), "-t", str(config.threads), "-c", "1024", "-np", "1", *SERVER_FLAGS,
                stdout=server_log, stderr=asyncio.subprocess.STDOUT)

            async def stop_split() -> None:
                if split.returncode is None:
                    split.terminate()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(split.wait(), 10)
                    if split.returncode is None:
                        split.kill()
                        await split.wait()
            stack.push_async_callback(stop_split)
            split_url = f"http://127.0.0.1:{split_port}"
            await wait_for_health(client, split_url, split)
            await stream_completion(client, split_url, 4)  # warm-up: first-request allocations
            await stream_completion(client, centre_url, 4)

        for rtt_ms in config.rtts_ms:
            for link in links.values():
                link.rtt = rtt_ms / 1000
            log(f"RTT {rtt_ms:g} ms: llama-bench split, {config.short_tokens} and {config.long_tokens} tokens")
            short, short_counts = await measured(links["bench"], run_llama_bench(config, config.short_tokens, rpc_bench, f"bench-split-{rtt_ms:g}ms-short"))
            long, long_counts = await measured(links["bench"], run_llama_bench(config, config.long_tokens, rpc_bench, f"bench-split-{rtt_ms:g}ms-long"))
            extra_tokens = config.repetitions * (config.long_tokens - config.short_tokens)
            bench_traffic = Traffic.per(long_counts - short_counts, extra_tokens)

            result = RttResult(rtt_ms=rtt_ms, bench_tokens_per_s=float(long["avg_ts"]), bench_per_token=bench_traffic)
            if config.with_server:
                log(f"RTT {rtt_ms:g} ms: llama-server split and all at the centre, streaming {config.stream_tokens} tokens")
                _, prompt_counts = await measured(links["server"], stream_completion(client, split_url, 1))
                split_stream, split_counts = await measured(links["server"], stream_completion(client, split_url, config.stream_tokens))
                split_stream.traffic = split_counts
                centre_stream, centre_counts = await measured(links["http"], stream_completion(client, centre_url, config.stream_tokens))
                centre_stream.traffic = centre_counts
                result.split_stream = split_stream
                result.split_prompt_round_trips = prompt_counts.round_trips
                result.split_stream_per_token = Traffic.per(split_counts - prompt_counts, max(1, config.stream_tokens - 1))
                result.centre_stream = centre_stream
                result.centre_round_trips_per_request = centre_counts.round_trips
            results.rtts.append(result)
    return results


def main() -> int:
    config = EdgeConfig(**json.loads(sys.argv[1]))
    if not config.log_dir:
        config = EdgeConfig(**{**asdict(config), "log_dir": tempfile.mkdtemp(prefix="edgellm-split-")})
    results = asyncio.run(run(config))
    print(json.dumps(asdict(results)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
