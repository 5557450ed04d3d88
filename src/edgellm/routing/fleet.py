"""A pool's replicas as one view keeps them: in flight, reported load, held prefixes, health.

Plain data (numbers, bounded dictionaries), no I/O: an isolate keeps one `PoolView` per pool in
its `RoutingState` (its own partial view: what it sent, what it probed), and the pool's Durable
Object keeps one for the whole pool (`routing.router`). Both feed `scheduler.schedule` the same
`ReplicaView`s, so the two decide alike given the same knowledge.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from .breaker import CircuitBreaker
from .config import BreakerConfig, PoolConfig
from .scheduler import BLOCK_CHARS, CHARS_PER_TOKEN, FORGET_S, TOLERANCE, Ask, Pick, ReplicaView, median, schedule

HELD_BLOCKS = 8192  # prefix blocks remembered per replica at most (about 2 MiB of prompt at 256 characters a block)
MIN_HELD_BLOCKS = 16  # the learned bound never goes below this (4 KiB of prompt: one long system prompt)
MISSED = 0.5  # a replica that reused less than this share of what it was expected to had let it go
GROWTH = 1.25  # the bound grows by this when a replica reused clearly more than was remembered there
SESSIONS = 4096  # sessions remembered per pool (their last replica)
EWMA = 0.3
BLOCK_TOKENS = BLOCK_CHARS / CHARS_PER_TOKEN
MIN_PREFILL_SAMPLE = BLOCK_TOKENS  # new tokens an answer must have prefilled to time the prefill
MAX_QUEUE = 100_000.0  # a reported queue above this is not a count
STALL = 4.0  # a gap this many times an answer's typical one is another request's work, not this one's
STALL_SHARE = 8  # more stalls than one gap in this many (or than one) are the replica's own pace
SAME_CHUNK_S = 0.001  # tokens closer than this arrived together (a proxy or the network batched them)
MAX_GAPS = 1024  # an answer's first gaps measure its speed as well as all of them would
LIVE_GAPS = 32  # the gaps of a streaming answer that say how fast its replica is now
MIN_LIVE_GAPS = 8  # fewer say too little
MAX_SLOW_STREAK = 8  # a replica slow this many answers in a row forgets it this many times slower, and no slower


def time_between_tokens(gaps: Sequence[float], shared: bool = True, explained_s: float = 0.0) -> float | None:
    """A replica's own speed, from the gaps between an answer's tokens: their mean, leaving out
    stalls when the replica was `shared` with other requests (gaps over `STALL` times the typical
    one, the lower median of the gaps between chunks). A replica that batches requests stops
    decoding this answer while it prefills another's prompt (llama.cpp takes a prompt's batch
    between two of this answer's tokens; vLLM a chunk of it), so a plain mean counts a
    neighbour's cold prompt as this replica's slowness. Without a neighbour a stall is the
    replica's own (paused, throttled), and so is a pause at every turn: stalls count when they
    are more than one gap in `STALL_SHARE`, unless the time they took beyond the answer's
    typical gap fits in the time a neighbour waited there for its first token while the answer
    streamed (`explained_s`: `ReplicaState.awaited`; a long prompt may stall a short answer more
    than once, prefilled a batch at a time). The wait is timed, not estimated from the
    neighbour's prompt: a prompt the view took to be held there but prefilled again stalls the
    answers beside it as long as any cold one. Tokens that arrived together count at their
    chunk's gap shared among them. None without a gap, or when every gap is nothing."""
    usable = [g for g in gaps if math.isfinite(g) and g >= 0]
    chunks = sorted(g for g in usable if g >= SAME_CHUNK_S)
    if not usable or not sum(usable) > 0:
        return None
    steady = usable
    if shared and chunks:
        typical = chunks[(len(chunks) - 1) // 2]
        below = [g for g in usable if g <= STALL * typical]
        stalls = len(usable) - len(below)
        few = stalls <= max(1, len(usable) // STALL_SHARE)
        if few or sum(usable) - sum(below) - stalls * typical <= explained_s:
            steady = below
    return sum(steady) / len(steady)


@dataclass(frozen=True)
class Reading:
    """What a replica said of its own load at `at`: requests running and waiting, KV cache use
    (0..1, None when not reported). `ok` False: the probe failed or the figures were nonsense."""

    at: float
    ok: bool
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float | None = None
    why: str = ""

    @property
    def queue(self) -> float:
        return self.running + self.waiting


def sane_reading(at: float, running: Any, waiting: Any, kv_usage: Any = None) -> Reading:
    """A reading from raw figures: a negative, NaN, infinite or enormous count (or a KV use
    outside 0..1) is a replica reporting nonsense, scored unhealthy rather than believed."""
    figures = {"running": running, "waiting": waiting}
    for name, value in figures.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or not 0 <= value <= MAX_QUEUE:
            return Reading(at, False, why=f"{name} {value!r} is not a count")
    if kv_usage is not None and (not isinstance(kv_usage, (int, float)) or not math.isfinite(kv_usage) or not 0 <= kv_usage <= 1.0):
        return Reading(at, False, why=f"KV use {kv_usage!r} is not a fraction")
    return Reading(at, True, float(running), float(waiting), None if kv_usage is None else float(kv_usage))


@dataclass(frozen=True)
class Expected:
    """What a view counted on when it sent a request to a replica, for the answer to be held
    against (`ReplicaState.learn`): the prompt's leading blocks it took the replica to hold
    (`held`) and the prompt tokens that meant it would reuse (`cached_tokens`); how many other
    blocks had been remembered there since the last of them (`depth`: its place in the
    replica's least-recently-used order); whether a request on those same blocks was still in
    flight there (`concurrent`: a replica serving a prompt in one slot may prefill it again in
    another, which says nothing of what it keeps); whether the prompt continues a conversation
    this view sent there before (`continued`: the replica also keeps that turn's answer, which
    this view never saw, so its reusing more than expected says nothing either). `new_tokens`:
    the prompt tokens it left to prefill there, counted as work queued on the replica until the
    request ends."""

    blocks: tuple[int, ...] = ()
    held: int = 0
    depth: int = 0
    cached_tokens: float = 0.0
    concurrent: bool = False
    continued: bool = False
    new_tokens: float = 0.0


@dataclass
class ReplicaState:
    name: str
    breaker: CircuitBreaker
    in_flight: int = 0
    sent: int = 0
    errors: int = 0
    prefix_hits: int = 0  # requests sent here because it held their prefix
    held: OrderedDict[int, None] = field(default_factory=OrderedDict)
    reading: Reading | None = None
    ttft_s: float | None = None
    itl_s: float | None = None
    itl_at: float | None = None  # when `itl_s` was last measured
    idle_at: float | None = None  # when this view last had nothing in flight here
    slow_streak: int = 0  # its answers in a row that measured it slow against the pool (`PoolView.finished`)
    prefill_s: float | None = None  # time to first token a new prompt token, smoothed
    answer_s: float | None = None  # time from first to last token, smoothed
    mean_new: float | None = None  # new prefill tokens a request (the prompt less what it reused), smoothed
    cached_tokens: int = 0  # what the replica itself said it reused from its cache
    prompt_tokens: int = 0
    # how many prefix blocks the replica is taken to keep: a serving replica's KV cache holds a few
    # prompts, not all it was ever sent, so the bound is learned from its answers (`learn`)
    held_bound: int = HELD_BLOCKS
    serving: Counter[int] = field(default_factory=Counter)  # the blocks of the prompts in flight here
    # blocks a request still waiting for its first token brought here, held here by nothing before
    # it: not computed yet, so no other request can take them from the replica's cache. Each with
    # when it was sent and the prefill queued here then, its own included (`math.inf` for a view
    # that hears the first token: pending until then)
    unprefilled: dict[int, tuple[float, float]] = field(default_factory=dict)
    sent_new: float = 0.0  # new prefill tokens of the requests this view has in flight here, as estimated when sent
    # each answer streaming from here: its latest gaps, and `awaited` at its first token
    answering: list[tuple[Sequence[float], float]] = field(default_factory=list)
    awaiting: int = 0  # requests this view sent here that have not shown their first token
    awaited_s: float = 0.0  # seconds in which at least one of them was waiting (a running clock)
    awaited_at: float | None = None

    def shared(self, now: float, max_age: float) -> bool:
        """It is serving more than one request: this view has others in flight there, or its
        fresh report says so (other isolates' requests)."""
        reading = self.fresh(now, max_age)
        return self.in_flight > 1 or (reading is not None and reading.ok and reading.queue > 1)

    def awaited(self, now: float) -> float:
        """The running clock of the seconds in which a request this view sent here was waiting
        for its first token (queued, or its prompt being prefilled): what it reads at two moments
        is how long an answer streaming between them had a neighbour that could stall it."""
        if self.awaiting > 0 and self.awaited_at is not None:
            self.awaited_s += max(0.0, now - self.awaited_at)
        self.awaited_at = now
        return self.awaited_s

    def wait_begins(self, now: float) -> None:
        self.awaited(now)
        self.awaiting += 1

    def wait_ends(self, now: float) -> None:
        self.awaited(now)
        self.awaiting = max(0, self.awaiting - 1)

    def live_itl(self, shared: bool, now: float) -> float | None:
        """The time between tokens its streaming answers show now, the slowest of them (each
        measured as `time_between_tokens`, over its last `LIVE_GAPS` gaps, when it has at least
        `MIN_LIVE_GAPS`, its stalls held against the time a neighbour waited since its first
        token): a replica slowed down shows it at its next tokens, long before an answer of it
        ends and is averaged into `itl_s`."""
        clock = self.awaited(now)
        measured = [time_between_tokens(gaps, shared, clock - since) for gaps, since in self.answering if len(gaps) >= MIN_LIVE_GAPS]
        known = [m for m in measured if m is not None]
        return max(known) if known else None

    def decode_s(self, shared: bool, now: float) -> float | None:
        """Its time between tokens as a decision reads it: the smoothed past, or what its streaming
        answers show now when that is slower (quick to see a slowdown, slow to forget one, as a
        peak-EWMA balancer reads latency)."""
        live = self.live_itl(shared, now)
        if live is None or self.itl_s is None:
            return self.itl_s if live is None else live
        return max(self.itl_s, live)

    def decode_age(self, now: float) -> float:
        """Seconds `decode_s` has gone unchecked: since the replica went idle here (the answer that
        measured it last ended then or before), counted `slow_streak` times slower. Nothing while this
        view has requests in flight there (their answers will measure it, and streaming they
        already do; a slow replica's queue waiting for them is no reason to think it faster). A
        replica whose answers kept showing it slow is forgotten more slowly each time, as an
        outlier detector ejects a host that fails again for longer (Envoy: its base ejection time
        x the times it was ejected): the fade exists so that one slow answer does not shut a
        replica out for good, and a replica still slow when offered a request again was not that
        case (a replica paused three quarters of the time, on the real fleet, drew a cold prompt
        every ten seconds or so and made each wait four times as long). A clock gone back gives a
        negative age, which the scheduler reads as fresh. (Never measured, its age does not
        matter: it counts as the pool's median.)"""
        if self.in_flight > 0 or self.idle_at is None:
            return 0.0
        return (now - self.idle_at) / max(1, self.slow_streak)

    def holds(self, blocks: tuple[int, ...], now: float, prefill_s: float | None = None) -> int:
        """How many of `blocks` (chained: each covers all before it) it holds, from the longest:
        those it was sent, up to the first that is not prefilled there yet at `now`
        (`unprefilled`: until its first token; for a view that does not hear it, until the prefill
        queued when it was sent could be done at `prefill_s` seconds a token, or, unmeasured,
        until the request ends)."""
        low, high = 0, len(blocks)
        while low < high:  # chained hashes: holding block i means having served blocks 0..i
            mid = (low + high + 1) // 2
            if blocks[mid - 1] in self.held:
                low = mid
            else:
                high = mid - 1
        if self.unprefilled:
            return next((i for i in range(low) if self._pending(blocks[i], now, prefill_s)), low)
        return low

    def _pending(self, block: int, now: float, prefill_s: float | None) -> bool:
        sent = self.unprefilled.get(block)
        if sent is None:
            return False
        at, tokens = sent
        return math.isinf(tokens) or prefill_s is None or now < at + tokens * prefill_s

    def depth(self, block: int) -> int:
        """How many held blocks were remembered after `block` (its stack distance: in a cache
        that lets go of the least recently used first, the bound it has outlived)."""
        for depth, held in enumerate(reversed(self.held)):
            if held == block:
                return depth
        return len(self.held)

    def expect(self, ask: Ask, continued: bool, now: float, prefill_s: float | None = None) -> Expected:
        held = self.holds(ask.blocks, now, prefill_s)
        new = max(0.0, ask.new_prefill(held))
        if not held:
            return Expected(ask.blocks, continued=continued, new_tokens=new)
        last = ask.blocks[held - 1]
        return Expected(ask.blocks, held, self.depth(last), ask.prompt_tokens - new, last in self.serving, continued, new)

    def remember(self, blocks: tuple[int, ...]) -> None:
        for block in blocks:
            self.held[block] = None
            self.held.move_to_end(block)
        self._trim()

    def _trim(self) -> None:
        while len(self.held) > self.held_bound:
            self.held.popitem(last=False)

    def learn(self, expected: Expected, cached_tokens: int) -> None:
        """Hold what the replica said it reused against what was expected of it. Less than half:
        it had let the prompt go, so it keeps fewer blocks than were remembered after it (the
        bound comes down to that depth). At least two blocks more than expected: it keeps blocks
        already forgotten here, so the bound grows."""
        if expected.held and cached_tokens < MISSED * expected.cached_tokens:
            if not expected.concurrent:
                self.held_bound = max(MIN_HELD_BLOCKS, min(self.held_bound, expected.depth))
                self._trim()
        elif cached_tokens >= expected.cached_tokens + 2 * BLOCK_TOKENS and not expected.continued:
            self.held_bound = min(HELD_BLOCKS, math.ceil(self.held_bound * GROWTH))

    def served(self, expected: Expected, prefilled: bool = False) -> None:
        """A request sent with `expected` ended: its blocks are no longer in flight here, nor its
        work (its prefill already came off at its first token when `prefilled`)."""
        if not prefilled:
            self.sent_new = max(0.0, self.sent_new - expected.new_tokens)
        self.prefilled(expected)
        self.serving.subtract(expected.blocks)
        for block in expected.blocks:
            if self.serving.get(block, 0) <= 0:
                self.serving.pop(block, None)

    def prefilled(self, expected: Expected) -> None:
        """The blocks a request brought are computed there now (its first token came, or it ended),
        whichever request brought them first."""
        for block in expected.blocks:
            self.unprefilled.pop(block, None)

    def fresh(self, now: float, max_age: float) -> Reading | None:
        return self.reading if self.reading is not None and now - self.reading.at <= max_age else None


@dataclass
class PoolView:
    """One pool as one place sees it. `turn` drives round-robin; `sessions` maps a session to
    the replica it last went to (bounded, oldest forgotten first)."""

    config: PoolConfig
    breaker: BreakerConfig = field(default_factory=BreakerConfig)
    replicas: dict[str, ReplicaState] = field(default_factory=dict)
    sessions: OrderedDict[str, str] = field(default_factory=OrderedDict)
    turn: int = 0
    probing: set[str] = field(default_factory=set)  # replicas a probe is out for (one at a time each)
    # the pool's Durable Object, as this isolate has seen it answer (routing.router): missing its
    # deadline three times in ten seconds keeps it out of the request path for ten
    router_breaker: CircuitBreaker = field(default_factory=lambda: CircuitBreaker(BreakerConfig(3, 10.0, 10.0)))
    # whether this view hears each answer's first token (`prefilled`): an isolate's, which follows
    # the stream, does, and takes a prompt it sent as held from then; the pool's object, told only
    # when a request ends, does not, and takes it as held from when it was sent
    first_tokens: bool = True

    def __post_init__(self) -> None:
        for name in self.config.replicas:
            self.replicas.setdefault(name, ReplicaState(name, CircuitBreaker(self.breaker)))

    def views(self, blocks: tuple[int, ...], now: float) -> list[ReplicaView]:
        max_age = self.config.probe_age_ms / 1000
        pool_prefill_s = self.pool_prefill_s()
        out = []
        for r in self.replicas.values():
            reading = r.fresh(now, max_age)
            queue = float(r.in_flight)
            if reading is not None and reading.ok:
                queue = max(queue, reading.queue)
            admitted = r.breaker.state == "closed" or (r.breaker.state == "open" and now - (r.breaker.opened_at or now) >= r.breaker.config.cooldown_s) \
                or (r.breaker.state == "half_open" and not r.breaker.probing)
            # a bad report stands until a good one replaces it (the replica is re-probed when it is
            # older than the age bound); a good one's figures count only while fresh
            sane = r.reading is None or r.reading.ok
            out.append(ReplicaView(r.name, queue, r.holds(blocks, now, r.prefill_s or pool_prefill_s), r.prefill_s, r.answer_s, r.decode_s(r.shared(now, max_age), now), r.mean_new,
                                   healthy=admitted and sane, down=not admitted, sent_queue=float(r.in_flight), sent_new=r.sent_new,
                                   decode_age=r.decode_age(now)))
        return out

    def choose(self, ask: Ask, now: float) -> list[Pick]:
        """The replicas in the order to try them for `ask` (empty: every replica is down)."""
        if ask.session and ask.session in self.sessions:
            ask = replace(ask, session_replica=self.sessions[ask.session])
        picks = schedule(ask, self.views(ask.blocks, now), self.config.load_bound, self.config.policy, self.turn)
        self.turn += 1
        return picks

    def dispatched(self, name: str, ask: Ask, reason: str, now: float) -> Expected:
        """The request went to `name` at `now`: it is in flight there, waiting for its first
        token, and there its prompt will be cached. What this view expected the replica to reuse
        is returned, for `finished` to check."""
        replica = self.replicas[name]
        replica.in_flight += 1
        replica.wait_begins(now)
        replica.sent += 1
        replica.prefix_hits += reason == "prefix"
        expected = replica.expect(ask, bool(ask.session) and self.sessions.get(ask.session or "") == name, now, replica.prefill_s or self.pool_prefill_s())
        # its new blocks are not there for another request until prefilled: until its first token,
        # or (for a view that does not hear it) until the prefill queued there could be done
        queued = math.inf if self.first_tokens else replica.sent_new + expected.new_tokens
        for block in ask.blocks[expected.held:]:
            replica.unprefilled.setdefault(block, (now, queued))  # the first to bring it computes it
        replica.remember(ask.blocks)
        replica.serving.update(ask.blocks)
        replica.sent_new += expected.new_tokens
        if ask.session:
            self.sessions[ask.session] = name
            self.sessions.move_to_end(ask.session)
            while len(self.sessions) > SESSIONS:
                self.sessions.popitem(last=False)
        return expected

    def prefilled(self, name: str, expected: Expected, now: float) -> None:
        """The request sent with `expected` has its first token at `now`: its prompt is
        prefilled, so its new tokens are no longer work queued ahead of the next request there
        (its answer is), and it no longer waits."""
        replica = self.replicas[name]
        replica.sent_new = max(0.0, replica.sent_new - expected.new_tokens)
        replica.prefilled(expected)
        replica.wait_ends(now)

    def pool_prefill_s(self) -> float | None:
        """Seconds a new prompt token takes, the median of the replicas' measurements: what a
        replica not measured yet is taken to take (None before any: a guess would say a prompt
        is there before it is)."""
        return median([r.prefill_s for r in self.replicas.values()])

    def finished(self, name: str, now: float, ok: bool | None, ttft_s: float | None = None, itl_s: float | None = None,
                 cached_tokens: int | None = None, prompt_tokens: int | None = None, total_s: float | None = None,
                 expected: Expected | None = None, prefilled: bool = False) -> None:
        """A request sent to `name` ended: `ok` True (answered), False (failed: the breaker hears
        it), None (the client left: no verdict). An answer's timings feed the replica's measured
        rates: time between tokens (its speed, whatever was cached), first to last token (`total_s`
        is dispatch to last; only with a time between tokens: a one-token answer has no answer
        time), the new tokens it prefilled (the prompt less what it said it
        reused), and time to first token over those when they were at least a block (a nearly
        cached prompt's first token times mostly overhead). With what `dispatched` `expected`,
        the replica's own count of reused tokens teaches the view how much it keeps. `prefilled`:
        its new tokens already came off the queued work, and it stopped waiting, at its first
        token (`PoolView.prefilled`)."""
        replica = self.replicas[name]
        replica.in_flight = max(0, replica.in_flight - 1)
        if not prefilled:
            replica.wait_ends(now)
        if expected is not None:
            replica.served(expected, prefilled)
        if replica.in_flight == 0:
            replica.idle_at = now
            replica.serving.clear()  # whatever a report without its expectation left behind
            replica.unprefilled.clear()
            replica.sent_new = 0.0
            replica.awaited(now)
            replica.awaiting = 0
            replica.answering.clear()  # a stream never closed must not stand for the replica's speed
        if ok is True:
            replica.breaker.success(now)
        elif ok is False:
            replica.errors += 1
            replica.breaker.failure(now)
        else:
            replica.breaker.abandon()
        if _seconds(ttft_s):
            replica.ttft_s = _smooth(replica.ttft_s, ttft_s)
        if _seconds(itl_s) and itl_s:
            # against the rest of the pool as measured so far: slow beyond the noise, or not
            pool_itl = median([r.itl_s for r in self.replicas.values() if r is not replica])
            if pool_itl is not None:
                slow = itl_s > TOLERANCE * pool_itl
                replica.slow_streak = min(MAX_SLOW_STREAK, replica.slow_streak + 1) if slow else 0
            # the past weighs less the older it is: after a quiet spell the new answer says most
            age = 0.0 if replica.itl_at is None else now - replica.itl_at
            replica.itl_s = _smooth(replica.itl_s, itl_s, age)
            replica.itl_at = now
        if _count(prompt_tokens):
            cached = cached_tokens if _count(cached_tokens) else 0
            replica.cached_tokens += cached
            replica.prompt_tokens += prompt_tokens
            new = prompt_tokens - min(cached, prompt_tokens)
            if ok is True:
                if expected is not None and _count(cached_tokens):
                    replica.learn(expected, cached)
                replica.mean_new = _smooth(replica.mean_new, new)
                if _seconds(ttft_s) and new >= MIN_PREFILL_SAMPLE:
                    replica.prefill_s = _smooth(replica.prefill_s, ttft_s / (new + 1))
        if ok is True and _seconds(total_s) and _seconds(ttft_s) and total_s >= ttft_s and _seconds(itl_s):
            # an answer of one token (no time between tokens) has no answer time to measure
            replica.answer_s = _smooth(replica.answer_s, total_s - ttft_s)

    def watch(self, name: str, gaps: Sequence[float], now: float) -> None:
        """An answer from `name` had its first token at `now`: `gaps` (kept up to date by
        whoever reads the stream) show how fast the replica is now, until `unwatch`."""
        replica = self.replicas[name]
        replica.answering.append((gaps, replica.awaited(now)))

    def unwatch(self, name: str, gaps: Sequence[float]) -> None:
        answering = self.replicas[name].answering
        for i, (watched, _) in enumerate(answering):
            if watched is gaps:
                del answering[i]
                return

    def admit(self, name: str, now: float) -> bool:
        """The replica's breaker lets this request through (a half-open one, once)."""
        return self.replicas[name].breaker.admit(now) != "skip"

    def to_json(self, now: float) -> dict[str, Any]:
        max_age = self.config.probe_age_ms / 1000
        out = []
        for r in self.replicas.values():
            reading = r.fresh(now, max_age)
            out.append({
                "name": r.name, "in_flight": r.in_flight, "sent": r.sent, "errors": r.errors,
                "estimated_prefix_hits": r.prefix_hits, "prefix_blocks_held": len(r.held),
                "prefix_blocks_bound": r.held_bound,
                "reported": None if r.reading is None else {
                    "ok": r.reading.ok, "age_s": round(now - r.reading.at, 3), "fresh": reading is not None,
                    "running": r.reading.running, "waiting": r.reading.waiting, "kv_usage": r.reading.kv_usage,
                    **({"why": r.reading.why} if r.reading.why else {})},
                "ttft_s": r.ttft_s, "itl_s": r.itl_s, "live_itl_s": r.live_itl(r.shared(now, max_age), now),
                "itl_age_s": None if r.itl_at is None else round(max(0.0, now - r.itl_at), 3), "slow_streak": r.slow_streak, "prefill_s": r.prefill_s, "answer_s": r.answer_s, "mean_new_tokens": r.mean_new,
                "replica_cached_tokens": r.cached_tokens, "replica_prompt_tokens": r.prompt_tokens,
                "breaker": r.breaker.to_json(now),
            })
        return {"pool": self.config.name, "policy": self.config.policy, "load_bound": self.config.load_bound, "replicas": out}


def _seconds(value: Any) -> bool:
    """A duration a report may carry: a finite number, not negative (a report is data, not trusted)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _smooth(old: float | None, sample: float, age: float = 0.0) -> float:
    """`EWMA` of the newest sample; the past, `age` seconds old, kept at e^(-age / `FORGET_S`)
    of its weight (a time-weighted moving average, as a peak-EWMA balancer's)."""
    if old is None:
        return sample
    keep = (1 - EWMA) * math.exp(-age / FORGET_S) if age > 0 else 1 - EWMA
    return keep * old + (1 - keep) * sample
