"""A cached answer: everything needed to replay it as JSON or as a token-by-token stream."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import AsyncIterator

from ..generation import Event, Finish, Token, Usage

ENTRY_VERSION = 1
CACHEABLE_FINISH = ("stop", "length")


class CorruptEntry(ValueError):
    """An entry that cannot be read is a miss (and is overwritten by the next answer)."""


@dataclass(frozen=True)
class CachedAnswer:
    model: str
    tokens: tuple[str, ...]
    finish_reason: str
    usage: Usage
    created: float

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def encode(self) -> bytes:
        return json.dumps({
            "v": ENTRY_VERSION, "model": self.model, "tokens": list(self.tokens),
            "finish_reason": self.finish_reason, "usage": self.usage.to_json(), "created": self.created,
        }, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "CachedAnswer":
        try:
            obj = json.loads(data)
            if obj.get("v") != ENTRY_VERSION or obj["finish_reason"] not in CACHEABLE_FINISH:
                raise CorruptEntry("unknown entry version or finish reason")
            tokens = obj["tokens"]
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) or not isinstance(obj["model"], str):
                raise CorruptEntry("malformed tokens or model")
            return cls(obj["model"], tuple(tokens), obj["finish_reason"], Usage.from_json(obj["usage"]), float(obj["created"]))
        except CorruptEntry:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptEntry(str(exc)) from exc

    async def replay(self) -> AsyncIterator[Event]:
        for token in self.tokens:
            yield Token(token)
        yield Finish(self.finish_reason, self.usage)


def record(model: str, events: list[Event], created: float) -> CachedAnswer | None:
    """The answer a finished generation produced, or None if it must not be cached
    (no Finish: aborted or failed; or a finish reason that is not a complete answer)."""
    if not events or not isinstance(events[-1], Finish) or events[-1].finish_reason not in CACHEABLE_FINISH:
        return None
    if not events[-1].cacheable:  # stitched from two routes (failover mid-stream): never cached
        return None
    finish = events[-1]
    tokens = tuple(e.text for e in events if isinstance(e, Token))
    return CachedAnswer(model, tokens, finish.finish_reason, finish.usage, created)
