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
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_json(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }

    @classmethod
    def from_json(cls, data: Any) -> "Usage":
        if not isinstance(data, dict):
            return cls()
        return cls(int(data.get("prompt_tokens") or 0), int(data.get("completion_tokens") or 0))


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
        """Read the whole answer; the events are closed whatever happens (a client that left
        cancels this, and closing is what stops the generation)."""
        parts: list[str] = []
        finish = Finish("stop", Usage())
        try:
            async for event in self.events:
                if isinstance(event, Token):
                    parts.append(event.text)
                else:
                    finish = event
        finally:
            close = getattr(self.events, "aclose", None)
            if close is not None:
                await close()
        return "".join(parts), finish
