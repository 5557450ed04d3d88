"""Which replica of a pool takes a request: a predicted time to first token per replica and the
delay its work adds for the requests behind it, a load bound, a session's pin.

Pure functions over values, shared by the Worker (each isolate's own view), the pool's Durable
Object (the pool's whole view) and the fleet simulator (`bench/sim_fleet.py`), so the three run
the same decisions.

    cost(replica) = predicted TTFT + the delay its work there adds for the requests behind it
    predicted TTFT = its slowdown x (prefill ahead of the request and its own + answers ahead)
                   = slowdown x ((new prefill tokens + 1 + new tokens queued ahead) x P + queue x A)
    added delay    = the pool's mean queue x slowdown x (new prefill tokens x P + A)

in seconds, from what the replicas were measured doing (llm-d's predicted-latency scorer ranks
replicas on the same kind of prediction; the "prefill x batch" view: what a request waits for is
the prefill work queued ahead of it, not the number of requests):

- *new prefill tokens*: the prompt's tokens minus those the replica probably holds: the prompt's
  leading blocks are hashed as a chain (block i's hash covers blocks 0..i), and a replica that
  recently served a prompt holds its blocks; the longest run of leading blocks it holds is its
  hit (llm-d's approximate prefix scorer does this over the same kind of chained block hashes).
- *queue*: what is running or waiting there: the larger of what this gateway has in flight there
  and what the replica itself last reported (llama.cpp: requests processing + deferred; vLLM:
  running + waiting), when that report is fresh and sane. Each costs its new prefill tokens and
  an answer: for the requests this gateway sent there and has in flight, the new tokens it
  estimated for each when it sent it, until that request's first token (a replica just sent
  three cold prompts has their prefill ahead, though its past requests were cheap); for the
  rest of the queue (other isolates' requests, seen in the replica's report), the replica's
  recent mean (what it prefilled of their prompts, as it reported). A replica serving prompts it holds has cheap requests queued; one
  prefilling cold prompts has dear ones.
- *the added delay*: a prompt prefilled again where it is not held is work that every request
  queued behind it there waits for; about as many will queue there as wait on a replica of the
  pool now. In an idle pool it is nothing and the first token alone decides; as queues build,
  it weighs the whole prefill a move costs the fleet against a slightly shorter queue. (On the
  real fleet with one replica slowed it kept 74% of prompt tokens cached against 54%, and cut
  p99 by 40%; with every replica well it made no measurable difference; simulated at twice the
  fleet's capacity it kept 86% against 69% and cut p99 by two thirds, and it cost 4% at p99 with
  many partial views: docs/edge-and-origin.md.)
- *P* and *A*: the pool's prefill time a token and answer time (first to last token), the
  medians of its replicas' smoothed measurements (`fleet.PoolView.finished`); *slowdown*: the
  replica's time between tokens against the pool's median, measured on every answer whatever
  was cached, so a replica slowed down costs more for the prompts it holds too, and loses them
  once its queue builds. The gaps in which a replica stopped an answer to prefill another
  request's prompt are left out (`fleet.time_between_tokens`: a neighbour's cold prompt is not
  this replica's slowness), and the answers streaming from it count as soon as they show it
  slower than its past (`fleet.ReplicaState.decode_s`), so a replica slowed mid-run costs more
  at its next tokens, not when its answers end.

Measured rates are noisy (a shared machine's replicas wander), so a slowdown within `TOLERANCE`
(1.5x either way) of the median counts as none, and beyond it only the excess counts; a replica
not measured yet counts as the median (neither favoured nor shunned), and its queued requests
as this request would be there. Before anything is measured a prompt token counts
`PRIOR_PREFILL_S` and an answer `PRIOR_ANSWER_TOKENS` tokens' time.

One knob, `load_bound` (e): a replica whose queue is at or above (1 + e) x the pool's mean queue
(counting this request) takes nothing until the others catch up, so one hot prefix cannot pile
onto one replica (consistent hashing with bounded loads, Mirrokni et al. 2018). A session keeps
to the replica it last used (its history is cached there) unless that one is down, unhealthy or
over the bound, or no longer holds the conversation as far as this view can tell (none of the
prompt, or less of it than another replica: a replica with two slots and one prompt in its RAM
cache lets a conversation go as others come, and a turn sent back there waits behind whatever
runs there only to prefill its history again). A session's first turn is costed as though it and
everything queued ahead of it were cold, so the queues and the replicas' speeds place it and
conversations spread over the pool rather than gather on the replica holding their shared system
prompt (their later turns, most of their work, follow them). A later turn of a session this view
has not seen (isolates share nothing) goes to the replica with the fewest queued, as the
replicas report it, among those within the bound and not measurably slow: every view computes
that alike from the same reports, where costs read through each view's own partial record would
scatter the conversation's turns, and their history, over the pool. Ties, here and everywhere,
are broken by rendezvous hashing on the prompt's first block (its application's system prompt),
so isolates that share nothing still send the same new prefix to the same replica, and an
application's conversations, first turns and later, gather on the first few replicas of its
ranking that have room: the replicas that keep their history. (Simulated with 64 isolates,
rendezvous on the session instead kept 62% of prompt tokens cached against least in flight's
77%, at 1.4-1.8x its p99: docs/benchmarks.md.) A prompt this view knows no replica to hold is
placed the same way, as every view would place it, and not by a cost read through this view's
own record: with 64 isolates each seeding a new prefix where its own record made it cheapest,
the pool paid twice least in flight's cold prefills.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

BLOCK_CHARS = 256  # characters of rendered prompt per block (about 64 tokens)
CHARS_PER_TOKEN = 4.0  # the estimate when the prompt was not counted
MAX_BLOCKS = 256  # a prompt's first 64 Ki characters are hashed; the rest counts as uncached
MAX_RATIO = 16.0  # a replica measured more than this far from the pool's median counts as this far
TOLERANCE = 1.5  # a speed within this factor of the pool's median counts as the median
PRIOR_PREFILL_S = 0.001  # seconds a new prompt token, before anything was measured
PRIOR_ANSWER_TOKENS = 256.0  # an answer in prompt tokens' time, before anything was measured
FORGET_S = 10.0  # a replica's measured speed counts for e^-1 of itself after this long idle and unchecked (Finagle's peak EWMA decay time)


def prefix_blocks(text: str, block_chars: int = BLOCK_CHARS) -> tuple[int, ...]:
    """Chained hashes of `text`'s whole leading blocks: equal hashes at position i mean equal
    text up to the end of block i. Only whole blocks: a partial last block would never match."""
    hashes: list[int] = []
    running = hashlib.blake2b(digest_size=8)
    for start in range(0, min(len(text), block_chars * MAX_BLOCKS) - block_chars + 1, block_chars):
        running.update(text[start:start + block_chars].encode("utf-8", "surrogatepass"))
        hashes.append(int.from_bytes(running.copy().digest(), "big"))
    return tuple(hashes)


def rendezvous(key: str | int, name: str) -> int:
    """Highest-random-weight score of `name` for `key`: every isolate ranks replicas alike."""
    return int.from_bytes(hashlib.blake2b(f"{key}\0{name}".encode(), digest_size=8).digest(), "big")


def predicted_ttft(new_prefill_tokens: float, queue: float, ahead: float, prefill_s: float, answer_s: float,
                   slowdown: float = 1.0) -> float:
    """Seconds until this replica's first token for the request: the prefill queued there
    (`ahead` new tokens, `queued_ahead`) and this request's new tokens (and the one always
    recomputed), and the `queue` answers ahead, all at the replica's speed."""
    return max(0.0, slowdown) * ((max(0.0, new_prefill_tokens) + 1.0 + max(0.0, ahead)) * max(0.0, prefill_s)
                                 + max(0.0, queue) * max(0.0, answer_s))


