"""Running a generation on the AI binding: model fallback, stop sequences, finish reasons.

Fallback exists because the default model is listed for deprecation: when the binding says a
model is unknown or retired, the next configured id is tried, before any byte is sent, so the
caller sees one clean answer (and `model` says which model gave it).
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from .errors import ErrorKind, GatewayError
from .generation import Event, Finish, Generation, GenerationRequest, Token, Usage
from .ports import BindingError, CapacityExceeded, Deps, InvalidModelInput, ModelNotFound

RETRY_AFTER_SECONDS = 5


def candidate_models(deps: Deps, model: str) -> list[str]:
    """The requested model, then the configured fallbacks (never models the config lacks)."""
    return list(dict.fromkeys((model, *deps.config.fallback_models)))


def binding_error(exc: BindingError, model: str) -> GatewayError:
    """Translate a binding failure in exactly one place."""
    if isinstance(exc, InvalidModelInput):
        return GatewayError(ErrorKind.INVALID_REQUEST, f"The model rejected the input: {exc}", code="invalid_model_input")
    if isinstance(exc, CapacityExceeded):
        return GatewayError(
            ErrorKind.UNAVAILABLE, f"Inference capacity exceeded for {model}: {exc}", code="capacity_exceeded",
            retry_after=RETRY_AFTER_SECONDS,
        )
    if isinstance(exc, ModelNotFound):
        return GatewayError(
            ErrorKind.UPSTREAM, f"No configured model is available (last tried {model}: {exc}).",
            code="model_unavailable", retry_after=60,
        )
    return GatewayError(
        ErrorKind.UPSTREAM, f"The AI binding failed for {model}: {exc}", code="upstream_error",
        retry_after=RETRY_AFTER_SECONDS,
    )


async def start_generation(deps: Deps, request: GenerationRequest) -> Generation:
    """Start generating on the first model that accepts the request."""
    last: BindingError | None = None
    # A session goes to the binding only when there is one: bindings without sessions need not know the option.
    options = {"session": request.session} if request.session else {}
    for model in candidate_models(deps, request.model):
        try:
            if request.stream:
                events = await deps.ai.stream(model, {**request.inputs, "stream": True}, **options)
                source = _from_stream(events, request.max_tokens)
            else:
                result = await deps.ai.run(model, request.inputs, **options)
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
        return Generation(model=model, events=apply_stop(source, request.stop, live=request.stream))
    assert last is not None
    raise binding_error(last, request.model)


def finish_reason(usage: Usage, max_tokens: int) -> str:
    """Workers AI reports no finish reason; a generation that used its whole budget hit it."""
    return "length" if usage.completion_tokens >= max_tokens else "stop"


async def _from_result(result: dict[str, Any], max_tokens: int) -> AsyncIterator[Event]:
    text = result.get("response")
    if not isinstance(text, str):
        raise GatewayError(ErrorKind.UPSTREAM, "The AI binding returned no text.", code="upstream_error", retry_after=RETRY_AFTER_SECONDS)
    usage = Usage.from_json(result.get("usage"))
    if text:
        yield Token(text)
    yield Finish(finish_reason(usage, max_tokens), usage)


async def _from_stream(events: AsyncIterator[dict[str, Any]], max_tokens: int) -> AsyncIterator[Event]:
    usage: Usage | None = None
    count = 0
    try:
        async for event in events:
            text = event.get("response") or ""
            if event.get("usage"):
                usage = Usage.from_json(event["usage"])
            if text:
                count += 1
                yield Token(text)
    except BindingError as exc:
        raise binding_error(exc, "the stream") from exc
    except GatewayError:
        raise
    except Exception as exc:  # a broken stream (e.g. a JS read error) ends as an error event, not a crash
        raise binding_error(BindingError(f"{type(exc).__name__}: {exc}"), "the stream") from exc
    finally:
        await _aclose(events)
    usage = usage or Usage(0, count)  # a stream without a usage event: one event per token
    yield Finish(finish_reason(usage, max_tokens), usage)


async def apply_stop(events: AsyncIterator[Event], stops: tuple[str, ...], *, live: bool = True) -> AsyncIterator[Event]:
    """Cut the text at the first stop sequence.

    Holds back just enough characters to catch a stop sequence split across tokens. After a
    match the upstream is drained only if it has already finished (a non-streamed result, whose
    usage is then exact); a live stream is closed at once to stop paying for tokens, and its
    usage counts the tokens received.
    """
    if not stops:
        async for event in events:
            yield event
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
            received += 1
            pending += event.text
            cut = min((i for i in (pending.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                if pending[:cut]:
                    yield Token(pending[:cut])
                yield Finish("stop", Usage(0, received) if live else await _final_usage(events))
                return
            if len(pending) > hold:
                yield Token(pending[: len(pending) - hold])
                pending = pending[len(pending) - hold :]
    finally:
        await _aclose(events)


async def _final_usage(events: AsyncIterator[Event]) -> Usage:
    async for event in events:
        if isinstance(event, Finish):
            return event.usage
    return Usage()


async def _aclose(iterator: Any) -> None:
    close = getattr(iterator, "aclose", None)
    if close is not None:
        await close()
