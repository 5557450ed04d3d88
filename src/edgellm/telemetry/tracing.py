"""W3C trace context and the core's spans, behind the `Tracer` port (`ports.Tracer`).

A client's `traceparent` is honoured (the request's spans join its trace); a request without
one starts a trace. Every call to an origin carries the trace on with a span id of its own
(`outgoing`), so a trace in the operator's collector follows one request through the edge to the
origin and back.

Spans are named and attributed as OpenTelemetry's semantic conventions say (`http.request.method`,
`http.route`, and the GenAI ones: `gen_ai.request.model`, `gen_ai.usage.input_tokens`, ...), so
a collector's GenAI views read them as they read vLLM's or LiteLLM's. Which tracer records them
is the runtime's choice: none by default (`NoopTracer`, which costs a request no span id it does
not need), the OpenTelemetry SDK on the local edge, log lines on Cloudflare (`LogTracer`).

The span a request's work runs under is a context variable, like OpenTelemetry's own current
span: a task's context is its own, so every request (and what it starts) sees its own span.
"""

from __future__ import annotations

import json
import logging
import re
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple

from ..ids import RandomIds

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16

# OpenTelemetry's GenAI semantic conventions (the attribute names a collector's GenAI views read)
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"


class SpanContext(NamedTuple):
    """A span's place in its trace: W3C's trace id (32 hex), span id (16 hex) and sampled flag.
    A tuple: one is made per request, and a frozen dataclass costs several times as much."""

    trace_id: str
    span_id: str
    sampled: bool = True

    def traceparent(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{'01' if self.sampled else '00'}"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """A `traceparent` header's context, or None when absent or malformed (W3C: then the request
    starts a trace of its own). Version ff, an all-zero id, or a version-00 header with extra
    fields are invalid."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    return SpanContext(trace_id, span_id, bool(int(flags, 16) & 1))


def new_trace(ids: RandomIds) -> SpanContext:
    both = ids.hex(24)  # one draw for the trace id and the span id
    return SpanContext(both[:32], both[32:])


class Span:
    """A span that records nothing (`NoopTracer`'s): its context, and calls that do nothing.
    Implementations add what they record; callers only `set` attributes and `end` it.

    Made for every request, read by few (a log line, an origin call): its context is worked out
    when first read, from the client's `traceparent` or a new trace, so a cache HIT with its log
    off draws no ids for it."""

    __slots__ = ("_context", "_traceparent", "_ids")

    def __init__(self, context: SpanContext | None = None, *, traceparent: str | None = None, ids: RandomIds | None = None) -> None:
        self._context, self._traceparent, self._ids = context, traceparent, ids

    @property
    def context(self) -> SpanContext:
        context = self._context
        if context is None:
            context = self._context = parse_traceparent(self._traceparent) or new_trace(self._ids or RandomIds(block=24))
        return context

    def set(self, key: str, value: Any) -> None:
        pass

    def end(self, error: str | None = None) -> None:
        pass


@dataclass(frozen=True)
class NoopTracer:
    """No spans recorded. A request's span is its trace's context as the client sent it (or a new
    trace, `request_span`); a child span is its parent's context: nothing would ever read a new id."""

    recording: bool = False

    def start_span(self, name: str, parent: SpanContext | None, attributes: Mapping[str, Any] | None = None) -> Span:
        return Span(parent)


@dataclass
class LogTracer:
    """Spans as JSON log lines (`edgellm.trace`), one per span when it ends: on Cloudflare, Workers
    Logs keeps them (`[observability]` in wrangler.toml) beside the platform's own traces, with the
    same attributes an OTLP collector gets locally."""

    log: logging.Logger = field(default_factory=lambda: logging.getLogger("edgellm.trace"))
    ids: RandomIds = field(default_factory=RandomIds)
    recording: bool = True

    def start_span(self, name: str, parent: SpanContext | None, attributes: Mapping[str, Any] | None = None) -> Span:
        trace_id = parent.trace_id if parent is not None else self.ids.hex(16)
        context = SpanContext(trace_id, self.ids.hex(8), parent.sampled if parent is not None else True)
        return LoggedSpan(self.log, name, context, parent.span_id if parent is not None else None, dict(attributes or {}))


class LoggedSpan(Span):
    __slots__ = ("log", "name", "parent_id", "attributes", "started", "ended")

    def __init__(self, log: logging.Logger, name: str, context: SpanContext, parent_id: str | None, attributes: dict[str, Any]) -> None:
        super().__init__(context)
        self.log, self.name, self.parent_id, self.attributes = log, name, parent_id, attributes
        self.started, self.ended = time.time(), False

    def set(self, key: str, value: Any) -> None:
        self.attributes[key] = value

    def end(self, error: str | None = None) -> None:
        if self.ended:
            return
        self.ended = True
        if not self.log.isEnabledFor(logging.INFO):
            return
        record = {"span": self.name, "trace_id": self.context.trace_id, "span_id": self.context.span_id,
                  "parent_span_id": self.parent_id, "duration_ms": round((time.time() - self.started) * 1000, 3),
                  "status": "error" if error else "ok", **({"error": error} if error else {}), **self.attributes}
        self.log.info("%s", json.dumps(record, separators=(",", ":"), default=str))


def request_span(tracer: Any, ids: RandomIds, method: str, traceparent: str | None) -> Any:
    """A request's span: a child of the client's span when it sent a valid `traceparent`, else the
    root of a new trace; with nothing recording, only its context (ids from the isolate's `ids`)."""
    if tracer.recording:
        return tracer.start_span(method, parse_traceparent(traceparent), {"http.request.method": method})
    return Span(traceparent=traceparent, ids=ids)


_CURRENT: ContextVar[Span | None] = ContextVar("edgellm_span", default=None)


def current_span() -> Span | None:
    """The span the running request's work is under (None outside a request)."""
    return _CURRENT.get()


def enter(span: Span) -> None:
    """Make `span` the current one for this task (a request's span, set once by `app.handle`)."""
    _CURRENT.set(span)


def child(tracer: Any, name: str, attributes: Mapping[str, Any] | None = None) -> Span:
    """A span under the current one (a trace of its own outside any request)."""
    parent = _CURRENT.get()
    return tracer.start_span(name, parent.context if parent is not None else None, attributes)


def outgoing(tracer: Any, ids: RandomIds) -> str:
    """The `traceparent` an outbound call (an origin) sends: the current span's trace and, as W3C
    asks, a span id of its own: the current span's when a tracer records it (the origin's spans
    are then its children in the collector), a new one when nothing records spans."""
    parent = _CURRENT.get()
    context = parent.context if parent is not None else new_trace(ids)
    if getattr(tracer, "recording", False) and parent is not None:
        return context.traceparent()
    return SpanContext(context.trace_id, ids.hex(8), context.sampled).traceparent()


class using:
    """`with using(span):` the span is the current one for what runs inside (a generation's start,
    where an origin is called), then the one before it again."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span) -> None:
        self.span = span

    def __enter__(self) -> Span:
        self.token = _CURRENT.set(self.span)
        return self.span

    def __exit__(self, *exc: object) -> None:
        _CURRENT.reset(self.token)