def imposed(behind: float, new_prefill_tokens: float, prefill_s: float, answer_s: float, slowdown: float) -> float:
    """Seconds this request's own work on a replica (its new prefill and its answer, at the
    replica's speed) adds to the waits of the requests that will queue behind it there: about as
    many as wait on a replica of the pool now (`behind`, the pool's mean queue). Nothing in an idle
    pool, where the predicted first token alone decides; in a loaded one, a prompt prefilled again
    elsewhere is work every later request waits for, which the request's own first token does not
    count."""
    return max(0.0, behind) * max(0.0, slowdown) * (max(0.0, new_prefill_tokens) * max(0.0, prefill_s) + max(0.0, answer_s))


def median(values: Sequence[float | None]) -> float | None:
    """The median of the measured values (a positive finite number each), None when there are none."""
    known = sorted(v for v in values if v is not None and v > 0 and math.isfinite(v))
    if not known:
        return None
    middle = len(known) // 2
    return known[middle] if len(known) % 2 else (known[middle - 1] + known[middle]) / 2


def slowdowns(measured: Sequence[float | None], ages: Sequence[float] | None = None) -> list[float]:
    """Each replica's time between tokens as a factor of the pool's median, as the decision reads
    it: within `TOLERANCE` of the median, 1 (noise does not move a request); beyond, only the
    excess (1.5x counts as 1, 3x as 2, capped at `MAX_RATIO`); unmeasured (or nonsense), 1.

    A measurement fades with its age (`ages`, seconds it has gone unchecked while the replica
    was idle, counted slower for a replica whose answers kept showing it slow:
    `fleet.ReplicaState.decode_age`): the factor counts as
    factor ** e^(-age / `FORGET_S`). A replica measured slow gets no requests, so nothing
    would ever measure it again: one answer stalled by a passing fault (or a starved core) would
    shut it out for good. Faded, it is offered a request again within seconds, and that answer
    (and its streaming gaps) says whether it still is slow, as a peak-EWMA balancer lets an idle
    endpoint's latency decay (Finagle, tower)."""
    middle = median(measured)
    out = []
    for i, value in enumerate(measured):
        if middle is None or value is None or not value > 0 or not math.isfinite(value):
            out.append(1.0)
            continue
        ratio = min(MAX_RATIO, max(1 / MAX_RATIO, value / middle))
        age = ages[i] if ages is not None and i < len(ages) else 0.0
        if age > 0:  # (NaN is not)
            ratio **= math.exp(-age / FORGET_S)
        out.append(ratio / TOLERANCE if ratio > TOLERANCE else ratio * TOLERANCE if ratio < 1 / TOLERANCE else 1.0)
    return out


