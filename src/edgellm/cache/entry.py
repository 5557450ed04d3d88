"""A cached answer: everything needed to replay it as JSON or as a token-by-token stream."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from ..generation import Event, Finish, Token, ToolCall, ToolCallDelta, Usage, merge_tool_calls

ENTRY_VERSION = 1
CACHEABLE_FINISH = ("stop", "length", "tool_calls")


class CorruptEntry(ValueError):
    """An entry that cannot be read is a miss (and is overwritten by the next answer)."""


@dataclass(frozen=True)
class CachedAnswer:
    model: str
    tokens: tuple[str, ...]
    finish_reason: str
    usage: Usage
    created: float
    # A tool-call answer replays its calls (whole, one fragment each); a logprobs answer its
    # logprobs, one tuple per token. Both are absent from plain entries, which read as before.
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[tuple[dict[str, Any], ...] | None, ...] | None = None
    # The guardrails policy (its answer and DLP parts, GUARDRAILS' JSON text) the answer was
    # checked under before it was stored; "" when none applied. A HIT for a caller whose policy
    # is stricter than this one is checked again before it is replayed.
    guardrails: str = ""
    # What is made from this entry and kept with it while the isolate keeps the entry decoded
    # (`cache.service.decoded`): the JSON answers rendered from it (`Generation.rendered`).
    derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    def encode(self) -> bytes:
        data: dict[str, Any] = {
            "v": ENTRY_VERSION, "model": self.model, "tokens": list(self.tokens),
            "finish_reason": self.finish_reason, "usage": self.usage.to_json(), "created": self.created,
        }
        if self.tool_calls:
            data["tool_calls"] = [call.to_json() for call in self.tool_calls]
        if self.logprobs is not None:
            data["logprobs"] = [list(lp) if lp is not None else None for lp in self.logprobs]
        if self.guardrails:
            data["guardrails"] = self.guardrails
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> "CachedAnswer":
        try:
            obj = json.loads(data)
            if obj.get("v") != ENTRY_VERSION or obj["finish_reason"] not in CACHEABLE_FINISH:
                raise CorruptEntry("unknown entry version or finish reason")
            tokens = obj["tokens"]
            if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens) or not isinstance(obj["model"], str):
                raise CorruptEntry("malformed tokens or model")
            calls = tuple(ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in obj.get("tool_calls") or ())
            if not all(isinstance(v, str) for c in calls for v in (c.id, c.name, c.arguments)):
                raise CorruptEntry("malformed tool calls")
            logprobs = obj.get("logprobs")
            if logprobs is not None:
                if not isinstance(logprobs, list) or len(logprobs) != len(tokens):
                    raise CorruptEntry("malformed logprobs")
                logprobs = tuple(tuple(lp) if isinstance(lp, list) else None for lp in logprobs)
            guardrails = obj.get("guardrails") or ""
            if not isinstance(guardrails, str):
                raise CorruptEntry("malformed guardrails")
            return cls(obj["model"], tuple(tokens), obj["finish_reason"], Usage.from_json(obj["usage"]), float(obj["created"]),
                       calls, logprobs, guardrails)
        except CorruptEntry:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptEntry(str(exc)) from exc

    async def replay(self) -> AsyncIterator[Event]:
        for i, token in enumerate(self.tokens):
            yield Token(token, self.logprobs[i] if self.logprobs is not None else None)
        for index, call in enumerate(self.tool_calls):
            yield ToolCallDelta(index, call.id, call.name, call.arguments)
        yield Finish(self.finish_reason, self.usage)


def record(model: str, events: list[Event], created: float) -> CachedAnswer | None:
    """The answer a finished generation produced, or None if it must not be cached
    (no Finish: aborted or failed; or a finish reason that is not a complete answer)."""
    if not events or not isinstance(events[-1], Finish) or events[-1].finish_reason not in CACHEABLE_FINISH:
        return None
    if not events[-1].cacheable:  # stitched from two routes (failover mid-stream): never cached
        return None
    finish = events[-1]
    texts = [e for e in events if isinstance(e, Token)]
    calls = merge_tool_calls([e for e in events if isinstance(e, ToolCallDelta)])
    logprobs = tuple(e.logprobs for e in texts) if any(e.logprobs is not None for e in texts) else None
    return CachedAnswer(model, tuple(e.text for e in texts), finish.finish_reason, finish.usage, created, calls, logprobs)
