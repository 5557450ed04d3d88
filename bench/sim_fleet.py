"""A discrete-event simulation of the fleet past this machine: 64 to 512 replicas, thousands of
requests a second, many Worker isolates each with a partial view, and the pool's Durable Object.

The decisions are the gateway's own code, not a copy: every isolate (and the pool's object)
keeps an `edgellm.routing.fleet.PoolView` and calls its `choose`, `dispatched` and `finished`,
which run `edgellm.routing.scheduler` (round-robin, least in flight, session, the scheduler).
What is simulated is everything around them:

- a replica: up to `slots` requests served at once, sharing its compute (processor sharing),
  the rest waiting in order; a request's work is (uncached prompt tokens x prefill cost +
  output tokens x decode cost), costs measured on this machine (`--measure`, or the defaults
  below, measured with SmolLM2-135M on one thread); its KV cache holds `cache_tokens` tokens of
  prompt blocks, least recently used evicted; what it reuses is what it really holds.
- isolates: each request lands on a random isolate; an isolate sees its own dispatches, their
  first tokens and the gaps between their tokens as they stream (`LiveGaps`), and probes a
  replica's queue when its reading is older than the probe age (the probe's round trip is added
  to the request); its view is otherwise blind to the other isolates.
- the pool's Durable Object ("object"): one view for the pool, reached with a round trip of
  `--object-rtt-ms` (log-normal), serving one call at a time at `--object-call-ms` each (picks
  and done reports); a request whose pick has not come back within `router_ms` decides from its
  isolate's view ("object+fallback", as the gateway does).
- (d): one replica in eight runs 4x slower from the middle of the run.

Each line: TTFT p50 and p99, answers a second, prefix hits (prompt tokens the replicas reused,
of all they were sent), cold (the requests that prefilled more than half their prompt: where
more than 1% are cold, a p99 is at least one cold prefill, whatever the placement), probes a
second.

    .venv/bin/python -m bench.sim_fleet [--replicas 64,512] [--requests 10000] [--isolates 64] [--slots 4]
        [--cache-tokens 32768] [--apps N] [--popularity zipf|uniform] [--load 0.7] [--measure] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import itertools
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from edgellm.routing.config import PoolConfig
from edgellm.routing.fleet import LIVE_GAPS, PoolView, sane_reading
from edgellm.routing.scheduler import BLOCK_CHARS, Ask

# Measured on this machine (`--measure`: a bench_fleet replica, SmolLM2-135M Q4_1 on llama.cpp, one
# thread, on the shared 2-core host at a load average near 15): seconds per uncached prompt token and
# per generated token, from the replica's own counters. The simulated replicas run them `--speedup`
# times faster (a GPU replica's scale); the ratios between them are what was measured.
PREFILL_S = 0.0513
DECODE_S = 0.227
CHARS_PER_TOKEN = 4.0


@dataclass
class Job:
    id: int
    arrival: float
    isolate: int
    blocks: tuple[int, ...]
    prompt_tokens: int
    out_tokens: int
    session: str | None
    continues: bool = False  # a later turn of its conversation
    replica: int = -1
    uncached: int = 0
    work_first: float = 0.0  # work until the first token
    work_total: float = 0.0
    done_work: float = 0.0
    start: float = 0.0
    first_at: float | None = None
    end: float | None = None
    extra_latency: float = 0.0
    decider: Any = None  # the view that decided (to report `finished` to)
    also: list[Any] = field(default_factory=list)
    expected: dict[int, Any] = field(default_factory=dict)  # id(view) -> what that view expected of the replica
    live: Any = None  # its `LiveGaps` once it streams


@dataclass
class SimReplica:
    name: str
    slots: int
    cache_tokens: int
    speed: float = 1.0
    active: list[Job] = field(default_factory=list)
    waiting: list[Job] = field(default_factory=list)
    cache: dict[int, None] = field(default_factory=dict)  # insertion-ordered: an LRU of prompt blocks
    last: float = 0.0
    version: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0

    def advance(self, now: float) -> None:
        if self.active and now > self.last:
            share = (now - self.last) * self.speed / len(self.active)
            for job in self.active:
                job.done_work += share
        self.last = now

    def held(self, blocks: tuple[int, ...]) -> int:
        n = 0
        for block in blocks:
            if block not in self.cache:
                break
            n += 1
        return n

    def remember(self, blocks: tuple[int, ...]) -> None:
        for block in blocks:
            self.cache.pop(block, None)
            self.cache[block] = None
        limit = self.cache_tokens // (BLOCK_CHARS // int(CHARS_PER_TOKEN))
        while len(self.cache) > limit:
            self.cache.pop(next(iter(self.cache)))


class LiveGaps(Sequence[float]):
    """A streaming answer's latest gaps between tokens, as the isolates that sent it see them: a
    replica shares its compute among its active requests, so each of its tokens now comes the
    decode cost x its active requests / its speed apart; as many gaps as tokens since the first
    (up to the `LIVE_GAPS` a view reads)."""

    def __init__(self, sim: "Sim", job: Job) -> None:
        self.sim, self.job = sim, job

    def gap(self) -> float:
        r = self.sim.replicas[self.job.replica]
        return self.sim.decode_s * max(1, len(r.active)) / r.speed

    def __len__(self) -> int:
        assert self.job.first_at is not None
        return min(LIVE_GAPS, max(0, int((self.sim.now - self.job.first_at) / self.gap())))

    def __getitem__(self, i: int) -> float:  # type: ignore[override]
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self.gap()


def blocks_of(key: str, tokens: int) -> tuple[int, ...]:
    """Chained block ids of a prompt of `tokens` tokens whose text is determined by `key`
    (stands in for `prefix_blocks` of real text: same prefix, same leading ids)."""
    n = int(tokens * CHARS_PER_TOKEN) // BLOCK_CHARS
    return tuple(block_id(key, i) for i in range(n))


def block_id(*parts: object) -> int:
    """A stable id for a block (not `hash`, which is salted per process: a run must repeat)."""
    return int.from_bytes(hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=6).digest(), "big")


def conversation_blocks(system_key: str, turns: list[tuple[str, int]]) -> tuple[int, ...]:
    out = list(blocks_of(system_key, 1000))
    for key, tokens in turns:
        out.extend(block_id(system_key, key, i) for i in range(int(tokens * CHARS_PER_TOKEN) // BLOCK_CHARS))
    return tuple(out)


class Sim:
    def __init__(self, replicas: int, isolates: int, policy: str, placement: str, rate: float, seconds: float, workload: str,  # noqa: PLR0913
                 seed: int, prefill_s: float, decode_s: float, object_rtt_ms: float, object_call_ms: float,
                 router_ms: float, probe_rtt_ms: float, slots: int = 4, cache_tokens: int = 32_768, load_bound: float = 1.0,
                 apps: int | None = None, popularity: str = "zipf") -> None:
        self.rng = random.Random(seed)
        self.policy, self.placement, self.workload = policy, placement, workload
        self.rate, self.seconds = rate, seconds
        self.prefill_s, self.decode_s = prefill_s, decode_s
        self.object_rtt, self.object_call, self.router_s = object_rtt_ms / 1000, object_call_ms / 1000, router_ms / 1000
        self.probe_rtt = probe_rtt_ms / 1000
        names = tuple(f"r{i}" for i in range(replicas))
        self.pool = PoolConfig("fleet", names, policy=policy, load_bound=load_bound)
        self.replicas = [SimReplica(n, slots, cache_tokens) for n in names]
        self.by_name = {n: i for i, n in enumerate(names)}
        self.views = [PoolView(self.pool) for _ in range(isolates)]
        self.object = PoolView(self.pool, first_tokens=False)  # told of a request when it ends, as the Worker's object is
        self.object_free_at = 0.0
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = itertools.count()
        self.jobs: list[Job] = []
        self.fallbacks = self.object_answers = self.probes = self.skips = 0
        self.apps = apps or max(8, replicas // 2)
        self.zipf = [1 / (k + 1) if popularity == "zipf" else 1.0 for k in range(self.apps)]
        self.conversations: dict[int, list[tuple[str, int]]] = {}
        self.refreshed: dict[int, float] = {}
        self.now = 0.0

    def push(self, at: float, kind: str, data: Any) -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, data))

    # --- arrivals -----------------------------------------------------------------------------
    def new_job(self, at: float, i: int) -> Job:
        rng = self.rng
        out = rng.choice((8, 16, 32))
        isolate = rng.randrange(len(self.views))
        if self.workload == "unique":
            tokens = rng.choice((150, 400, 800, 1200))
            return Job(i, at, isolate, blocks_of(f"u{i}", tokens), tokens, out, None)
        if self.workload == "turns":
            c = rng.randrange(max(8, len(self.replicas) * 8))
            turns = self.conversations.setdefault(c, [])
            turns.append((f"t{len(turns)}", rng.choice((40, 120, 300))))
            if len(turns) > 12:
                turns.clear()
            blocks = conversation_blocks(f"app{c % self.apps}", turns)
            return Job(i, at, isolate, blocks, 1000 + sum(t for _, t in turns), out, f"c{c}", len(turns) > 1)
        app = rng.choices(range(self.apps), weights=self.zipf)[0]
        return Job(i, at, isolate, blocks_of(f"app{app}", 1000), 1000 + rng.choice((20, 60, 120)), out, None)

    def ask(self, job: Job) -> Ask:
        return Ask(job.blocks, float(job.prompt_tokens), int(job.prompt_tokens * CHARS_PER_TOKEN), job.session, continues=job.continues)

    # --- deciding (the gateway's own code) ----------------------------------------------------
    def refresh(self, view: PoolView, now: float) -> float:
        """Probe the replicas whose reading is older than the probe age: their true queue now."""
        age = self.pool.probe_age_ms / 1000
        if now - self.refreshed.get(id(view), -1e9) <= age:  # every reading of a view is taken at once
            return 0.0
        self.refreshed[id(view)] = now
        stale = self.replicas
        for r in stale:
            view.replicas[r.name].reading = sane_reading(now, len(r.active), len(r.waiting))
        self.probes += len(stale)
        return self.probe_rtt if stale else 0.0

    def decide(self, job: Job, now: float) -> None:
        view = self.views[job.isolate]
        ask = self.ask(job)
        if self.placement.startswith("object"):
            breaker = view.router_breaker
            if self.placement == "object+fallback" and breaker.admit(now) == "skip":
                self.skips += 1
                return self.decide_here(job, view, ask, now)
            rtt = self.rng.lognormvariate(math.log(self.object_rtt), 0.5)
            at_object = max(now + rtt / 2, self.object_free_at)
            self.object_free_at = at_object + 2 * self.object_call  # the pick, and later its done report
            back = at_object + self.object_call + rtt / 2
            if self.placement == "object" or back - now <= self.router_s:
                self.refresh(self.object, at_object)  # the object probes on its own time: no request waits for it
                picks = self.object.choose(ask, at_object)
                job.expected[id(self.object)] = self.object.dispatched(picks[0].name, ask, picks[0].reason, at_object)
                job.expected[id(view)] = view.dispatched(picks[0].name, ask, picks[0].reason, now)
                job.decider, job.also = self.object, [view]
                self.object_answers += 1
                breaker.success(back)
                self.push(back, "start", (job, picks[0].name))
                return
            self.fallbacks += 1
            now = now + self.router_s
            breaker.failure(now)
        self.decide_here(job, view, ask, now)

    def decide_here(self, job: Job, view: PoolView, ask: Ask, now: float) -> None:
        """The isolate's own view decides (after refreshing its stale readings)."""
        delay = self.refresh(view, now)
        picks = view.choose(ask, now)
        job.expected[id(view)] = view.dispatched(picks[0].name, ask, picks[0].reason, now)
        job.decider = view
        self.push(now + delay, "start", (job, picks[0].name))

    # --- serving ------------------------------------------------------------------------------
    def start(self, job: Job, name: str, now: float) -> None:
        r = self.replicas[self.by_name[name]]
        job.replica, job.start = self.by_name[name], now
        r.advance(now)
        if len(r.active) < r.slots:
            self.begin(r, job, now)
        else:
            r.waiting.append(job)
        self.schedule(r, now)

    def begin(self, r: SimReplica, job: Job, now: float) -> None:
        held = r.held(job.blocks)
        cached = min(job.prompt_tokens, held * BLOCK_CHARS // int(CHARS_PER_TOKEN))
        job.uncached = job.prompt_tokens - cached
        r.cached_tokens += cached
        r.prompt_tokens += job.prompt_tokens
        r.remember(job.blocks)
        job.work_first = job.uncached * self.prefill_s + self.decode_s
        job.work_total = job.work_first + (job.out_tokens - 1) * self.decode_s
        job.done_work = 0.0
        r.active.append(job)

    def schedule(self, r: SimReplica, now: float) -> None:
        r.version += 1
        if not r.active:
            return
        n = len(r.active)
        soonest = min((j.work_first - j.done_work) if j.first_at is None else (j.work_total - j.done_work) for j in r.active)
        self.push(now + max(0.0, soonest) * n / r.speed, "tick", (r, r.version))

    def tick(self, r: SimReplica, version: int, now: float) -> None:
        if version != r.version:
            return
        r.advance(now)
        eps = 1e-12
        for job in list(r.active):
            if job.first_at is None and job.done_work >= job.work_first - eps:
                job.first_at = now
                self.first_token(job)
            if job.done_work >= job.work_total - eps:
                job.end = now
                r.active.remove(job)
                self.finish(job, now)
        while r.waiting and len(r.active) < r.slots:
            self.begin(r, r.waiting.pop(0), now)
        self.schedule(r, now)

    def first_token(self, job: Job) -> None:
        """The isolates that sent `job` see its first token as it streams through them (the pool's
        object hears of a request only when it ends)."""
        assert job.first_at is not None
        name = self.replicas[job.replica].name
        job.live = LiveGaps(self, job)
        for view in [job.decider, *job.also]:
            if view is not self.object and id(view) in job.expected:
                view.prefilled(name, job.expected[id(view)], job.first_at)
                view.watch(name, job.live, job.first_at)

    def finish(self, job: Job, now: float) -> None:
        name = self.replicas[job.replica].name
        assert job.first_at is not None
        ttft = job.first_at - job.start
        itl = (now - job.first_at) / max(1, job.out_tokens - 1)
        seen = (ttft, itl, job.prompt_tokens - job.uncached, job.prompt_tokens, now - job.start)
        if job.decider is self.object:
            self.object.finished(name, now + self.object_rtt / 2, True, *seen, expected=job.expected.get(id(self.object)))
        for view in [job.decider, *job.also]:
            if view is not self.object:
                view.unwatch(name, job.live)
                view.finished(name, now, True, *seen, expected=job.expected.get(id(view)), prefilled=True)

    # --- the run ------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        at, i = 0.0, 0
        while at < self.seconds:
            at += self.rng.expovariate(self.rate)
            self.push(at, "arrive", i)
            i += 1
        if self.workload == "slowed":
            self.push(self.seconds / 2, "slow", None)
        self.slowed_at: float | None = None
        while self.events:
            now, _, kind, data = heapq.heappop(self.events)
            self.now = now
            if kind == "arrive":
                job = self.new_job(now, data)
                self.jobs.append(job)
                self.decide(job, now)
            elif kind == "start":
                self.start(data[0], data[1], now)
            elif kind == "tick":
                self.tick(data[0], data[1], now)
            elif kind == "slow":
                self.slowed_at = now
                for r in self.replicas[:: 8]:
                    r.advance(now)
                    r.speed = 0.25
                    self.schedule(r, now)
        return self.summary()

    def summary(self) -> dict[str, Any]:
        done = [j for j in self.jobs if j.end is not None and j.first_at is not None]
        ttft = sorted(j.first_at - j.arrival for j in done)  # type: ignore[operator]
        span = max(j.end for j in done) - min(j.arrival for j in done)  # type: ignore[type-var]
        cached = sum(r.cached_tokens for r in self.replicas)
        prompt = sum(r.prompt_tokens for r in self.replicas)
        out = {"n": len(done), "ttft_p50_ms": _pct(ttft, 50) * 1000, "ttft_p99_ms": _pct(ttft, 99) * 1000,
               "throughput_rps": len(done) / span, "hit_rate": cached / prompt if prompt else 0.0,
               "cold_share": sum(j.uncached > j.prompt_tokens / 2 for j in done) / max(1, len(done)),
               "fallbacks": self.fallbacks, "object_answers": self.object_answers, "skips": self.skips,
               "probes_per_s": self.probes / self.seconds}
        if self.slowed_at is not None:
            slow = {self.replicas[k].name for k in range(0, len(self.replicas), 8)}
            after = [j for j in done if j.arrival >= self.slowed_at + self.seconds / 10]
            out["slowed_share_after"] = sum(self.replicas[j.replica].name in slow for j in after) / max(1, len(after))
            out["slowed_fair_share"] = len(slow) / len(self.replicas)
        return out


def _pct(ordered: list[float], p: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))] if ordered else float("nan")


