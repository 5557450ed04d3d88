"""The local edge's tracing over the standard package: spans recorded by the OpenTelemetry SDK
(`/metrics` is the core's own writer on both runtimes), exported over OTLP/HTTP when
`OTEL_EXPORTER_OTLP_ENDPOINT` is set (the SDK's own variables configure the exporter:
`OTEL_EXPORTER_OTLP_HEADERS`, `OTEL_SERVICE_NAME`, ...)."""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from edgellm.telemetry.tracing import NoopTracer, SpanContext


class OtelSpan:
    """A core span over an OpenTelemetry SDK span."""

    __slots__ = ("span", "context", "name")

    def __init__(self, span: Any, name: str) -> None:
        from opentelemetry.trace import format_span_id, format_trace_id

        self.span, self.name = span, name
        ctx = span.get_span_context()
        self.context = SpanContext(format_trace_id(ctx.trace_id), format_span_id(ctx.span_id), ctx.trace_flags.sampled)

    def set(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)
        if key == "http.route":  # OpenTelemetry's HTTP server span name: "{method} {route}"
            self.span.update_name(f"{self.name} {value}")

    def end(self, error: str | None = None) -> None:
        from opentelemetry.trace import Status, StatusCode

        if error:
            self.span.set_status(Status(StatusCode.ERROR, error))
        self.span.end()  # a second end is the SDK's no-op (it warns): the core ends each span once


@dataclass
class OtelTracer:
    """The core's `Tracer` over an OpenTelemetry `TracerProvider`. Parents are the core's span
    contexts (a client's `traceparent`, or a span of this tracer), never the SDK's implicit current
    span: the core says which span each one is under."""

    provider: Any
    recording: bool = True
    _tracer: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._tracer = self.provider.get_tracer("edgellm")

    def start_span(self, name: str, parent: SpanContext | None, attributes: Mapping[str, Any] | None = None) -> OtelSpan:
        from opentelemetry import context as otel_context
        from opentelemetry import trace
        from opentelemetry.trace import NonRecordingSpan, SpanKind, TraceFlags
        from opentelemetry.trace import SpanContext as OtelSpanContext

        ctx = otel_context.Context()  # no parent: a new trace
        kind = SpanKind.INTERNAL
        if parent is not None:
            remote = OtelSpanContext(int(parent.trace_id, 16), int(parent.span_id, 16), is_remote=True,
                                     trace_flags=TraceFlags(TraceFlags.SAMPLED if parent.sampled else TraceFlags.DEFAULT))
            ctx = trace.set_span_in_context(NonRecordingSpan(remote), ctx)
        if "http.request.method" in (attributes or {}):
            kind = SpanKind.SERVER
        span = self._tracer.start_span(name, context=ctx, kind=kind, attributes=dict(attributes or {}))
        return OtelSpan(span, name)


def otlp_tracer(environ: Mapping[str, str] = os.environ) -> Any:
    """An OTLP-exporting tracer when `OTEL_EXPORTER_OTLP_ENDPOINT` (or its traces variant) is set,
    else the core's no-op one. The provider is shut down (its last batch sent) at exit."""
    if not (environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return NoopTracer()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": environ.get("OTEL_SERVICE_NAME", "edgellm")}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    atexit.register(provider.shutdown)
    return OtelTracer(provider)
