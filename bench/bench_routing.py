"""Routing under injected edge faults: every request still answers, and what it costs.

The edge is the local edge in this process (llama.cpp behind `FaultyAI`, the binding-seam
fault injector); the origin is a second local edge (`edgellm dev`, its own process) with the
same GGUF. Sequential streamed chat requests (so timings are per request, not queueing), in
one run:
- baseline: no faults;
- half of the edge calls fail at the call (-> origin before any token);
- a stall after 4 tokens in a third of the streams (-> the origin continues the sent text),
  with a stall budget of `--stall-ms`.
Prints the success rate (a 200 with a complete stream, `[DONE]`, no error event), the added
latency at p50/p99 against the baseline, and the time from the stall budget running out to the
first origin token. Then the edge-side token counting cost per request (pure-Python BPE, the
SmolLM2 tokenizer.json, cold word cache) at 1k and 8k prompt tokens, against `tokenizers`.

    .venv/bin/python -m bench.bench_routing [--requests 12] [--model PATH.gguf] [--max-tokens 24] [--stall-ms 2000]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.edge_process import load_average, running_edge
from edgellm.config import Config
from edgellm.tokenizer import Tokenizer
from edgellm_local.llama.model_file import default_model_path
from edgellm_local.edge import EdgeSettings, build_deps
from edgellm_local.doubles.faults import FaultPlan, FaultyAI
from edgellm_local.emulator.server import EdgeApp, EdgeServer

PROMPTS = ("Write a story about a lighthouse.", "Explain how a bicycle works.", "Describe a market at dawn.",
           "Give a recipe for bread.", "Tell me about the history of maps.")


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


def one_request(client: httpx.Client, prompt: str, max_tokens: int) -> tuple[bool, float, str]:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0.6, "stream": True}
    started = time.perf_counter()
    done, error, route = False, False, ""
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        route = response.headers.get("x-edgellm-route", "")
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: {"):
                event = json.loads(line[6:])
                error = error or "error" in event
                route = event.get("edgellm_route") or route
    return response.status_code == 200 and done and not error, (time.perf_counter() - started) * 1000, route


def scenario(client: httpx.Client, faulty: FaultyAI, server: EdgeServer, plan: FaultPlan, n: int, max_tokens: int) -> dict[str, Any]:
    faulty.plan, faulty.rng = plan, random.Random(1)
    ok, times, routes, stall_to_origin = 0, [], {}, []
    state = server.app.deps.state.routing
    for i in range(n):
        state.last_stall_to_origin_ms = None
        success, ms, route = one_request(client, PROMPTS[i % len(PROMPTS)], max_tokens)
        ok += success
        times.append(ms)
        kind = route.split(";")[0]
        routes[kind] = routes.get(kind, 0) + 1
        if state.last_stall_to_origin_ms is not None:
            stall_to_origin.append(state.last_stall_to_origin_ms)
    return {"ok": ok, "n": n, "times": times, "routes": routes, "stall_to_origin": stall_to_origin}


def counting_cost(repeats: int) -> None:
    from tokenizers import Tokenizer as HFTokenizer

    import gguf

    from edgellm_local.hub.gguf_tokenizer import build_tokenizer

    spec = build_tokenizer(gguf.GGUFReader(default_model_path())).to_str()
    ours, hf = Tokenizer.from_json(json.loads(spec)), HFTokenizer.from_str(spec)
    words = [w for w in Path(__file__).read_text().split() if w.isascii()] or ["token"]
    rng = random.Random(0)
    print("edge token counting (pure Python, cold word cache each request; `tokenizers` for reference):")
    for target in (1000, 8000):
        text = ""
        while len(hf.encode(text).ids) < target:
            text += " " + " ".join(rng.choice(words) for _ in range(200))
        count = len(hf.encode(text).ids)
        samples = []
        for _ in range(repeats):
            ours._cache.clear()
            started = time.perf_counter()
            assert ours.count(text) == count
            samples.append((time.perf_counter() - started) * 1000)
        warm = time.perf_counter()
        ours.count(text)
        warm_ms = (time.perf_counter() - warm) * 1000
        started = time.perf_counter()
        for _ in range(repeats):
            hf.encode(text)
        hf_ms = (time.perf_counter() - started) * 1000 / repeats
        print(f"  {count:5d} tokens: p50 {statistics.median(samples):7.1f} ms cold, {warm_ms:6.1f} ms with the isolate's word cache warm; "
              f"tokenizers {hf_ms:5.1f} ms ({statistics.median(samples) / hf_ms:.0f}x)")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--model", help="GGUF for both edge and origin (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--stall-ms", type=int, default=2000)
    args = parser.parse_args()
    model = Path(args.model) if args.model else default_model_path()
    print(f"model {model.name}; {args.requests} sequential streamed requests per scenario, max_tokens {args.max_tokens}; "
          "figures from a shared, busy machine")
    # both sides in open mode on loopback: the API needs a key otherwise, and every request was a 401
    with running_edge(model, extra=["--open"]) as origin_url, tempfile.TemporaryDirectory() as state:
        config = Config.from_env({"OPEN_ACCESS": "true", "ORIGINS": json.dumps([{"name": "origin", "url": origin_url}]),
                                  "EDGE_STALL_MS": str(args.stall_ms), "EDGE_FIRST_TOKEN_MS": "30000",
                                  "BREAKER": json.dumps({"failures": 10**6})})  # measure failover itself, not the breaker
        deps = build_deps(EdgeSettings(model_path=model, state_dir=Path(state), config=config))
        faulty = FaultyAI(deps.ai)
        with EdgeServer(EdgeApp(replace(deps, ai=faulty, kv=None))) as server, httpx.Client(base_url=server.url, timeout=120) as client:
            one_request(client, PROMPTS[0], 4)  # warm both sides
            httpx.post(f"{origin_url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, timeout=60)
            results = {
                "no faults": scenario(client, faulty, server, FaultPlan(), args.requests, args.max_tokens),
                "50% edge calls fail": scenario(client, faulty, server, FaultPlan(fail=0.5), args.requests, args.max_tokens),
                "stall in 1/3 of streams": scenario(client, faulty, server, FaultPlan(stall=1 / 3, after=4), args.requests, args.max_tokens),
            }
    base = results["no faults"]["times"]
    all_ok = True
    for name, r in results.items():
        times = r["times"]
        all_ok = all_ok and r["ok"] == r["n"]
        line = (f"{name:24s} success {r['ok']}/{r['n']} ({100 * r['ok'] / r['n']:.0f}%)  routes {r['routes']}  "
                f"p50 {percentile(times, 50):6.0f} ms  p99 {percentile(times, 99):6.0f} ms")
        if name != "no faults":
            line += f"  added p50 {percentile(times, 50) - percentile(base, 50):+6.0f} ms  p99 {percentile(times, 99) - percentile(base, 99):+6.0f} ms"
        print(line)
        if r["stall_to_origin"]:
            s = r["stall_to_origin"]
            print(f"{'':24s} stall budget ({args.stall_ms} ms) out -> first origin token: p50 {percentile(s, 50):.0f} ms, "
                  f"max {max(s):.0f} ms over {len(s)} stalls")
    print(f"load (1 min) after the scenarios: {load_average():.2f}")
    counting_cost(repeats=5)
    print("target: every request succeeds:", "met" if all_ok else "MISSED")
    return 0 if all_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
