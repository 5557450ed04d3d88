"""Which replica of a pool takes a request: one cost per replica, a load bound, a session's pin.

Pure functions over values, shared by the Worker (each isolate's own view), the pool's Durable
Object (the pool's whole view) and the fleet simulator (`bench/sim_fleet.py`), so the three run
the same decisions.

    cost(replica) = (expected new prefill tokens + 1) x (its queue + 1) x its slowness

- *new prefill tokens*: the prompt's tokens minus those the replica probably holds: the prompt's
  leading blocks are hashed as a chain (block i's hash covers blocks 0..i), and a replica that
  recently served a prompt holds its blocks; the longest run of leading blocks it holds is its
  hit (llm-d's approximate prefix scorer does this over the same kind of chained block hashes).
- *queue*: what is running or waiting there: the larger of what this gateway has in flight there
  and what the replica itself last reported (llama.cpp: requests processing + deferred; vLLM:
  running + waiting), when that report is fresh and sane.
- *slowness*: the replica's recent time between tokens over the pool's fastest, at least 1: a
  replica that slows down loses its share before any breaker opens.

One knob, `load_bound` (e): a replica whose queue is at or above (1 + e) x the pool's mean queue
(counting this request) takes nothing until the others catch up, so one hot prefix cannot pile
onto one replica (consistent hashing with bounded loads, Mirrokni et al. 2018). Ties, and
replicas nobody has a view of, are broken by rendezvous hashing on the prompt's first block, so
isolates that share nothing still send the same new prefix to the same replica.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Sequence

BLOCK_CHARS = 256  # characters of rendered prompt per block (about 64 tokens)
CHARS_PER_TOKEN = 4.0  # the estimate when the prompt was not counted
MAX_BLOCKS = 256  # a prompt's first 64 Ki characters are hashed; the rest counts as uncached
MAX_SLOWNESS = 16.0


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


def cost(new_prefill_tokens: float, queue: float, slowness: float = 1.0) -> float:
    """The one cost: the prefill this replica would do for the request, times how many requests
    it serves at once (the request's own included), times how slow it is running."""
    return (max(0.0, new_prefill_tokens) + 1.0) * (max(0.0, queue) + 1.0) * max(1.0, slowness)


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
    last report sane; `down`: its breaker is open (never chosen)."""

    name: str
    queue: float = 0.0
    held: int = 0
    slowness: float = 1.0
    healthy: bool = True
    down: bool = False


@dataclass(frozen=True)
class Ask:
    """The request as the scheduler sees it: its prompt's blocks, its counted (or estimated)
    prompt tokens and characters, its session and the replica the session last used."""

    blocks: tuple[int, ...]
    prompt_tokens: float
    prompt_chars: int
    session: str | None = None
    session_replica: str | None = None

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
    cost: float


def schedule(ask: Ask, replicas: Sequence[ReplicaView], load_bound: float, policy: str = "scheduler", turn: int = 0) -> list[Pick]:
    """Every replica not down, best first (`policy`: the scheduler's cost, or a baseline:
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
    scored = sorted(up, key=lambda r: (r.name in bounded, cost(ask.new_prefill(r.held), r.queue, r.slowness),
                                       -rendezvous(ask.key, r.name)))
    best_held = max((r.held for r in up), default=0)
    picks = []
    for r in scored:
        reason = "prefix" if r.held and r.held == best_held else "load"
        picks.append(Pick(r.name, reason, cost(ask.new_prefill(r.held), r.queue, r.slowness)))
    pinned = next((r for r in up if r.name == ask.session_replica), None)
    if pinned is not None and pinned.healthy and pinned.name not in bounded:
        # a conversation keeps to its replica (its KV cache is there) unless it is down or overloaded
        picks = [Pick(pinned.name, "session", cost(ask.new_prefill(pinned.held), pinned.queue, pinned.slowness))] + \
            [p for p in picks if p.name != pinned.name]
    return picks
