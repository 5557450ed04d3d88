"""A circuit breaker around the edge, kept per isolate as plain data.

Closed: every request tries the edge; `failures` edge failures within `window_s` open it.
Open: requests skip the edge (straight to an origin, `reason=breaker`) for `cooldown_s`.
Half-open: after the cool-down exactly one request probes the edge; its success closes the
breaker, its failure opens it for another cool-down. It holds no I/O and no tasks, only
numbers and timestamps, so sharing it between the requests of an isolate is safe.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .config import BreakerConfig

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass
class CircuitBreaker:
    config: BreakerConfig = field(default_factory=BreakerConfig)
    state: str = CLOSED
    failures: list[float] = field(default_factory=list)  # times of recent failures (closed state)
    opened_at: float | None = None
    probing: bool = False
    opened_count: int = 0

    def admit(self, now: float) -> str:
        """'edge' (try it), 'probe' (try it: this request decides) or 'skip' (breaker open)."""
        if self.state == OPEN and self.opened_at is not None and now - self.opened_at >= self.config.cooldown_s:
            self.state, self.probing = HALF_OPEN, False
        if self.state == CLOSED:
            return "edge"
        if self.state == HALF_OPEN and not self.probing:
            self.probing = True
            return "probe"
        return "skip"

    def success(self, now: float) -> None:
        if self.state == HALF_OPEN:
            self.state, self.probing, self.opened_at = CLOSED, False, None
        self.failures.clear()

    def failure(self, now: float) -> None:
        if self.state == HALF_OPEN:
            self._open(now)
            return
        self.failures = [t for t in self.failures if now - t < self.config.window_s]
        self.failures.append(now)
        if len(self.failures) >= self.config.failures:
            self._open(now)

    def abandon(self) -> None:
        """A probe that ended without a verdict (client left) frees the probe slot."""
        if self.state == HALF_OPEN:
            self.probing = False

    def _open(self, now: float) -> None:
        self.state, self.opened_at, self.probing = OPEN, now, False
        self.failures.clear()
        self.opened_count += 1

    def to_json(self, now: float) -> dict[str, Any]:
        remaining = None
        if self.state == OPEN and self.opened_at is not None:
            remaining = max(0.0, self.config.cooldown_s - (now - self.opened_at))
        return {"state": self.state, "recent_failures": len(self.failures), "opened": self.opened_count,
                "cooldown_remaining_s": remaining, "probing": self.probing, **self.config.__dict__}
