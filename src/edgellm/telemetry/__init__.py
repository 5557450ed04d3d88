"""Observability: per-isolate metrics (`metrics`), their Prometheus text (`exposition`), W3C
trace context and spans (`tracing`). A finished request is told to all of them by the pipeline's
telemetry layer (`edgellm.pipeline.telemetry`). Plain Python: it ships to Cloudflare, where no
package may be installed; the local edge puts the OpenTelemetry SDK behind the tracer's seam
(`/metrics` is this package's own text on both runtimes)."""
