"""Running a generation on the AI binding: model fallback, stop sequences, finish reasons.

Fallback exists because the default model is listed for deprecation: when the binding says a
model is unknown or retired, the next configured id is tried, before any byte is sent, so the
caller sees one clean answer (and `model` says which model gave it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, AsyncIterator

from . import errors
from .errors import ErrorKind, GatewayError, RetryAfter
from .capabilities import capabilities_of, missing
from .generation import Event, Finish, Generation, GenerationRequest, Token, Usage
from .ports import BindingError, ModelNotFound
from .deps import Deps
from .structured import response_text, tool_call_deltas
from .access.reservation import prompt_estimate
from .stream import Stream, close_source


@dataclass
class PromptSeen:
    """The prompt tokens a binding stream has reported so far: a stream cut by a stop sequence is
    closed before its final usage event, and must still say what its prompt cost (the local
    binding reports it with the first token; else the estimate of `access.reservation`)."""

    prompt_tokens: int = 0


def candidate_models(deps: Deps, model: str) -> list[str]:
    """The requested model, then the configured fallbacks (never models the config lacks)."""
    return list(dict.fromkeys((model, *deps.config.fallback_models)))


def capable_models(deps: Deps, request: GenerationRequest) -> list[str]:
    """The candidates that can honour what the request asks (JSON mode, tools, logprobs): a
    fallback that cannot is skipped rather than answering prose to a request for JSON. The
    requested model itself was checked before inference (`capabilities.enforce`)."""
    candidates = candidate_models(deps, request.model)
    return [m for m in candidates if m == request.model
            or missing(capabilities_of(m, deps.config.model_capabilities, deps.ai.describe(m, live=False)), request.inputs) is None]


def binding_error(exc: BindingError, model: str) -> GatewayError:
    """An AI binding failure for `model`, through the gateway's one translator."""
    return errors.binding_error(exc, "The AI binding", "upstream", model)


async def start_generation(deps: Deps, request: GenerationRequest) -> Generation:
    """Start generating on the first model that accepts the request."""
    last: BindingError | None = None
    # A session goes to the binding only when there is one: bindings without sessions need not know the option.
    # Without one, a binding that reuses prompt prefixes per scope (the local edge's slots) is told the tenant.
    options: dict[str, str] = {"session": request.session} if request.session else {}
    if not request.session and request.prefix_scope and getattr(deps.ai, "scoped_prefix_reuse", False):
        options = {"prefix_scope": request.prefix_scope}
    for model in capable_models(deps, request):
        try:
            seen = PromptSeen()
            if request.stream:
                events = await _opened(deps, deps.ai.stream(model, {**request.inputs, "stream": True}, **options))
                source = _from_stream(events, request.max_tokens, seen)
            else:
                result = await _answered(deps, deps.ai.run(model, request.inputs, **options), request.max_tokens)
                source = _from_result(result, request.max_tokens)
        except ModelNotFound as exc:
            deps.log.warning("model %s unavailable (%s); trying the next fallback", model, exc)
            last = exc
            continue
        except BindingError as exc:
            raise binding_error(exc, model) from exc
        except GatewayError:
            raise
        except Exception as exc:  # an adapter that let a runtime error through is still a failing dependency
            raise binding_error(BindingError(f"{type(exc).__name__}: {exc}"), model) from exc
        events_of = apply_stop(source, request.stop, live=request.stream, prompt=(seen, prompt_estimate(request.inputs)))
        return Generation(model=model, events=owning(events_of, events) if request.stream else events_of)
    assert last is not None
    raise binding_error(last, request.model)


def start_timeout(deps: Deps) -> GatewayError:
    """The 503 of a stream the binding did not open within the start deadline."""
    return GatewayError(ErrorKind.UNAVAILABLE, f"The model could not start this answer within {deps.config.start_timeout_seconds:g} s; "
                        "retry shortly.", code="start_timeout", retry_after=RetryAfter.DEPENDENCY)


async def _opened(deps: Deps, opening: Awaitable[AsyncIterator[dict[str, Any]]]) -> AsyncIterator[dict[str, Any]]:
    """The binding's stream, opened within `start_timeout_seconds` (issue 25 item 15): a stream
    that cannot start in time is a 503 with Retry-After, never a connection left silent. A whole
    answer (`run`) has no moment it starts that the binding shows: `_answered` bounds it whole."""
    deadline = asyncio.timeout(deps.config.start_timeout_seconds)
    try:
        async with deadline:
            return await opening
    except TimeoutError:
        if deadline.expired():
            raise start_timeout(deps) from None
        raise  # the binding's own TimeoutError: a failing dependency, as before


def answer_timeout(limit: float) -> GatewayError:
    """The 503 of a whole answer the binding did not give within `limit` seconds. Its code is one
    of `errors.SPENT_CODES`: the binding may have generated all of it, so the request is charged
    its reservation, as one whose client left before its JSON answer."""
    return GatewayError(ErrorKind.UNAVAILABLE, f"The model did not finish this answer within {limit:g} s; retry shortly "
                        "(or stream it, or ask for fewer max_tokens).", code="answer_timeout", retry_after=RetryAfter.DEPENDENCY)