def measure() -> tuple[float, float]:
    """Seconds per uncached prompt token and per generated token of one SmolLM2 replica here."""
    import httpx

    from bench.bench_fleet import system_prompt
    from bench.fleet_replicas import Replica
    from edgellm_local.llama.model_file import default_model_path

    replica = Replica.start(default_model_path(), "measure", ctx=8192)
    try:
        for i in range(3):
            httpx.post(replica.url + "/v1/chat/completions", timeout=600, json={
                "messages": [{"role": "system", "content": system_prompt(100 + i, 1000)}, {"role": "user", "content": "hi"}],
                "max_tokens": 32, "temperature": 0}).raise_for_status()
        m = replica.metrics()
        return (m["llamacpp:prompt_seconds_total"] / m["llamacpp:prompt_tokens_total"],
                m["llamacpp:tokens_predicted_seconds_total"] / m["llamacpp:tokens_predicted_total"])
    finally:
        replica.stop()


PLACEMENTS = ("isolates", "object", "object+fallback")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default=None, help="pool sizes (default: 64,512; --quick: 8)")
    parser.add_argument("--isolates", type=int, default=64)
    parser.add_argument("--requests", type=int, default=10_000, help="requests per run (the run lasts as long as they take to arrive)")
    parser.add_argument("--load", type=float, default=0.7, help="arrivals as a fraction of the fleet's capacity for cold requests")
    parser.add_argument("--workloads", default="shared,turns,unique,slowed")
    parser.add_argument("--policies", default="round-robin,least-in-flight,session,scheduler")
    parser.add_argument("--placements", default=",".join(PLACEMENTS), help="for the scheduler (the baselines run in isolates)")
    parser.add_argument("--object-rtt-ms", type=float, default=5.0, help="median round trip to the pool's object")
    parser.add_argument("--object-call-ms", type=float, default=1.0, help="the object's time per call (picks and reports)")
    parser.add_argument("--router-ms", type=float, default=10.0)
    parser.add_argument("--probe-rtt-ms", type=float, default=2.0)
    parser.add_argument("--prefill-s", type=float, default=PREFILL_S)
    parser.add_argument("--decode-s", type=float, default=DECODE_S)
    parser.add_argument("--speedup", type=float, default=1000.0,
                        help="replicas this much faster than the measured one (a GPU replica; the ratios are what matter)")
    parser.add_argument("--measure", action="store_true", help="measure prefill and decode costs on a real replica first")
    parser.add_argument("--slots", type=int, default=4, help="requests a replica serves at once")
    parser.add_argument("--cache-tokens", type=int, default=32_768,
                        help="prompt tokens a replica's KV cache keeps (32,768: every application's prompt on every replica "
                             "at 64 replicas; 3,200: three of them, as bench_fleet's replicas)")
    parser.add_argument("--load-bound", type=float, default=1.0)
    parser.add_argument("--apps", type=int, default=None, help="applications (system prompts) in (a) (default: half the replicas, at least 8)")
    parser.add_argument("--popularity", choices=("zipf", "uniform"), default="zipf", help="how (a)'s requests spread over the applications")
    parser.add_argument("--seed", type=int, default=1, help="the draw of arrivals, prompts and isolates (the same seed repeats a run exactly)")
    parser.add_argument("--quick", action="store_true", help="300 requests (8 replicas unless --replicas): the plumbing only")
    args = parser.parse_args(argv)
    prefill_s, decode_s = measure() if args.measure else (args.prefill_s, args.decode_s)
    print(f"costs: {prefill_s * 1000:.2f} ms a prompt token, {decode_s * 1000:.1f} ms a generated token (measured), "
          f"replicas {args.speedup:g}x faster", flush=True)
    prefill_s, decode_s = prefill_s / args.speedup, decode_s / args.speedup
    sizes = [int(s) for s in (args.replicas or ("8" if args.quick else "64,512")).split(",")]
    requests = 300 if args.quick else args.requests
    cold = 1060 * prefill_s + 18.7 * decode_s  # a mean cold request of workload (a)
    for workload in args.workloads.split(","):
        for size in sizes:
            rate = args.load * size / cold
            seconds = requests / rate
            for policy in args.policies.split(","):
                placements = args.placements.split(",") if policy == "scheduler" else ["isolates"]
                for placement in placements:
                    started = time.perf_counter()
                    sim = Sim(size, args.isolates, policy, placement, rate, seconds, workload, args.seed, prefill_s, decode_s,
                              args.object_rtt_ms, args.object_call_ms, args.router_ms, args.probe_rtt_ms, args.slots,
                              args.cache_tokens, args.load_bound, args.apps, args.popularity)
                    row = sim.run()
                    extra = ""
                    if "slowed_share_after" in row:
                        extra = f"  slowed share {row['slowed_share_after']:.3f} (fair {row['slowed_fair_share']:.3f})"
                    if placement != "isolates":
                        extra += f"  object answers {row['object_answers']}, fallbacks {row['fallbacks']}, not asked {row['skips']}"
                    print(f"{workload:>7} {size:4d} replicas {rate:7.0f}/s {policy:>16} {placement:>16}: TTFT p50 "
                          f"{row['ttft_p50_ms']:8.1f} ms  p99 {row['ttft_p99_ms']:8.1f} ms  {row['throughput_rps']:7.0f}/s  "
                          f"hits {row['hit_rate']:.0%}  cold {row['cold_share']:.1%}  probes {row['probes_per_s']:.0f}/s{extra}  "
                          f"({time.perf_counter() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