@dataclass(frozen=True)
class Rates:
    """What the pool's measurements say, as `predicted_ttft` takes them: the pool's prefill time
    a token and answer time, and each replica's slowdown."""

    prefill_s: float
    answer_s: float
    slowdown: dict[str, float]


def rates(replicas: Sequence["ReplicaView"]) -> Rates:
    """The pool's rates: medians of the replicas' measurements; a figure measured nowhere yet comes
    from the other through the prior's ratio (`PRIOR_ANSWER_TOKENS`), or from the prior alone."""
    prefill, answer = median([r.prefill_s for r in replicas]), median([r.answer_s for r in replicas])
    if prefill is None:
        prefill = answer / PRIOR_ANSWER_TOKENS if answer is not None else PRIOR_PREFILL_S
    if answer is None:
        answer = prefill * PRIOR_ANSWER_TOKENS
    return Rates(prefill, answer, dict(zip((r.name for r in replicas),
                                           slowdowns([r.decode_s for r in replicas], [r.decode_age for r in replicas]))))


def queued_ahead(replica: "ReplicaView", new_here: float) -> float:
    """New prefill tokens queued on `replica` ahead of a request: what this view sent there and
    knows (each request's own estimate when it was sent: a replica just sent three cold prompts
    has their prefill ahead, whatever its past requests cost), and for the rest of its queue
    (what other views sent, as its report shows) its measured mean a request."""
    known = min(max(0.0, replica.sent_queue), max(0.0, replica.queue))
    sent_new = replica.sent_new if replica.sent_new > 0 and math.isfinite(replica.sent_new) else 0.0
    return (sent_new if known else 0.0) + (max(0.0, replica.queue) - known) * queued_size(replica, new_here)


def queued_size(replica: "ReplicaView", new_here: float) -> float:
    """New prefill tokens a request queued on `replica` is taken to have: its measured mean, else
    what this request would have there (before anything is known, what is queued on a replica
    holding this prompt is taken to share it, and elsewhere to be as cold as this one)."""
    mean = replica.mean_new
    return mean if mean is not None and mean >= 0 and math.isfinite(mean) else new_here


