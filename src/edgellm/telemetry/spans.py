"""The spans of a generation's steps (the cache lookup, the flight, the generation itself, the KV
write), made only when a tracer records them: with none (the default), a step costs one check.

A generation's span lasts as long as its events: it ends when they end or are closed (a client
that left), with the GenAI attributes of what was generated (`gen_ai.usage.*`, the finish reason).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from ..generation import Event, Finish, Generation, GenerationRequest
from ..stream import Stream
from . import tracing
from .metrics import served_by

if TYPE_CHECKING:
    from ..deps import Deps
    from ..ports import TraceSpan


def step(deps: Deps, name: str, attributes: Mapping[str, Any] | None = None) -> TraceSpan | None:
    """A child of the current span, or None when nothing records spans."""
    if not deps.tracer.recording:
        return None
    return tracing.child(deps.tracer, name, attributes)


def generation_attributes(gen_request: GenerationRequest) -> dict[str, Any]:
    return {tracing.GEN_AI_OPERATION: "chat" if "messages" in gen_request.inputs else "text_completion",
            tracing.GEN_AI_SYSTEM: "edgellm", tracing.GEN_AI_REQUEST_MODEL: gen_request.model,
            tracing.GEN_AI_REQUEST_MAX_TOKENS: gen_request.max_tokens, "edgellm.stream": gen_request.stream}


async def traced_generation(deps: Deps, gen_request: GenerationRequest, start: Callable[[], Awaitable[Generation]]) -> Generation:
    """`start()` under a generation span (OpenTelemetry's GenAI name: `{operation} {model}`), the
    current span while it starts, so an origin it calls is sent this span's trace context."""
    attributes = generation_attributes(gen_request) if deps.tracer.recording else None
    span = step(deps, f"{attributes[tracing.GEN_AI_OPERATION]} {gen_request.model}" if attributes else "", attributes)
    if span is None:
        return await start()
    try:
        with tracing.using(span):
            generation = await start()
    except BaseException as exc:
        span.end(f"{type(exc).__name__}: {getattr(exc, 'message', exc)}")
        raise
    span.set(tracing.GEN_AI_RESPONSE_MODEL, generation.model)
    span.set("edgellm.served_by", served_by(generation.route, generation.cache_status or ""))

    def see(event: Event) -> None:
        if isinstance(event, Finish):
            span.set(tracing.GEN_AI_INPUT_TOKENS, event.usage.prompt_tokens)
            span.set(tracing.GEN_AI_OUTPUT_TOKENS, event.usage.completion_tokens)
            span.set(tracing.GEN_AI_FINISH_REASONS, [event.finish_reason])
            if event.route:
                span.set("edgellm.served_by", served_by(event.route, ""))

    generation.events = Stream(generation.events).tap(see).on_close(span.end)
    return generation
