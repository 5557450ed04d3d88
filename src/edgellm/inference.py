"""Running a generation on the AI binding: model fallback, stop sequences, finish reasons.

Fallback exists because the default model is listed for deprecation: when the binding says a
model is unknown or retired, the next configured id is tried, before any byte is sent, so the
caller sees one clean answer (and `model` says which model gave it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator

from . import errors
from .errors import ErrorKind, GatewayError, RetryAfter
from .capabilities import capabilities_of, missing
from .generation import Event, Finish, Generation, GenerationRequest, PromptSeen, Token, ToolCallDelta, Usage
from .ports import BindingError, ModelNotFound
from .deps import Deps
from .structured import new_call_id, response_text, tool_call_deltas
from .access.reservation import prompt_estimate
from .stream import close_source, owns


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
            live = reads_live(request)
            if live:
                events = await _opened(deps, deps.ai.stream(model, {**request.inputs, "stream": True}, **options))
                # a whole answer read from a stream still has the whole answer's deadline
                read = events if request.stream else _within(events, deps, request.max_tokens)
                source = _from_stream(read, request.max_tokens, seen)
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
        # each layer owns the one below: closing the events, read or not, closes the binding's stream
        return Generation(model=model, events=apply_stop(source, request.stop, live=live, prompt=(seen, prompt_estimate(request.inputs))),
                          prompt_seen=seen)
    assert last is not None
    raise binding_error(last, request.model)


def reads_live(request: GenerationRequest) -> bool:
    """Whether the binding's answer is read as a stream: every streamed request, and a whole one
    with stop sequences (Workers AI has none: the gateway cuts the text). Read live, a whole
    answer stops generating at its stop sequence, as its stream does, and reports the same usage;
    read whole, the binding would have generated (and charged) the rest. JSON mode and tool calls
    stay whole answers: Workers AI does not stream them."""
    if request.stream:
        return True
    return bool(request.stop) and request.inputs.get("response_format") is None and not request.inputs.get("tools")


@owns("events")
async def _within(events: AsyncIterator[dict[str, Any]], deps: Deps, max_tokens: int) -> AsyncIterator[dict[str, Any]]:
    """A stream read for a whole answer, ended by `answer_timeout` past the deadline `run` has."""
    limit = deps.config.answer_timeout_seconds(max_tokens)
    deadline = asyncio.get_running_loop().time() + limit
    while True:
        timer = asyncio.timeout_at(deadline)
        try:
            async with timer:
                event = await anext(events)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if timer.expired():
                raise answer_timeout(limit) from None
            raise
        yield event


def start_timeout(deps: Deps) -> GatewayError:
    """The 503 of a stream the binding did not open within the start deadline."""
    return GatewayError(ErrorKind.UNAVAILABLE, f"The model could not start this answer within {deps.config.start_timeout_seconds:g} s; "
                        "retry shortly.", code="start_timeout", retry_after=RetryAfter.DEPENDENCY)


async def _opened(deps: Deps, opening: Awaitable[AsyncIterator[dict[str, Any]]]) -> AsyncIterator[dict[str, Any]]:
    """The binding's stream, opened within `start_timeout_seconds`: a stream
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


@owns("events")
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
    finally:  # the binding's stream ended: closed now, before its Finish is passed on
        await close_source(events)
    usage = usage or Usage(0, count)  # a stream without a usage event: one event per token
    if count and not usage.completion_tokens:  # only the prompt was reported (the local binding's first token)
        usage = Usage(usage.prompt_tokens, count, usage.cached_tokens)
    yield Finish(_with_tool_calls(finish_reason(usage, max_tokens, said), called), usage)


@owns("events")
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
        async for event in events:
            yield event
        return
    hold = max(len(s) for s in stops) - 1
    pending, received = "", 0
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


@dataclass
class _OpenCall:
    id: str | None
    name: str | None
    arguments: str


@owns("events")
async def whole_tool_calls(events: AsyncIterator[Event]) -> AsyncIterator[Event]:
    """Tool calls as clients can use them, whatever the backend streamed: each call one event with
    its id, one name and its own arguments, numbered from 0 in order, sent when the answer
    finishes (text still streams as it comes).

    Why held to the end: a call is only usable whole (the AI SDK and litellm parse `arguments` as
    JSON), and only a finished answer tells a complete call from one the cut left half-written.
    A fragment that names another function (or another id) under an index already named starts a
    call of its own, never glued onto the first; a call that never got a name is dropped; and when
    the answer was cut (`length`), a last call whose arguments are not JSON is the cut's
    half-written call and is dropped too (the finish reason says the answer was cut). A JSON
    answer and its stream, both read through this, give the same calls."""
    calls: list[_OpenCall] = []  # in the order begun
    filling: dict[int, _OpenCall] = {}  # the backend's index -> the call its fragments extend
    async for event in events:
        if isinstance(event, ToolCallDelta):
            call = filling.get(event.index)
            if call is None or (event.name is not None and call.name is not None
                                and (event.name != call.name or (event.id is not None and event.id != call.id))):
                call = filling[event.index] = _OpenCall(event.id, event.name, event.arguments)
                calls.append(call)
            else:
                call.id = call.id or event.id
                call.name = call.name or event.name
                call.arguments += event.arguments
            continue
        if isinstance(event, Finish):
            whole = [c for c in calls if c.name is not None]
            if whole and event.finish_reason == "length" and whole[-1] is calls[-1] and not _is_json(whole[-1].arguments):
                whole.pop()
            for index, call in enumerate(whole):
                yield ToolCallDelta(index, call.id or new_call_id(), call.name, call.arguments)
            if event.finish_reason == "tool_calls" and not whole:
                event = replace(event, finish_reason="stop")
            calls, filling = [], {}
        yield event


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


async def _final_usage(events: AsyncIterator[Event]) -> Usage:
    async for event in events:
        if isinstance(event, Finish):
            return event.usage
    return Usage()
