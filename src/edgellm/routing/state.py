"""Routing's share of the per-isolate state: the edge's breaker, counters, the tokenizer.

Plain data only (numbers, a parsed vocabulary): nothing here is I/O a request started, so the
requests of an isolate may all read and update it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .breaker import CircuitBreaker


@dataclass
class RoutingCounters:
    edge: int = 0
    origin: int = 0
    failovers_before_first_token: int = 0
    failovers_mid_stream: int = 0
    breaker_skips: int = 0
    too_long_for_edge: int = 0
    context_length_exceeded: int = 0
    residency_refusals: int = 0
    origin_errors: int = 0
    router_answers: int = 0  # a pool's Durable Object said where a request goes
    router_fallbacks: int = 0  # it did not answer in time (or failed): the isolate's own view decided
    router_skips: int = 0  # it was not asked (it had been missing its deadline): the isolate's own view decided

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class RoutingState:
    breaker: CircuitBreaker | None = None  # created with the isolate's config on first use
    counters: RoutingCounters = field(default_factory=RoutingCounters)
    tokenizers: dict[str, Any] = field(default_factory=dict)  # published name -> tokenizer.Tokenizer | None
    last_stall_to_origin_ms: float | None = None
    pools: dict[str, Any] = field(default_factory=dict)  # pool name -> fleet.PoolView (this isolate's view of it)
