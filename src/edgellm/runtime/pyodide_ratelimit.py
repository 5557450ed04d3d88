"""The Workers Rate Limiting binding (`env.RATE_LIMITER`) as the core's `RateLimiter`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .pyodide_toolbox import js_options


@dataclass
class WorkersRateLimit:
    """The Rate Limiting binding (`[[ratelimits]]`): `limit({key})` -> `{success}`. `period_s` is
    its window (`simple.period`, 10 or 60), which the binding does not expose: the
    RATE_LIMIT_PERIOD var says it, and a refusal's Retry-After is that window."""

    binding: Any
    period_s: int = 60

    async def limit(self, key: str) -> bool:
        outcome = await self.binding.limit(js_options({"key": key}))
        return bool(outcome.success)
