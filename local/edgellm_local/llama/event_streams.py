"""Wrappers around a generation's event stream: structured outputs and logprobs in OpenAI's
streamed shape, the first event read ahead, and the slot released when the stream ends."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, AsyncIterator

from edgellm_local.llama import grammar as structured
from edgellm_local.llama.grammar import ToolPlan


async def structured_events(events: AsyncIterator[dict[str, Any]], plan: ToolPlan | None, top: int | None) -> AsyncIterator[dict[str, Any]]:
    """Logprobs in OpenAI's shape per token; with tools, the constrained answer's tool calls as
    OpenAI streams them (first fragment: id and name; then argument fragments as generated),
    or, when the model answered instead (`{"response": ...}`), that text once it is complete.
    After tool results (`plan.free_answer`) a reply that does not open with `{` is plain text
    and streams token by token. The envelope itself is never passed on, even when cut."""
    parts: list[str] = []
    calls = structured.ToolCallStream()
    plain = False  # a free answer seen to be plain text: its tokens pass through
    try:
        async for event in events:
            if "logprobs" in event and top is not None:
                event = {**event, "logprobs": structured.logprobs_of(event, top) or []}
            if plan is not None and event.get("response") and not plain:
                parts.append(event["response"])
                if plan.free_answer:
                    head = "".join(parts)
                    if not head.strip():
                        continue
                    if plan.response_schema is not None or not head.lstrip().startswith("{"):
                        plain = True
                        yield {**event, "response": head}
                        continue
                fragments = calls.feed("".join(parts)[len(calls.text):])  # what the scanner has not read yet
                if fragments:
                    yield {"response": "", "tool_calls": fragments}
                continue
            yield event
        if plan is not None and not plain and not calls.started:
            text, whole = plan.parse("".join(parts))
            if whole:
                yield {"response": "", "tool_calls": [{"index": i, **call} for i, call in enumerate(whole)]}
            elif text:
                yield {"response": text}
    finally:
        await events.aclose()  # type: ignore[attr-defined]


class Prepended:
    """The first event, read ahead, then the rest. A class, not a generator: closed before its
    first read, it still closes the rest (a generator never started skips its `finally`, and
    the slot would stay held until the garbage collector ran)."""

    def __init__(self, first: dict[str, Any] | None, rest: AsyncIterator[dict[str, Any]]) -> None:
        self._first, self._rest = first, rest

    def __aiter__(self) -> "Prepended":
        return self

    async def __anext__(self) -> dict[str, Any]:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        return await anext(self._rest)

    async def aclose(self) -> None:
        self._first = None
        await self._rest.aclose()  # type: ignore[attr-defined]


async def leased(release: Callable[[Callable[[int], Awaitable[Any]] | None], Awaitable[None]],
                 events: AsyncIterator[dict[str, Any]],
                 next_turn: Callable[[str], Callable[[int], Awaitable[Any]] | None]) -> AsyncIterator[dict[str, Any]]:
    """The stream's events; its slot is released when the stream ends or is closed, readied for
    the conversation's next turn only if the answer is complete."""
    parts: list[str] = []
    then = None
    try:
        async for event in events:
            parts.append(event.get("response") or "")
            yield event
        then = next_turn("".join(parts))
    finally:
        try:
            await events.aclose()  # type: ignore[attr-defined]
        finally:  # even if closing is cancelled (it waits for llama.cpp's next token): never a slot held for ever
            await release(then)
