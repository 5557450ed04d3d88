"""Per-key rate limits: requests and tokens per fixed window, on the isolate's own data.

Fixed windows (as the Workers Rate Limiting binding counts) keyed by `<key id>/<what>`: plain
per-isolate data, so no request ever awaits I/O another request started. On Cloudflare the
binding (`Deps.rate_limiter`) is asked too, for the cross-isolate request limit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ErrorKind, GatewayError
from ..state import AccessState

WINDOW_SECONDS = 60.0


@dataclass(frozen=True)
class Window:
    state: AccessState
    name: str
    limit: int
    period: float = WINDOW_SECONDS

    def _current(self, now: float) -> tuple[float, int]:
        start, used = self.state.windows.get(self.name, (now, 0))
        if now - start >= self.period:
            start, used = now - (now - start) % self.period, 0
        return start, used

    def retry_after(self, now: float) -> int:
        start, _ = self._current(now)
        return max(1, math.ceil(start + self.period - now))

    def remaining(self, now: float) -> int:
        return self.limit - self._current(now)[1]

    def spend(self, now: float, amount: int) -> None:
        start, used = self._current(now)
        if len(self.state.windows) > 50_000:  # bounded memory whatever the key count
            self.state.windows.clear()
        self.state.windows[self.name] = (start, used + amount)


def rate_limited(what: str, retry_after: int) -> GatewayError:
    return GatewayError(ErrorKind.RATE_LIMITED, f"Rate limit reached for {what}; retry in {retry_after} s.",
                        code="rate_limit_exceeded", retry_after=retry_after)


def take_request(state: AccessState, key_id: str, per_minute: int, now: float) -> None:
    """Count one request (HITs included) or raise 429 with Retry-After."""
    if per_minute <= 0:
        return
    window = Window(state, f"{key_id}/requests", per_minute)
    if window.remaining(now) <= 0:
        raise rate_limited("requests per minute", window.retry_after(now))
    window.spend(now, 1)


def check_tokens(state: AccessState, key_id: str, per_minute: int, now: float) -> None:
    """Before generating: refuse while the window's tokens are spent (charged after the answer)."""
    if per_minute <= 0:
        return
    window = Window(state, f"{key_id}/tokens", per_minute)
    if window.remaining(now) <= 0:
        raise rate_limited("tokens per minute", window.retry_after(now))


def charge_tokens(state: AccessState, key_id: str, per_minute: int, tokens: int, now: float) -> None:
    if per_minute > 0 and tokens > 0:
        Window(state, f"{key_id}/tokens", per_minute).spend(now, tokens)


def _duration(seconds: int) -> str:
    """OpenAI's reset format: `45s`, `1m0s`."""
    minutes, rest = divmod(max(0, seconds), 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def ratelimit_headers(state: AccessState, key_id: str, requests_per_minute: int, tokens_per_minute: int, now: float) -> dict[str, str]:
    """The `x-ratelimit-*` headers OpenAI clients read, for a key's own windows (a limit of 0,
    unlimited, sends none of its three). Tokens remaining count what requests in progress reserved."""
    headers: dict[str, str] = {}
    for what, limit in (("requests", requests_per_minute), ("tokens", tokens_per_minute)):
        if limit <= 0:
            continue
        window = Window(state, f"{key_id}/{what}", limit)
        headers[f"x-ratelimit-limit-{what}"] = str(limit)
        headers[f"x-ratelimit-remaining-{what}"] = str(max(0, window.remaining(now)))
        headers[f"x-ratelimit-reset-{what}"] = _duration(window.retry_after(now) if window.remaining(now) < limit else 0)
    return headers