def over_bound(queue: float, queues: Sequence[float], load_bound: float) -> bool:
    """Whether a replica at `queue` may take no more: at or above (1 + e) x the pool's mean queue
    once this request is counted (so an idle pool never refuses, and e = 0 is strict balance)."""
    return bool(queues) and max(0.0, queue) + 1.0 > load_cap(queues, load_bound)


def load_cap(queues: Sequence[float], load_bound: float) -> float:
    """The most a replica may hold with this request: ceil((1 + e) x the mean queue counting it)."""
    mean = (sum(max(0.0, q) for q in queues) + 1.0) / len(queues)
    return math.ceil((1.0 + load_bound) * mean - 1e-9)


@dataclass(frozen=True)
class ReplicaView:
    """What a decision knows of one replica at one moment. `held`: how many of the request's
    leading blocks it holds; `healthy`: breaker closed (or a half-open probe allowed) and its
    last report sane; `down`: its breaker is open (never chosen). Its measurements, None before
    any: `prefill_s` seconds a new prompt token, `answer_s` seconds from first to last token,
    `decode_s` seconds between tokens, `mean_new` new prefill tokens a request (what it reported
    it did not take from its cache), `decode_age` seconds `decode_s` has gone unchecked while the
    replica was idle here (0 while requests are in flight there). Of its queue, `sent_queue`
    requests are ones this view sent and has in flight there, with `sent_new` new prefill tokens
    between them, as estimated when each was sent."""

    name: str
    queue: float = 0.0
    held: int = 0
    prefill_s: float | None = None
    answer_s: float | None = None
    decode_s: float | None = None
    mean_new: float | None = None
    healthy: bool = True
    down: bool = False
    sent_queue: float = 0.0
    sent_new: float = 0.0
    decode_age: float = 0.0


@dataclass(frozen=True)
class Ask:
    """The request as the scheduler sees it: its prompt's blocks, its counted (or estimated)
    prompt tokens and characters, its session and the replica the session last used, and whether
    it continues a conversation (its prompt carries an earlier answer)."""

    blocks: tuple[int, ...]
    prompt_tokens: float
    prompt_chars: int
    session: str | None = None
    session_replica: str | None = None
    continues: bool = False

    def new_prefill(self, held: int, block_chars: int = BLOCK_CHARS) -> float:
        if self.prompt_chars <= 0:
            return self.prompt_tokens
        cached = min(self.prompt_chars, held * block_chars) / self.prompt_chars
        return self.prompt_tokens * (1.0 - cached)

    @property
    def key(self) -> str | int:
        """What rendezvous ranks on: the prompt's first block, else the session, else nothing shared."""
        return self.blocks[0] if self.blocks else (self.session or "")


@dataclass(frozen=True)
class Pick:
    name: str
    reason: str  # "prefix", "session" or "load"
    cost: float  # the scheduler's cost in seconds (predicted TTFT and the delay added behind); a baseline's: the queue


def schedule(ask: Ask, replicas: Sequence[ReplicaView], load_bound: float, policy: str = "scheduler", turn: int = 0) -> list[Pick]:
    """Every replica not down, best first (`policy`: the scheduler's predicted TTFT, or a baseline:
    round-robin, least in flight, session affinity with round-robin for requests without one). The first is where the request goes; the rest are its
    failover order. Unhealthy replicas come last (tried only when every healthy one failed)."""
    up = [r for r in replicas if not r.down]
    if not up:
        return []
    queues = [r.queue for r in up]
    if policy == "round-robin":
        order = up[turn % len(up):] + up[:turn % len(up)]
        picks = [Pick(r.name, "load", r.queue) for r in order]
    elif policy == "least-in-flight":
        picks = [Pick(r.name, "load", r.queue) for r in sorted(up, key=lambda r: (r.queue, -rendezvous(ask.key, r.name)))]
    elif policy == "session" and ask.session:  # the single origins' rule: rendezvous on the session id
        picks = [Pick(r.name, "session", r.queue) for r in sorted(up, key=lambda r: rendezvous(ask.session, r.name), reverse=True)]
    elif policy == "session":  # no session: nothing to keep, round-robin
        order = up[turn % len(up):] + up[:turn % len(up)]
        picks = [Pick(r.name, "load", r.queue) for r in order]
    else:
        picks = _by_cost(ask, up, queues, load_bound)
    healthy = {r.name for r in up if r.healthy}
    return [p for p in picks if p.name in healthy] + [p for p in picks if p.name not in healthy]