async def _answered(deps: Deps, running: Awaitable[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """A whole answer (`run`) within `Config.answer_timeout_seconds(max_tokens)`: the start
    deadline plus the answer's length at the slowest allowed rate. `run` stays a whole-answer call
    (Workers AI's JSON mode and tool calls do not stream); past the deadline the awaited call is
    cancelled (on the local edge that frees the llama.cpp slot; on workerd the binding's promise
    is dropped) and the request is a 503 with Retry-After, nothing cached."""
    limit = deps.config.answer_timeout_seconds(max_tokens)
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await running
    except TimeoutError:
        if deadline.expired():
            deps.log.warning("the AI binding gave no whole answer within %g s (max_tokens %d); the call was cancelled", limit, max_tokens)
            raise answer_timeout(limit) from None
        raise  # the binding's own TimeoutError: a failing dependency, as before


def finish_reason(usage: Usage, max_tokens: int, said: Any = None) -> str:
    """Workers AI reports no finish reason; a generation that used its whole budget hit it. A
    binding that says `finish_reason: "length"` (the local edge's llama.cpp) was cut short,
    whether by max_tokens or by the serving slot's context, which the budget alone cannot tell."""
    return "length" if said == "length" or usage.completion_tokens >= max_tokens else "stop"


def _with_tool_calls(reason: str, called: bool) -> str:
    """An answer that calls tools finishes with "tool_calls", unless it was cut by max_tokens."""
    return "tool_calls" if called and reason != "length" else reason


async def _from_result(result: dict[str, Any], max_tokens: int) -> AsyncIterator[Event]:
    text = response_text(result.get("response"))
    calls = tool_call_deltas(result.get("tool_calls"))
    if text is None and not calls:
        raise GatewayError(ErrorKind.UPSTREAM, "The AI binding returned no text.", code="upstream_error", retry_after=RetryAfter.DEPENDENCY)
    usage = Usage.from_json(result.get("usage"))
    logprobs = result.get("logprobs")
    if text or logprobs:
        yield Token(text or "", tuple(logprobs) if isinstance(logprobs, list) else None)
    for call in calls:
        yield call
    yield Finish(_with_tool_calls(finish_reason(usage, max_tokens, result.get("finish_reason")), bool(calls)), usage)


async def _from_stream(events: AsyncIterator[dict[str, Any]], max_tokens: int, seen: PromptSeen | None = None) -> AsyncIterator[Event]:
    usage: Usage | None = None
    count = 0
    called = False
    said = None  # the binding's own finish_reason, if it gives one
    try:
        async for event in events:
            said = event.get("finish_reason") or said
            text = response_text(event.get("response")) or ""
            if event.get("usage"):
                usage = Usage.from_json(event["usage"])
                if seen is not None and usage.prompt_tokens:
                    seen.prompt_tokens = usage.prompt_tokens
            logprobs = event.get("logprobs")
            if text or logprobs:
                count += 1
                yield Token(text, tuple(logprobs) if isinstance(logprobs, list) else None)
            for call in tool_call_deltas(event.get("tool_calls")):
                called = True
                yield call
    except BindingError as exc:
        raise binding_error(exc, "the stream") from exc
    except GatewayError:
        raise
    except Exception as exc:  # a broken stream (e.g. a JS read error) ends as an error event, not a crash
        raise binding_error(BindingError(f"{type(exc).__name__}: {exc}"), "the stream") from exc
    finally:
        await close_source(events)
    usage = usage or Usage(0, count)  # a stream without a usage event: one event per token
    if count and not usage.completion_tokens:  # only the prompt was reported (the local binding's first token)
        usage = Usage(usage.prompt_tokens, count, usage.cached_tokens)
    yield Finish(_with_tool_calls(finish_reason(usage, max_tokens, said), called), usage)


async def apply_stop(events: AsyncIterator[Event], stops: tuple[str, ...], *, live: bool = True,
                     prompt: tuple[PromptSeen, int] | None = None) -> AsyncIterator[Event]:
    """Cut the text at the first stop sequence.

    Holds back just enough characters to catch a stop sequence split across tokens. After a
    match the upstream is drained only if it has already finished (a non-streamed result, whose
    usage is then exact); a live stream is closed at once to stop paying for tokens, and its
    usage counts the tokens received and the prompt as far as known (`prompt`: what the stream
    reported so far, and the estimate when it reported nothing).
    """
    if not stops:
        try:
            async for event in events:
                yield event
        finally:  # closed mid-answer: the stream below is closed now, not whenever it is collected
            await close_source(events)
        return
    hold = max(len(s) for s in stops) - 1
    pending, received = "", 0
    try:
        async for event in events:
            if isinstance(event, Finish):
                if pending:
                    yield Token(pending)
                yield event
                return
            if not isinstance(event, Token):  # a tool call is not text: nothing to cut
                yield event
                continue
            received += 1
            pending += event.text
            cut = min((i for i in (pending.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                if pending[:cut]:
                    yield Token(pending[:cut])
                prompt_tokens = (prompt[0].prompt_tokens or prompt[1]) if prompt else 0
                yield Finish("stop", Usage(prompt_tokens, received) if live else await _final_usage(events))
                return
            if len(pending) > hold:
                yield Token(pending[: len(pending) - hold])
                pending = pending[len(pending) - hold :]
    finally:
        await close_source(events)


def owning(events: AsyncIterator[Event], owned: AsyncIterator[dict[str, Any]]) -> Stream[Event]:
    """A generation's events made by generators from a binding stream they own: closing them
    closes that stream, read or not. An async generator closed before its first read skips its
    `finally`, so a client gone before the first token would leave the binding's stream open (on
    the local edge, a llama.cpp slot held until the stream is collected); once read, the
    generators' own `finally` closes it (closed once, not twice)."""
    stream = Stream(events)

    async def if_unread() -> None:
        if not stream.started:
            await close_source(owned)

    return stream.on_close(if_unread)


async def _final_usage(events: AsyncIterator[Event]) -> Usage:
    async for event in events:
        if isinstance(event, Finish):
            return event.usage
    return Usage()
