"""Gateway overhead: the same chat requests through the local edge and straight to llama.cpp.

Both sides speak HTTP to a llama.cpp server loaded the same way (`LlamaCppRunner`, same GGUF,
n_ctx and slots, greedy decoding), in one run:
- gateway: the real local edge (`edgellm dev`, its own process) at `/v1/chat/completions`, which
  parses, validates, translates to Workers AI inputs, calls the llama.cpp binding and renders back;
  `cf-aig-skip-cache: true` keeps the answer cache out (its benchmark is bench_cache);
- direct: llama.cpp's own embedded HTTP server (`xllamacpp.Server(...).listening_address`).
Requests alternate between the two (ABBA order, so neither always goes first after the other
warms a cache), each pair with the same prompt, sequentially so the two never share the CPU.
Each pair must produce the same number of tokens (greedy output is identical within one
llama.cpp build), so the difference is the gateway's work alone.

Prints per mode (whole answers, and streams read to the end): the overhead ratio (sum of
gateway times / sum of direct times; target < 1.05x) and the added milliseconds per request at
p50 and p99 (paired differences).

    .venv/bin/python -m bench.bench_gateway [--iterations 3] [--max-tokens 96] [--modes json,stream]
        [--llama-server PATH] [--before /path/to/another/checkout]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.edge_process import load_average, running_edge
from bench.peer_llama import ENV_VAR, find_llama_server, running_llama_server
from edgellm.config import DEFAULT_MODEL
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.llama.model_file import default_model_path

PROMPTS = (
    "Write a long story about a lighthouse keeper during a storm.",
    "Explain in detail how a bicycle works, part by part.",
    "Describe a busy market in a coastal town at dawn.",
    "Write a detailed recipe for bread, with every step explained.",
    "Tell me about the history of maps and how they were made.",
)
TARGET_RATIO = 1.05
TARGET_MISS = 1.02  # whole 64-token answer p50, gateway / the edge's own llama.cpp
TARGET_TTFT = 1.0  # streamed TTFT p50, gateway / llama-server
GATEWAY_HEADERS = {"cf-aig-skip-cache": "true"}


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    rank = p / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class Side:
    name: str
    client: httpx.Client
    path: str
    extra: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)
    # llama.cpp's own time for the last streamed prompt (`timings.prompt_ms` on its final chunk;
    # None from the edge, which does not pass llama.cpp's timings on): the build's compute speed
    last_prompt_ms: float | None = None

    def request(self, prompt: str, max_tokens: int, stream: bool) -> tuple[float, int, float]:
        """(seconds to the last byte, completion tokens, seconds to the first text: the whole
        answer for json)."""
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
                **self.extra}
        if stream:
            body.update(stream=True, stream_options={"include_usage": True})
        started = time.perf_counter()
        if not stream:
            response = self.client.post(self.path, json=body, headers=self.headers)
            elapsed = time.perf_counter() - started
            response.raise_for_status()
            return elapsed, int(response.json()["usage"]["completion_tokens"]), elapsed
        tokens = 0
        ttft = None
        self.last_prompt_ms = None
        # llama.cpp's server drops a kept-alive connection after a stream, so streams use a
        # fresh connection on both sides (loopback connect: a fraction of a millisecond)
        headers = {**self.headers, "connection": "close"}
        with self.client.stream("POST", self.path, json=body, headers=headers) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if ttft is None and line.startswith("data: {") and '"content":"' in line and '"content":""' not in line:
                    ttft = time.perf_counter() - started
                if line.startswith("data: {") and '"usage":{' in line:
                    final = json.loads(line[len("data: "):])
                    tokens = int(final["usage"]["completion_tokens"])
                    if isinstance(final.get("timings"), dict) and "prompt_ms" in final["timings"]:
                        self.last_prompt_ms = float(final["timings"]["prompt_ms"])
        elapsed = time.perf_counter() - started
        return elapsed, tokens, ttft if ttft is not None else elapsed


@dataclass
class Result:
    gateway: list[float] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    gateway_ttft: list[float] = field(default_factory=list)
    direct_ttft: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)  # llama-server, its own process (when given)
    peer_ttft: list[float] = field(default_factory=list)
    before: list[float] = field(default_factory=list)  # another version's edge (--before), same run
    before_ttft: list[float] = field(default_factory=list)
    direct_prompt_ms: list[float] = field(default_factory=list)  # llama.cpp's own prompt time, per side
    peer_prompt_ms: list[float] = field(default_factory=list)
    loads: list[float] = field(default_factory=list)

    def report(self, mode: str) -> None:
        if not self.gateway:
            print(f"\n[{mode}] nothing measured within the time budget")
            return
        added_ms = [(g - d) * 1000 for g, d in zip(self.gateway, self.direct)]
        ratio = sum(self.gateway) / sum(self.direct)
        print(f"\n[{mode}] {len(self.gateway)} pairs, {statistics.mean(self.tokens):.0f} tokens per answer on average")
        print(f"  direct  llama.cpp  p50 {percentile(self.direct, 50) * 1000:8.1f} ms   p99 {percentile(self.direct, 99) * 1000:8.1f} ms")
        print(f"  gateway local edge p50 {percentile(self.gateway, 50) * 1000:8.1f} ms   p99 {percentile(self.gateway, 99) * 1000:8.1f} ms")
        print(f"  added by the gateway: p50 {percentile(added_ms, 50):+.1f} ms   p99 {percentile(added_ms, 99):+.1f} ms")
        print(f"  overhead ratio {ratio:.3f}x (median of pair ratios "
              f"{statistics.median(g / d for g, d in zip(self.gateway, self.direct)):.3f}x), "
              f"target < {TARGET_RATIO}x: {'met' if ratio < TARGET_RATIO else 'NOT met'}")
        g50, d50 = percentile(self.gateway, 50), percentile(self.direct, 50)
        print(f"  whole answer p50: gateway / the edge's own llama.cpp = {g50 / d50:.3f}x (MISS target <= {TARGET_MISS}x: "
              f"{'met' if g50 / d50 <= TARGET_MISS else 'NOT met'})")
        if mode == "stream":
            gt, dt = percentile(self.gateway_ttft, 50), percentile(self.direct_ttft, 50)
            print(f"  TTFT p50: gateway {gt * 1000:.1f} ms, the edge's own llama.cpp {dt * 1000:.1f} ms ({gt / dt:.3f}x)")
            if self.peer_ttft:
                pt = percentile(self.peer_ttft, 50)
                print(f"  TTFT p50: llama-server {pt * 1000:.1f} ms; gateway / llama-server = {gt / pt:.3f}x "
                      f"(target <= {TARGET_TTFT}x: {'met' if gt / pt <= TARGET_TTFT else 'NOT met'})")
        if mode == "stream" and self.direct_prompt_ms and self.peer_prompt_ms:
            dp, pp = statistics.median(self.direct_prompt_ms), statistics.median(self.peer_prompt_ms)
            print(f"  llama.cpp's own prompt time p50 (timings.prompt_ms, 1 token computed): the edge's build {dp:.1f} ms, "
                  f"llama-server's build {pp:.1f} ms")
            print(f"  TTFT beyond it p50: gateway {gt * 1000 - dp:.1f} ms (the edge's build), the edge's own llama.cpp "
                  f"{dt * 1000 - dp:.1f} ms, llama-server {pt * 1000 - pp:.1f} ms")
        if self.peer:
            print(f"  llama-server (own process, own build) whole answer p50 {percentile(self.peer, 50) * 1000:.1f} ms")
        if self.before:
            b50 = percentile(self.before, 50)
            print(f"  before (--before) whole answer p50 {b50 * 1000:.1f} ms: / the edge's own llama.cpp = {b50 / d50:.3f}x "
                  f"(this tree {g50 / d50:.3f}x)")
            if mode == "stream":
                bt = percentile(self.before_ttft, 50)
                versus = f"; / llama-server = {bt / pt:.3f}x" if self.peer_ttft else ""
                print(f"  TTFT p50: before {bt * 1000:.1f} ms, this tree {gt * 1000:.1f} ms "
                      f"(before / the edge's own llama.cpp = {bt / dt:.3f}x{versus})")
        print(f"  load (1 min) during the rounds: {', '.join(f'{x:.2f}' for x in self.loads)}")


def run_mode(gateway: Side, direct: Side, peer: Side | None, args: argparse.Namespace, stream: bool, deadline: float,
             before: Side | None = None) -> Result:
    """Rounds of the prompts, each pair in ABBA order (llama-server, when given, last; another
    version's edge, when given, third in the pair's order every other pair); stops between rounds
    once `deadline` (time.monotonic) has passed, so a busy machine shortens the run rather than
    hanging it."""
    result = Result()
    for i in range(args.warmup + args.iterations):
        if i > args.warmup and time.monotonic() > deadline:
            print(f"  [{'stream' if stream else 'json'}] time budget spent: {i - args.warmup} of {args.iterations} rounds measured")
            break
        result.loads.append(load_average())
        for j, prompt in enumerate(PROMPTS[: args.prompts]):
            order: tuple[Side, ...] = (gateway, direct) if (i + j) % 2 == 0 else (direct, gateway)
            if before is not None:  # first, between or last in turn, so neither edge always follows the other
                at = (i + j) % 3
                order = (*order[:at], before, *order[at:])
            timings = {side.name: side.request(prompt, args.max_tokens, stream) for side in order}
            (g, g_tokens, g_ttft), (d, d_tokens, d_ttft) = timings["gateway"], timings["direct"]
            if g_tokens != d_tokens:
                raise SystemExit(f"unequal work: gateway generated {g_tokens} tokens, direct {d_tokens} for {prompt!r}")
            if before is not None and timings["before"][1] != d_tokens:
                raise SystemExit(f"unequal work: before generated {timings['before'][1]} tokens, direct {d_tokens} for {prompt!r}")
            p = peer.request(prompt, args.max_tokens, stream) if peer is not None else None
            if i >= args.warmup:
                result.gateway.append(g)
                result.direct.append(d)
                result.tokens.append(g_tokens)
                result.gateway_ttft.append(g_ttft)
                result.direct_ttft.append(d_ttft)
                if p is not None:
                    result.peer.append(p[0])
                    result.peer_ttft.append(p[2])
                if direct.last_prompt_ms is not None:
                    result.direct_prompt_ms.append(direct.last_prompt_ms)
                if peer is not None and peer.last_prompt_ms is not None:
                    result.peer_prompt_ms.append(peer.last_prompt_ms)
                if before is not None:
                    result.before.append(timings["before"][0])
                    result.before_ttft.append(timings["before"][2])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=3, help="measured rounds over the prompts, per mode (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), choices=range(1, len(PROMPTS) + 1), metavar="N")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--modes", default="json,stream", help="json, stream or both (default json,stream)")
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--llama-server", default=None, help=f"llama.cpp's llama-server binary (or ${ENV_VAR}) for the TTFT peer row")
    parser.add_argument("--threads", type=int, default=1,
                        help="llama.cpp threads, every side (default 1: on a shared 2-core machine a 2-thread llama.cpp "
                             "stalls at its barriers whenever another process takes a core, 5-50 s for one answer at load 10)")
    parser.add_argument("--before", type=Path, default=None,
                        help="a directory holding another version's src/ and local/ (a checkout, or `git archive` of a "
                             "commit): its edge is measured too, in the same rounds, for a before/after in one run")
    parser.add_argument("--resident-slots", type=int, default=None, metavar="N",
                        help="the gateway edge's --resident-slots (default: its own, sized by memory; "
                             "the --before edge always runs with its own default)")
    parser.add_argument("--budget", type=float, default=300, help="seconds of measuring before rounds stop (default 300)")
    parser.add_argument("--timeout", type=float, default=60, help="seconds one request may take (default 60)")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"json", "stream"}:
        parser.error("--modes takes json, stream or json,stream")

    model = args.model or default_model_path()
    # the same loading parameters as the local edge's composition root (EdgeSettings defaults)
    runner = LlamaCppRunner(model, n_ctx=4096, n_parallel=2, threads=args.threads).load()
    binary = find_llama_server(args.llama_server)
    direct_url = runner._server.listening_address.rstrip("/")  # noqa: SLF001  (the runner's own server)
    print(f"model {model.name}; {args.prompts} prompts x {args.iterations} iterations (+{args.warmup} warm-up) "
          f"per mode, max_tokens {args.max_tokens}, temperature 0")
    with contextlib.ExitStack() as stack:
        resident = ["--resident-slots", str(args.resident_slots)] if args.resident_slots is not None else []
        edge_url = stack.enter_context(running_edge(str(model), extra=["--threads", str(args.threads), *resident]))
        edge_client = stack.enter_context(httpx.Client(base_url=edge_url, timeout=args.timeout))
        direct_client = stack.enter_context(httpx.Client(base_url=direct_url, timeout=args.timeout))
        gateway = Side("gateway", edge_client, "/v1/chat/completions", {"model": DEFAULT_MODEL}, GATEWAY_HEADERS)
        direct = Side("direct", direct_client, "/v1/chat/completions", {})
        before = None
        if args.before is not None:
            before_url = stack.enter_context(running_edge(str(model), extra=["--threads", str(args.threads)], code=args.before))
            before = Side("before", stack.enter_context(httpx.Client(base_url=before_url, timeout=args.timeout)),
                          "/v1/chat/completions", {"model": DEFAULT_MODEL}, GATEWAY_HEADERS)
            print(f"before: {args.before} at {before_url}")
        peer = None
        if binary is not None:
            peer_url = stack.enter_context(running_llama_server(binary, model, 4096, 2, runner.threads))
            peer = Side("llama-server", stack.enter_context(httpx.Client(base_url=peer_url, timeout=args.timeout)),
                        "/v1/chat/completions", {})
        print(f"gateway {edge_url} (edgellm dev)   direct {direct_url} (the edge's own llama.cpp)"
              f"{f'   llama-server {peer.client.base_url}' if peer else ''}   load {load_average():.2f}")
        started = time.monotonic()
        deadline = started + args.budget
        for mode in modes:
            run_mode(gateway, direct, peer, args, stream=(mode == "stream"), deadline=deadline, before=before).report(mode)
        print(f"\n{time.monotonic() - started:.0f} s of measuring")
    runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
