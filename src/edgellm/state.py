"""Per-isolate state: what one Worker isolate (or one local edge process) shares between the
requests it serves. It is created by the runtime adapter and passed in through `Deps.state`,
never kept at module level in the core."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .routing.state import RoutingState


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    bypasses: int = 0
    bytes_served: int = 0
    coalesced: int = 0
    write_errors: int = 0
    read_errors: int = 0

    def to_json(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class IsolateState:
    config: Any = None  # the Worker's parsed Config, set on the isolate's first request
    inflight: dict[str, Any] = field(default_factory=dict)  # cache key -> cache.flight.Flight
    generations: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)  # namespace purge generations
    cache: CacheCounters = field(default_factory=CacheCounters)
    routing: RoutingState = field(default_factory=RoutingState)  # the edge's breaker, routing counters, tokenizers
