"""`ScriptedAI`: the one configurable double of the AI binding port, shipped as library code.

As httpx ships `MockTransport(handler)`, tests inject this through `Deps` and monkeypatch
nothing. It answers from a script (`tokens`, `usage`, `response`) or, given `inner`, passes every
call through to a real binding (llama.cpp on the local edge); either way it can refuse models
(`unknown`, `retired`), fail at the call (`fail`) or mid-stream (`fail_after`), hold calls at a
gate the test opens (`hold_calls`, `hold_runs`, `stall_after`, `hold_after_first`: synchronise on
events, never sleeps) and counts what reached it (`calls`, `models`, `sessions`, `closed`, ...).

`FaultyAI` (doubles/faults.py) is the other double: random faults at a rate, for demos and
benchmarks; this one is deterministic, for tests.

It never claims `scoped_prefix_reuse`: the core then sends it no `prefix_scope`, as it sent the
wrappers this replaces.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping

from edgellm.ports import AIBinding, BindingError, ModelNotFound

DEFAULT_TOKENS = ("Hello", ",", " wor", "ld", "!")
DEFAULT_USAGE = {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
SCRIPTED = {"backend": "scripted"}


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
class ScriptedAI:
    """The AI binding seam, scripted or wrapping `inner`.

    Answers (without `inner`): every model answers `tokens` (a stream ends with a usage event
    unless `usage` is None); `events` replaces that stream with these events verbatim (tool-call
    fragments, logprobs; with `inner` too, which then only describes the models), and `then` says
    how it ends: "end", "stall" (until closed) or "fail" (`mid_stream`); `response` overrides
    `run`'s value, and `streams_only` makes `run` an error (a route that must stream); `open_streams` makes streams
    `OpenStream`s kept in `streams` (to see a stream closed before its first read).
    Refusals: `unknown` models raise ModelNotFound ("No such model"), `retired` ones ModelNotFound
    ("deprecated"), `fail` is raised at every call; `fail_after` makes a stream raise
    `mid_stream` instead of its event of that index (0-based).
    Gates (`gate`, opened by the test): `hold_calls` holds every call before it starts
    (`waiting` counts the held); `hold_runs` holds a whole answer (`run`) after it arrived,
    `hold_streams` a stream before it opens;
    `stall_after` holds a stream after that many text events (`stalled`, `stalls`);
    `hold_after_first` holds a stream after its first event until it is closed; `hold_before` holds
    an `events` stream before its event of that index until the gate opens; `delay_first` holds an
    opened `events` stream before its first event until it is closed (an edge that never starts).
    Pace: `pace` spaces out the events of `inner`'s streams (seconds before each), the rate a real
    model's tokens arrive at, for pages that must show an answer growing (a rate, not a gate).
    Counters: `relayed` (events of `inner` passed on), `cut_short` (set when such a stream is
    closed before its end: the consumer let go), `calls` (model, inputs), `models`, `sessions`, `called`, `sent` (scripted tokens
    sent), `closed` (streams ended or closed); `arrived` is notified on every call and stall;
    `cancelled` is set when a held call or stream is cancelled.
    """

    inner: AIBinding | None = None
    tokens: tuple[str, ...] = DEFAULT_TOKENS
    usage: dict[str, int] | None = field(default_factory=lambda: dict(DEFAULT_USAGE))
    response: Any = None
    events: tuple[dict[str, Any], ...] | None = None
    then: str = "end"  # how an `events` stream ends: "end", "stall" or "fail"
    streams_only: bool = False
    description: dict[str, Any] | None = field(default_factory=lambda: dict(SCRIPTED))  # describe() without inner
    unknown: frozenset[str] = frozenset()
    retired: frozenset[str] = frozenset()
    fail: BaseException | None = None
    fail_after: int | None = None
    mid_stream: BaseException = field(default_factory=lambda: BindingError("connection reset"))
    open_streams: bool = False
    gate: threading.Event = field(default_factory=threading.Event)
    hold_calls: bool = False
    hold_runs: bool = False
    hold_streams: bool = False
    stall_after: int | None = None
    hold_after_first: bool = False
    hold_before: int | None = None
    pace: float = 0.0
    delay_first: bool = False
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    sessions: list[str | None] = field(default_factory=list)
    streams: list[OpenStream] = field(default_factory=list)
    closed: int = 0
    sent: int = 0
    waiting: int = 0
    stalls: int = 0
    relayed: int = 0
    cut_short: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Condition = field(default_factory=threading.Condition)
    stalled: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)

    @property
    def called(self) -> int:
        """Calls that reached the binding."""
        return len(self.calls)

    def describe(self, model: str, *, live: bool = True) -> Mapping[str, Any] | None:
        return self.inner.describe(model, live=live) if self.inner is not None else self.description

    def _arrive(self, model: str, inputs: Mapping[str, Any], session: str | None) -> None:
        with self.arrived:
            self.calls.append((model, dict(inputs)))
            self.models.append(model)
            self.sessions.append(session)
            self.arrived.notify_all()
        if model in self.retired:
            raise ModelNotFound(f"5007: model {model} has been deprecated")
        if model in self.unknown:
            raise ModelNotFound(f"5007: No such model {model} or task")
        if self.fail is not None:
            raise self.fail

    async def _held_call(self) -> None:
        if self.hold_calls:
            self.waiting += 1
            await asyncio.to_thread(self.gate.wait)
            self.waiting -= 1

    async def _hold(self) -> None:
        """Until the test opens the gate; cancellable (a consumer that closes the stream ends it,
        a gateway that gives up on the call cancels it: `cancelled` says so)."""
        try:
            while not self.gate.is_set():
                await asyncio.to_thread(self.gate.wait, 0.05)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def run(self, model: str, inputs: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        if self.streams_only:
            raise AssertionError("this route streams: a whole-answer call was not expected")
        self._arrive(model, inputs, options.get("session"))
        await self._held_call()
        if self.hold_runs:
            await self._hold()
        if self.inner is not None:
            return await self.inner.run(model, inputs, **options)
        result: dict[str, Any] = {"response": "".join(self.tokens) if self.response is None else self.response}
        if self.usage is not None:
            result["usage"] = dict(self.usage)
        return result

    async def stream(self, model: str, inputs: Mapping[str, Any], **options: Any) -> AsyncIterator[dict[str, Any]]:
        self._arrive(model, inputs, options.get("session"))
        await self._held_call()
        if self.hold_streams:
            await self._hold()
        if self.events is not None:
            return self._replayed()
        if self.inner is None:
            if self.open_streams:
                self.streams.append(OpenStream(self._script()))
                return self.streams[-1]
            return self._scripted()
        upstream = await self.inner.stream(model, inputs, **options)
        if self.hold_calls or self.hold_after_first or self.stall_after is not None or self.fail_after is not None or self.pace:
            return self._watched(upstream)
        return upstream

    def _script(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = [{"response": token} for token in self.tokens]
        if self.usage is not None:
            events.append({"response": "", "usage": dict(self.usage)})
        return events

    async def _scripted(self) -> AsyncIterator[dict[str, Any]]:
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

    async def _replayed(self) -> AsyncIterator[dict[str, Any]]:
        """`events` verbatim, held, stalled or failed as configured."""
        try:
            if self.delay_first:
                await asyncio.Event().wait()  # ends only when the consumer closes the stream
            for i, event in enumerate(self.events or ()):
                if i == self.hold_before:
                    await self._hold()
                self.sent += 1
                yield event
            if self.then == "stall":
                await asyncio.Event().wait()
            if self.then == "fail":
                raise self.mid_stream
        finally:
            self.closed += 1

    async def _watched(self, upstream: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """`inner`'s events, failed, held or stalled as configured; `upstream` closed at the end."""
        index = texts = 0
        ended = False
        try:
            async for event in upstream:
                if self.fail_after is not None and index == self.fail_after:
                    raise self.mid_stream
                index += 1
                if self.pace:
                    await asyncio.sleep(self.pace)  # the model's rate, not a synchronisation
                self.relayed += 1
                yield event
                if self.hold_after_first:
                    await asyncio.Event().wait()  # ends only when the consumer closes the stream
                if self.stall_after is not None and event.get("response"):
                    texts += 1
                    if texts == self.stall_after:
                        self.stalled.set()
                        with self.arrived:
                            self.stalls += 1
                            self.arrived.notify_all()
                        await self._hold()  # until the test opens the gate, or the consumer closes this stream
            ended = True
        finally:
            if not ended:
                self.cut_short.set()
            await upstream.aclose()  # type: ignore[attr-defined]
            self.closed += 1
