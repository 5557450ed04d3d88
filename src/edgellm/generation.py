"""What every route turns into and renders from: a generation as a stream of events.

Non-streamed and streamed requests share this one model, so the OpenAI and Workers AI
renderers (and later the cache, which records and replays these events) never care which
binding call produced them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator


@dataclass(frozen=True)
class Usage:
    """Token counts. `cached_tokens` is how many prompt tokens the model reused from its KV
    cache (a warm session); None when the binding does not say, and then it is not reported."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }
        if self.cached_tokens is not None:
            data["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return data

    @classmethod
    def from_json(cls, data: Any) -> "Usage":
        if not isinstance(data, dict):
            return cls()
        details = data.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(int(data.get("prompt_tokens") or 0), int(data.get("completion_tokens") or 0),
                   None if cached is None else int(cached))


@dataclass(frozen=True)
class Token:
    text: str


@dataclass(frozen=True)
class Finish:
    finish_reason: str  # "stop" | "length"
    usage: Usage


Event = Token | Finish


@dataclass(frozen=True)
class GenerationRequest:
    """A validated request in Workers AI terms.

    `inputs` is the Workers AI input with defaults applied and without `stream`; `stop` is
    applied by the gateway because the Workers AI schema has no stop sequences.
    """

    model: str
    inputs: dict[str, Any]
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    headers: dict[str, str] = field(default_factory=dict)
    session: str | None = None  # keeps the model's KV cache warm across turns (x-session-affinity); never part of the cache key

    @property
    def max_tokens(self) -> int:
        return int(self.inputs.get("max_tokens", 256))


@dataclass
class Generation:
    """A started generation: the model that accepted it, and its events (Token..., Finish)."""

    model: str
    events: AsyncIterator[Event]
    cache_status: str | None = None
    age: int | None = None
    cache_key: str | None = None

    async def collect(self) -> tuple[str, Finish]:
        parts: list[str] = []
        finish = Finish("stop", Usage())
        async for event in self.events:
            if isinstance(event, Token):
                parts.append(event.text)
            else:
                finish = event
        return "".join(parts), finish
