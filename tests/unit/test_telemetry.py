"""The core's metrics and trace context, without a server: the Worker's own Prometheus text and
`prometheus_client`'s parse to the same families; W3C `traceparent` parsing; bounded labels."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.telemetry.exposition import TextExposition, families
from edgellm.telemetry.metrics import MAX_SERIES, OTHER, Histogram, Telemetry, served_by, status_class
from edgellm.telemetry.tracing import LogTracer, SpanContext, parse_traceparent
from edgellm_local.telemetry import PrometheusExposition


class DescribedAI:
    """The AI binding's seam, saying only what `/metrics` asks of it: the engine's slots."""

    def describe(self, model: str, *, live: bool = True) -> dict[str, Any]:
        return {"slots": {"busy": 1, "waiting": 3, "generating_at_once": 2}}


def busy_deps() -> Deps:
    deps = Deps(config=Config(), ai=DescribedAI())  # type: ignore[arg-type]
    t = deps.state.telemetry
    for status in (200, 200, 400, 503):
        t.count_request("/v1/chat/completions", "@cf/m" if status == 200 else "", t.tenant_label("acme"), status)
    t.count_tokens("@cf/m", "acme", 12, 7)
    for where, ttft, latency in (("edge", 0.02, 0.4), ("cache", None, 0.001), ("origin", 1.5, 3.0), ("edge", 70.0, 80.0)):
        t.observe_times("@cf/m", where, ttft, latency)
    deps.state.cache.hits, deps.state.cache.misses, deps.state.cache.read_errors = 5, 2, 1
    deps.state.admission.refused = 4
    deps.state.routing.counters.origin_errors = 3
    return deps


def parsed(text: str) -> list[tuple[str, str, list[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    return sorted((f.name, f.type, sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in f.samples))
                  for f in text_string_to_metric_families(text))


def test_the_workers_text_and_prometheus_clients_parse_to_the_same_families() -> None:
    all_families = families(busy_deps())
    core, core_type = TextExposition().render(all_families)
    client, client_type = PrometheusExposition().render(all_families)
    assert core_type.startswith("text/plain") and client_type.startswith("text/plain")
    ours, theirs = parsed(core.decode()), parsed(client.decode())
    assert ours == theirs
    names = {name: kind for name, kind, _ in ours}
    assert names["edgellm_requests"] == "counter" and names["edgellm_time_to_first_token_seconds"] == "histogram"
    assert names["edgellm_num_requests_waiting"] == "gauge" and names["edgellm_slots_busy"] == "gauge"
    samples = {(n, labels): v for _, _, s in ours for n, labels, v in s}
    assert samples[("edgellm_num_requests_waiting", ())] == 3 and samples[("edgellm_kv_errors_total", (("operation", "read"),))] == 1
    assert samples[("edgellm_admission_refusals_total", ())] == 4 and samples[("edgellm_origin_failures_total", ())] == 3
    inf = (("le", "+Inf"), ("model", "@cf/m"), ("served_by", "edge"))
    assert samples[("edgellm_time_to_first_token_seconds_bucket", inf)] == 2  # 70 s: past the last bound, still counted


def test_an_empty_isolate_renders_and_parses() -> None:
    text, _ = TextExposition().render(families(Deps(config=Config(), ai=DescribedAI())))  # type: ignore[arg-type]
    assert {f.name for f in text_string_to_metric_families(text.decode())} >= {"edgellm_requests", "edgellm_cache_hits"}


def test_label_values_are_escaped_as_the_format_says() -> None:
    deps = Deps(config=Config(), ai=DescribedAI())  # type: ignore[arg-type]
    deps.state.telemetry.count_request("/x", 'a "quoted"\\ model\nline', "", 200)
    core, _ = TextExposition().render(families(deps))
    client, _ = PrometheusExposition().render(families(deps))
    assert parsed(core.decode()) == parsed(client.decode())


def test_past_max_series_new_tenants_are_other() -> None:
    t = Telemetry()
    labels = {t.tenant_label(f"tenant-{i}") for i in range(MAX_SERIES + 50)}
    assert len(labels) == MAX_SERIES + 1 and OTHER in labels
    for i in range(MAX_SERIES * 3):
        t.count_request("/v1/chat/completions", f"model-{i}", "", 200)
        t.count_tokens(f"model-{i}", "", 1, 1)
        t.observe_times(f"model-{i}", "edge", 0.1, 0.2)
    # folded into `other`, never one series per value; nothing is lost
    assert len(t.requests) == MAX_SERIES + 1 and sum(t.requests.values()) == MAX_SERIES * 3
    assert len(t.prompt_tokens) == MAX_SERIES + 1 and sum(t.generation_tokens.values()) == MAX_SERIES * 3
    assert len(t.latency) == MAX_SERIES + 1 and sum(h.count for h in t.ttft.values()) == MAX_SERIES * 3


@pytest.mark.parametrize(("status", "expected"), [(101, "1xx"), (200, "2xx"), (304, "3xx"), (404, "4xx"), (499, "4xx"), (503, "5xx")])
def test_status_classes(status: int, expected: str) -> None:
    assert status_class(status) == expected


@pytest.mark.parametrize(("route", "cache", "expected"), [
    (None, "HIT", "cache"), (None, "MISS", "edge"), ("edge; reason=primary", "MISS", "edge"),
    ("origin; reason=breaker; origin=central", "BYPASS", "origin"), ("edge,origin; reason=stall", "MISS", "fallback"),
])
def test_served_by_is_one_of_a_few_words(route: str | None, cache: str, expected: str) -> None:
    assert served_by(route, cache) == expected


def test_histogram_quantiles_are_estimated_as_prometheus_does() -> None:
    h = Histogram(bounds=(1.0, 2.0, 4.0))
    assert h.quantile(0.5) is None
    for value in (0.5, 1.5, 1.5, 3.0):
        h.observe(value)
    assert h.cumulative() == [1, 3, 4, 4]
    assert h.quantile(0.5) == pytest.approx(1.5)  # rank 2 of 4: halfway through the (1, 2] bucket
    assert h.quantile(1.0) == pytest.approx(4.0)


TRACE, SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


@pytest.mark.parametrize(("header", "expected"), [
    (f"00-{TRACE}-{SPAN}-01", SpanContext(TRACE, SPAN, True)),
    (f"00-{TRACE}-{SPAN}-00", SpanContext(TRACE, SPAN, False)),
    (f"00-{TRACE.upper()}-{SPAN}-01", SpanContext(TRACE, SPAN, True)),  # read leniently, written lower-case
    (f"01-{TRACE}-{SPAN}-03-future", SpanContext(TRACE, SPAN, True)),  # a later version may carry more
    (None, None), ("", None), ("garbage", None),
    (f"ff-{TRACE}-{SPAN}-01", None),  # version ff is invalid
    (f"00-{'0' * 32}-{SPAN}-01", None), (f"00-{TRACE}-{'0' * 16}-01", None),  # all-zero ids
    (f"00-{TRACE}-{SPAN}-01-extra", None),  # version 00 has exactly four fields
    (f"00-{TRACE[:-1]}-{SPAN}-01", None),
])
def test_traceparent_parsing(header: str | None, expected: SpanContext | None) -> None:
    assert parse_traceparent(header) == expected
    if expected is not None:
        assert parse_traceparent(expected.traceparent()) == expected


def test_the_log_tracer_writes_one_json_line_per_span_with_its_parent(caplog: pytest.LogCaptureFixture) -> None:
    import json

    tracer = LogTracer(log=logging.getLogger("edgellm.test.trace"))
    with caplog.at_level(logging.INFO, logger="edgellm.test.trace"):
        root = tracer.start_span("POST", SpanContext(TRACE, SPAN), {"http.request.method": "POST"})
        child = tracer.start_span("chat m", root.context, {"gen_ai.request.model": "m"})
        child.set("gen_ai.usage.output_tokens", 3)
        child.end()
        child.end()  # once
        root.end("HTTP 503")
    lines = [json.loads(r.getMessage()) for r in caplog.records]
    assert [line["span"] for line in lines] == ["chat m", "POST"]
    assert lines[0]["parent_span_id"] == root.context.span_id and lines[1]["parent_span_id"] == SPAN
    assert {line["trace_id"] for line in lines} == {TRACE}
    assert lines[0]["gen_ai.usage.output_tokens"] == 3 and lines[1]["status"] == "error"


def test_request_ids_are_unique_per_isolate_and_differ_between_isolates() -> None:
    from edgellm.ids import RequestIds

    one, other = RequestIds(), RequestIds()
    ids = [one.new() for _ in range(1000)]
    assert len(set(ids)) == 1000 and len({i.split("-")[0] for i in ids}) == 1
    assert other.new().split("-")[0] != ids[0].split("-")[0]


def test_the_grafana_dashboard_reads_only_metrics_the_edge_exposes() -> None:
    import json
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "grafana" / "edgellm-dashboard.json").read_text())
    exposed = set()
    for family in families(busy_deps()):
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}[family.type]
        exposed |= {family.name + s for s in suffixes}
    used = {name for panel in dashboard["panels"] for target in panel["targets"] for name in re.findall(r"\bedgellm_\w+", target["expr"])}
    assert used and used <= exposed, used - exposed
    titles = " ".join(panel["title"] for panel in dashboard["panels"]).lower()
    for shown in ("requests per minute", "errors", "cache hit ratio", "time to first token", "tokens per minute by tenant"):
        assert shown in titles