def _by_cost(ask: Ask, up: Sequence[ReplicaView], queues: Sequence[float], load_bound: float) -> list[Pick]:
    cap = load_cap(queues, load_bound)
    bounded = {r.name for r in up if max(0.0, r.queue) + 1.0 > cap}
    pool = rates(up)
    behind = sum(max(0.0, q) for q in queues) / len(queues)

    def cost_of(r: ReplicaView, new_here: float, ahead: float) -> float:
        return (predicted_ttft(new_here, r.queue, ahead, pool.prefill_s, pool.answer_s, pool.slowdown[r.name])
                + imposed(behind, new_here, pool.prefill_s, pool.answer_s, pool.slowdown[r.name]))

    unseen = ask.session if ask.session_replica is None else None  # a session this view has not placed
    if unseen and not ask.continues:
        # a conversation's first turn, costed as though it and all queued ahead of it were cold:
        # its later turns (most of its work) follow it, so a prompt held or a queue of cheap
        # requests now must not gather conversations; the queues and the replicas' speeds decide
        cold = {r.name: cost_of(r, ask.prompt_tokens, r.queue * ask.prompt_tokens) for r in up}
        spread = sorted(up, key=lambda r: (r.name in bounded, cold[r.name], -rendezvous(ask.key, r.name)))
        return [Pick(r.name, "session", cold[r.name]) for r in spread]
    new = {r.name: ask.new_prefill(r.held) for r in up}
    cost = {r.name: cost_of(r, new[r.name], queued_ahead(r, new[r.name])) for r in up}
    if unseen:
        # a later turn this view has not seen: where every view would send it from what the
        # replicas report (the fewest queued, ties by the prompt's first block), which is where
        # its application's conversations gather and their history is cached
        return [Pick(r.name, "session", cost[r.name]) for r in as_every_view_would(ask, up, bounded, pool)]
    best_held = max((r.held for r in up), default=0)
    if best_held == 0:
        # a prompt this view knows no replica to hold: placed as every view would place it, from
        # what the replicas report, so views that share nothing agree and the prefix gathers
        # where its next requests will find it (a cost read through this view's own record
        # would send it wherever that record happens to make cheapest, a new cold copy each time)
        scored = as_every_view_would(ask, up, bounded, pool)
    else:
        scored = sorted(up, key=lambda r: (r.name in bounded, cost[r.name], -rendezvous(ask.key, r.name)))
    picks = [Pick(r.name, "prefix" if r.held and r.held == best_held else "load", cost[r.name]) for r in scored]
    pinned = next((r for r in up if r.name == ask.session_replica), None)
    if (pinned is not None and pinned.healthy and pinned.name not in bounded
            and (not ask.blocks or 0 < pinned.held >= best_held)):
        # a conversation keeps to its replica (its KV cache is there) unless it is down or
        # overloaded, or has let the conversation go (it holds none of the prompt's blocks, or
        # fewer than another replica): then nothing is kept by going back. A prompt shorter
        # than a block says nothing either way, and keeps.
        return [Pick(pinned.name, "session", cost[pinned.name])] + [p for p in picks if p.name != pinned.name]
    return picks


def as_every_view_would(ask: Ask, up: Sequence[ReplicaView], bounded: set[str], pool: Rates) -> list[ReplicaView]:
    """The replicas in the order any view computes alike from what they report: within the bound
    first, then not measurably slow, then the fewest queued, ties by rendezvous on the prompt's
    first block. For what this view has no record of, where views that share nothing must agree."""
    return sorted(up, key=lambda r: (r.name in bounded, pool.slowdown[r.name] > 1.0, max(0.0, r.queue),
                                     -rendezvous(ask.key, r.name)))
