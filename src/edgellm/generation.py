"""What every route turns into and renders from: a generation as a stream of events.

Non-streamed and streamed requests share this one model, so the OpenAI and Workers AI
renderers (and later the cache, which records and replays these events) never care which
binding call produced them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from .stream import close_source


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
    # OpenAI `logprobs.content[]` entries ({token, logprob, bytes, top_logprobs}) for this text,
    # when the request asked for them and the backend gave them.
    logprobs: tuple[dict[str, Any], ...] | None = None


@dataclass(frozen=True)
class ToolCallDelta:
    """A tool call, or a fragment of one, as OpenAI streams them: the first fragment of call
    `index` carries its `id` and `name`, later ones append to its `arguments` (a JSON string)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Finish:
    finish_reason: str  # "stop" | "length" | "tool_calls"
    usage: Usage
    route: str | None = None  # where it ran, when routing says so ("edge", "origin", "edge,origin")
    cacheable: bool = True  # False for an answer stitched from two routes (a mid-stream failover)
    guardrails: str | None = None  # what the guardrails did (`x-edgellm-guardrails`'s value), for a stream's final chunk


Event = Token | ToolCallDelta | Finish


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def merge_tool_calls(deltas: list[ToolCallDelta]) -> tuple[ToolCall, ...]:
    """Fragments -> whole calls, in index order."""
    calls: dict[int, dict[str, str]] = {}
    for delta in deltas:
        call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
        call["id"] = delta.id or call["id"]
        call["name"] = delta.name or call["name"]
        call["arguments"] += delta.arguments
    return tuple(ToolCall(c["id"], c["name"], c["arguments"]) for _, c in sorted(calls.items()))


@dataclass(frozen=True)
class Answer:
    """A whole generation: what the JSON renderers need."""

    text: str
    finish: Finish
    tool_calls: tuple[ToolCall, ...] = ()
    logprobs: tuple[dict[str, Any], ...] | None = None


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
    session: str | None = None  # keeps the model's KV cache warm across turns (x-session-affinity); never part of the cache key
    # Without a session: whose earlier prompts the model may reuse the prefix of (the caller's
    # tenant: reuse is timing-visible, so never across tenants); never part of the cache key
    prefix_scope: str | None = None
    # Values other modules compute from this request (its cache key's digest per scope), kept
    # with it: the request is immutable, so they never go stale, and `replace` starts a new one
    # empty. A request the parse memo shares (`state.ParsedBodies`) computes them once.
    derived: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def max_tokens(self) -> int:
        return int(self.inputs.get("max_tokens", 256))


@dataclass
class PromptSeen:
    """The prompt tokens a binding stream has reported so far: a stream closed before its final
    usage event (cut by a stop sequence, or left by its client) must still say what its prompt
    cost. The local binding reports it with the first token; when nothing said it, the
    estimate of `access.reservation` stands in."""

    prompt_tokens: int = 0


@dataclass
class Generation:
    """A started generation: the model that accepted it, and its events (Token..., Finish)."""

    model: str
    events: AsyncIterator[Event]
    cache_status: str | None = None
    age: int | None = None
    cache_key: str | None = None
    system_fingerprint: str | None = None
    route: str | None = None  # the `x-edgellm-route` value: "edge|origin|edge,origin; reason=..."
    cache_match: str | None = None  # a semantic HIT's `x-edgellm-cache-match` ("semantic; score=0.97")
    # A HIT: the stored entry's memo, where the JSON answer rendered from it is kept for the
    # entry's next HITs (`kept_json`); shared by the tenant's HITs of that entry, so only what
    # is a pure function of the entry goes in.
    rendered: dict[Any, Any] | None = None
    prompt_seen: PromptSeen | None = None  # what the binding has said of the prompt so far (a live edge stream)

    async def aclose(self) -> None:
        """Close its events (read or not): what stops the generation behind them. So a
        generation is a source a renderer's `Stream` owns (`stream.owns`)."""
        await close_source(self.events)

    async def collect(self) -> tuple[str, Finish]:
        answer = await self.collect_answer()
        return answer.text, answer.finish

    async def collect_answer(self) -> Answer:
        """Read the whole answer; the events are closed whatever happens (a client that left
        cancels this, and closing is what stops the generation)."""
        parts: list[str] = []
        deltas: list[ToolCallDelta] = []
        logprobs: list[dict[str, Any]] | None = None
        finish = Finish("stop", Usage())
        try:
            async for event in self.events:
                if isinstance(event, Token):
                    parts.append(event.text)
                    if event.logprobs is not None:
                        logprobs = (logprobs or []) + list(event.logprobs)
                elif isinstance(event, ToolCallDelta):
                    deltas.append(event)
                else:
                    finish = event
        finally:
            await close_source(self.events)
        if finish.route and "," in finish.route:  # a failover after the start: the answer used both routes
            self.route = finish.route
        return Answer("".join(parts), finish, merge_tool_calls(deltas), tuple(logprobs) if logprobs is not None else None)
