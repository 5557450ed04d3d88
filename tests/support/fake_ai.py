"""Workers AI binding doubles that inject faults at the binding seam (the only place fakes go).

`ScriptedAI` answers from a script and fails on demand, so the core's fallback, stop sequences,
finish reasons and error translation can be tested without a model. `RetiringAI` and `FailingAI`
wrap a real binding (llama.cpp on the local edge) to retire models or break calls through HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping

from edgellm.ports import AIBinding, BindingError, ModelNotFound

DEFAULT_TOKENS = ("Hello", ",", " wor", "ld", "!")


@dataclass
class ScriptedAI:
    """Answers every model with `tokens`; `unknown` models raise ModelNotFound at the call.

    `fail` is raised by `run`/`stream` at the call; `fail_after` makes a stream raise
    `mid_stream` after that many tokens. `usage=None` sends a stream without a usage event.
    `calls` records (model, inputs); `closed` counts streams closed by the consumer.
    """

    tokens: tuple[str, ...] = DEFAULT_TOKENS
    usage: dict[str, int] | None = field(default_factory=lambda: {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12})
    unknown: frozenset[str] = frozenset()
    fail: BaseException | None = None
    fail_after: int | None = None
    mid_stream: BaseException = field(default_factory=lambda: BindingError("connection reset"))
    response: Any = None  # overrides the `response` value of `run` (e.g. a non-string)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    sessions: list[str | None] = field(default_factory=list)
    closed: int = 0
    sent: int = 0

    def describe(self, model: str) -> dict[str, Any] | None:
        return {"backend": "scripted"}

    def _call(self, model: str, inputs: Mapping[str, Any], session: str | None = None) -> None:
        self.calls.append((model, dict(inputs)))
        self.sessions.append(session)
        if model in self.unknown:
            raise ModelNotFound(f"5007: No such model {model} or task")
        if self.fail is not None:
            raise self.fail

    async def run(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> dict[str, Any]:
        self._call(model, inputs, session)
        result: dict[str, Any] = {"response": "".join(self.tokens) if self.response is None else self.response}
        if self.usage is not None:
            result["usage"] = dict(self.usage)
        return result

    async def stream(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> AsyncIterator[dict[str, Any]]:
        self._call(model, inputs, session)
        return self._events()

    async def _events(self) -> AsyncIterator[dict[str, Any]]:
        try:
            for i, token in enumerate(self.tokens):
                if self.fail_after is not None and i == self.fail_after:
                    raise self.mid_stream
                self.sent += 1
                yield {"response": token}
            if self.usage is not None:
                yield {"response": "", "usage": dict(self.usage)}
        finally:
            self.closed += 1


@dataclass
class RetiringAI:
    """A real binding where some model ids have been retired (the deprecation scenario)."""

    inner: AIBinding
    retired: frozenset[str]
    calls: list[str] = field(default_factory=list)

    def describe(self, model: str) -> dict[str, Any] | None:
        return self.inner.describe(model)

    def _check(self, model: str) -> None:
        self.calls.append(model)
        if model in self.retired:
            raise ModelNotFound(f"5007: model {model} has been deprecated")

    async def run(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        self._check(model)
        return await self.inner.run(model, inputs, **options)

    async def stream(self, model: str, inputs: Mapping[str, Any], **options: Any) -> AsyncIterator[dict[str, Any]]:
        self._check(model)
        return await self.inner.stream(model, inputs, **options)


@dataclass
class FailingAI:
    """Every call fails with `error` (a capacity error, a dropped connection, ...)."""

    error: BaseException

    def describe(self, model: str) -> dict[str, Any] | None:
        return None

    async def run(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        raise self.error

    async def stream(self, model: str, inputs: Mapping[str, Any], **options: Any) -> AsyncIterator[dict[str, Any]]:
        raise self.error


@dataclass
class OpenStream:
    """A binding stream opened at the call, as a Workers AI ReadableStream (or a llama.cpp slot)
    is: it holds its resource until it ends or is closed, read or not. `closed` says it was."""

    events: list[dict[str, Any]]
    closed: bool = False

    def __aiter__(self) -> "OpenStream":
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self.closed or not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    async def aclose(self) -> None:
        self.closed = True


@dataclass
class OpenStreamAI(ScriptedAI):
    """`ScriptedAI` whose streams are `OpenStream`s (kept in `streams`), so a test sees whether
    closing a generation, even before its first read, closed the binding's stream behind it."""

    streams: list[OpenStream] = field(default_factory=list)

    async def stream(self, model: str, inputs: Mapping[str, Any], *, session: str | None = None) -> AsyncIterator[dict[str, Any]]:
        self._call(model, inputs, session)
        events = [{"response": token} for token in self.tokens]
        if self.usage is not None:
            events.append({"response": "", "usage": dict(self.usage)})
        self.streams.append(OpenStream(events))
        return self.streams[-1]
