"""The core's metrics and trace context, without a server: the Worker's own Prometheus text and
`prometheus_client`'s parse to the same families; W3C `traceparent` parsing; bounded labels."""

from __future__ import annotations

import logging
import math
import re
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.telemetry.exposition import Family, TextExposition, families, go_float
from edgellm.telemetry.metrics import MAX_SERIES, OTHER, TIME_BUCKETS, Histogram, Telemetry, served_by, status_class
from edgellm.telemetry.tracing import LogTracer, SpanContext, parse_traceparent
from tests.prometheus_oracle import PrometheusExposition
from tests.unit.test_workers_sdk import runtime  # noqa: F401  (the Worker over the real Workers SDK)


class DescribedAI:
    """The AI binding's seam, saying only what `/metrics` asks of it: the engine's slots, which
    only a live description has (a cached one says nothing of load)."""

    def describe(self, model: str, *, live: bool = False) -> dict[str, Any]:
        return {"slots": {"busy": 1, "waiting": 3, "generating_at_once": 2}} if live else {}


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
    samples = {(n, tuple(kv for kv in labels if kv[0] != "isolate")): v for _, _, s in ours for n, labels, v in s}
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
    assert t.requests[("/v1/chat/completions", OTHER, OTHER, 2)] == MAX_SERIES * 2  # folded, its status class kept
    assert len(t.prompt_tokens) == MAX_SERIES + 1 and sum(t.generation_tokens.values()) == MAX_SERIES * 3
    assert len(t.latency) == MAX_SERIES + 1 and sum(h.count for h in t.ttft.values()) == MAX_SERIES * 3


@pytest.mark.parametrize(("status", "expected"), [(101, "1xx"), (200, "2xx"), (304, "3xx"), (404, "4xx"), (499, "4xx"), (503, "5xx"),
                                                 (99, "1xx"), (999, "5xx")])  # past the classes: the nearest one
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
    first = Histogram(bounds=(1.0, 2.0, 4.0))
    for value in (0.5, 0.5):
        first.observe(value)
    assert first.quantile(0.5) == pytest.approx(0.5)  # the first bucket runs from 0
    past = Histogram(bounds=(1.0, 2.0, 4.0))
    for value in (10.0, 20.0):
        past.observe(value)
    assert past.quantile(0.5) == 4.0  # a rank in +Inf reads as the highest finite bound, as histogram_quantile does


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


@pytest.mark.parametrize("value", ["back\\slash", "a\\nb", "ends with\\", 'q"uote\\"', "line\nbreak", "\\\\"])
def test_the_workers_writer_escapes_a_backslash_so_the_value_reads_back_as_written(value: str) -> None:
    """A backslash the writer leaves bare reads back as the start of an escape: `a\\nb` (a
    backslash and an n) would come back as a line break."""
    deps = Deps(config=Config(), ai=DescribedAI())  # type: ignore[arg-type]
    deps.state.telemetry.count_request("/x", value, "", 200)
    core, _ = TextExposition().render(families(deps))
    models = {s.labels["model"] for f in text_string_to_metric_families(core.decode()) if f.name == "edgellm_requests" for s in f.samples}
    assert models == {value}


@pytest.mark.parametrize("bound", TIME_BUCKETS)
def test_an_observation_on_a_bound_is_in_that_bucket_as_le_says(bound: float) -> None:
    """`le` is "less than or equal": a value equal to a bound is counted in that bound's bucket."""
    histogram = Histogram()
    histogram.observe(bound)
    at = TIME_BUCKETS.index(bound)
    assert histogram.cumulative()[at] == 1
    assert at == 0 or histogram.cumulative()[at - 1] == 0


def test_every_sample_names_its_isolate_with_one_bounded_value() -> None:
    one, other = busy_deps(), busy_deps()
    for deps in (one, other):
        text, _ = TextExposition().render(families(deps))
        isolates = {s.labels.get("isolate") for f in text_string_to_metric_families(text.decode()) for s in f.samples}
        assert isolates == {deps.state.telemetry.isolate}
        assert re.fullmatch(r"[0-9a-f]{8}", deps.state.telemetry.isolate)
    assert one.state.telemetry.isolate != other.state.telemetry.isolate


def increase(points: list[float]) -> float:
    """Prometheus's `increase()` over a series' points, without its extrapolation to the window's
    edges: a value lower than the one before is a counter reset, counted from zero
    (promql/functions.go, `extrapolatedRate`)."""
    total = 0.0
    for before, now in zip(points, points[1:]):
        total += now - before if now >= before else now
    return total


def test_two_isolates_scraped_alternately_give_each_its_own_increase() -> None:
    """A load balancer sends each scrape to some isolate. With the isolate label each one's counter
    is a series of its own, and `sum(increase())` is the requests the scraped isolates answered;
    without it the alternation reads as a reset on every scrape (a busy isolate's whole count
    counted again each time)."""
    busy, quiet = Deps(config=Config(), ai=DescribedAI()), Deps(config=Config(), ai=DescribedAI())  # type: ignore[arg-type]
    for _ in range(5000):  # long-lived: a big count before the window opens
        busy.state.telemetry.count_request("/v1/chat/completions", "@cf/m", "", 200)
    series: dict[tuple[tuple[str, str], ...], list[float]] = {}
    unlabelled: list[float] = []
    truth = 0
    for scrape in range(12):
        deps = busy if scrape % 2 == 0 else quiet
        for target in (busy, quiet):  # traffic between scrapes: two requests each
            for _ in range(2):
                target.state.telemetry.count_request("/v1/chat/completions", "@cf/m", "", 200)
            truth += 2
        text, _ = TextExposition().render(families(deps))
        (sample,) = [s for f in text_string_to_metric_families(text.decode()) if f.name == "edgellm_requests" for s in f.samples]
        series.setdefault(tuple(sorted(sample.labels.items())), []).append(sample.value)
        unlabelled.append(sample.value)
    assert len(series) == 2  # one series per isolate
    per_isolate = sum(increase(points) for points in series.values())
    # all 48 but what came before each isolate's first scrape (busy 2, quiet 4) or after its last (busy 2)
    assert truth == 48 and per_isolate == truth - 8
    assert increase(unlabelled) > 10 * truth  # the same scrapes as one series: the nonsense the label prevents


RAY = "8f1e2d3c4b5a6978-LHR"
FRESH = r"[0-9a-f]{12}-[0-9a-f]+"  # the isolate's own: its random prefix and a count


class AccessRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[tuple[int, dict[str, Any]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append((record.levelno, record.edgellm))  # type: ignore[attr-defined]


def answered(path: str, headers: dict[str, str], config: Config | None = None) -> tuple[Any, list[tuple[int, dict[str, Any]]]]:
    import asyncio

    from edgellm.app import handle
    from edgellm.http import Request

    log = logging.getLogger("edgellm.test.ids")
    handler, access = AccessRecords(), log.getChild("access")
    access.addHandler(handler)
    access.setLevel(logging.DEBUG)
    try:
        deps = Deps(config=config or Config(), ai=DescribedAI(), log=log)  # type: ignore[arg-type]
        response = asyncio.run(handle(Request("GET", "http://edge.test" + path, headers, b""), deps))
    finally:
        access.removeHandler(handler)
    return response, handler.seen


@pytest.mark.parametrize(("headers", "operator_id", "client_id"), [
    ({}, FRESH, None),
    ({"cf-ray": RAY}, RAY, None),
    ({"x-request-id": "client-1"}, FRESH, "client-1"),  # the client's id is kept beside, never in its place
    ({"x-request-id": "client-1", "cf-ray": RAY}, RAY, "client-1"),
    ({"x-request-id": RAY}, FRESH, RAY),  # a client naming another request's id does not take it
    ({"x-request-id": "has space", "cf-ray": RAY}, RAY, None),  # not one a log search can hold: dropped
    ({"cf-ray": "bad;ray"}, FRESH, None),
])
def test_the_operator_chooses_the_id_the_logs_key_on(headers: dict[str, str], operator_id: str, client_id: str | None) -> None:
    response, seen = answered("/healthz", headers)
    ((level, record),) = seen
    assert re.fullmatch(operator_id, response.headers["x-request-id"])
    assert record["request_id"] == response.headers["x-request-id"] and level == logging.INFO
    assert record["client_request_id"] == client_id


@pytest.mark.parametrize(("config", "headers", "status", "level"), [
    (Config(metrics_open=True), {}, 200, logging.DEBUG),  # an answered scrape: no line at INFO, as exporters do
    (Config(admin_token="adm"), {"authorization": "Bearer adm"}, 200, logging.DEBUG),
    (Config(admin_token="adm"), {"authorization": "Bearer wrong"}, 401, logging.INFO),  # a refused one is an access attempt
])
def test_an_answered_scrape_is_logged_below_info(config: Config, headers: dict[str, str], status: int, level: int) -> None:
    response, seen = answered("/metrics", headers, config)
    assert response.status == status
    assert [lv for lv, _ in seen] == [level]


def test_a_generation_the_edge_answers_is_counted_as_routed_to_the_edge() -> None:
    """Without origins every generation runs at the edge: `edgellm_routed_total{to="edge"}` counts
    it as it counts one that routing sent there."""
    import asyncio
    import json

    from edgellm.app import handle
    from edgellm.http import Request
    from edgellm_local.doubles.scripted import ScriptedAI

    deps = Deps(config=Config(open_access=True), ai=ScriptedAI(), log=logging.getLogger("edgellm.test.routed"))
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    for _ in range(2):
        response = asyncio.run(handle(Request("POST", "http://edge.test/v1/chat/completions", {"content-type": "application/json"}, body), deps))
        assert response.status == 200, response.body
    routed = {s[1]["to"]: s[2] for f in families(deps) if f.name == "edgellm_routed" for s in f.samples}
    assert routed == {"edge": 2, "origin": 0}


@pytest.mark.parametrize(("route", "cache", "expected"), [
    ("edge; reason=primary", "MISS", {"edge": 1, "origin": 0}),
    ("origin; reason=edge-timeout; origin=a", "MISS", {"edge": 0, "origin": 1}),
    ("edge, origin; reason=mid-stream; origin=a", "BYPASS", {"edge": 1, "origin": 1}),  # a fallback ran at both
    ("edge; reason=primary", "HIT", {"edge": 0, "origin": 0}),  # a HIT generated nothing
])
def test_routed_counts_where_an_answer_was_generated(route: str, cache: str, expected: dict[str, int]) -> None:
    from edgellm.caller import Observation
    from edgellm.http import Request, Response
    from edgellm.app import ROUTES
    from edgellm.context import RequestContext
    from edgellm.pipeline.telemetry import request_ended

    deps = Deps(config=Config(), ai=DescribedAI(), log=logging.getLogger("edgellm.test.routed"))  # type: ignore[arg-type]
    request = Request("POST", "http://edge.test/v1/chat/completions", {}, b"")
    ctx = RequestContext(ROUTES, started=deps.clock.now(), route="/v1/chat/completions", handler="create_chat_completion",
                         observed=Observation("@cf/m", cache, route=route))
    request_ended(request, ctx, Response(200), deps)
    assert deps.state.telemetry.routed == expected


def test_the_dashboard_takes_rate_per_isolate_and_aggregates_after() -> None:
    """`rate()` of a counter is right only per series (per isolate); every panel sums after, so
    no panel plots one line per isolate or adds counters of different isolates before the rate."""
    import json
    from pathlib import Path

    dashboard = json.loads((Path(__file__).resolve().parents[2] / "grafana" / "edgellm-dashboard.json").read_text())
    assert "isolate" in dashboard["description"] and "Analytics Engine" in dashboard["description"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for at in (m.start() for m in re.finditer(r"\brate\(", expr)):  # each rate() is the argument of an aggregation
                assert re.search(r"\b(sum|max|min|avg)(\s+(by|without)\s*\([^)]*\))?\s*\($", expr[:at]), (panel["title"], expr)
            assert "rate(" in expr or re.match(r"(sum|max|min|avg)\(", expr), (panel["title"], expr)
            assert not re.search(r"(sum|max|min|avg)(?: by \([^)]*\))? \(edgellm_\w+_total", expr)  # never a sum before the rate


async def test_the_workers_own_metrics_through_its_entrypoint_name_one_isolate(runtime: Any) -> None:
    """The Worker (src/entry.py over the real Workers SDK) serves `/metrics` with its own writer:
    the 0.0.4 content type, and every series labelled with the one isolate that answered, the same
    on every scrape of that isolate (the local edge's are held the same in tests/edge)."""
    from tests.unit.test_workers_sdk import Platform, PlatformAI

    rt, entry = runtime
    platform = Platform(rt, entry, PlatformAI(), METRICS_OPEN="true")
    seen = []
    for _ in range(2):
        native = await platform.fetch({}, url="https://edge.example/metrics", method="GET")
        assert native.status == 200 and native.headers.get("content-type") == "text/plain; version=0.0.4; charset=utf-8"
        text = (await native.bytes()).decode()
        seen.append({s.labels.get("isolate") for f in text_string_to_metric_families(text) for s in f.samples})
        await platform.settle()
    assert seen[0] == seen[1] and len(seen[0]) == 1 and re.fullmatch(r"[0-9a-f]{8}", next(iter(seen[0])) or "")


def test_a_fresh_isolate_exposes_zeros_and_statuses_of_one_class_add_up() -> None:
    deps = Deps(config=Config(), ai=DescribedAI())  # type: ignore[arg-type]
    fresh = {(s[0], tuple(sorted((k, v) for k, v in s[1].items() if k != "isolate"))): s[2]
             for f in families(deps) for s in [(f.name + x[0], x[1], x[2]) for x in f.samples]}
    assert fresh[("edgellm_r2_errors_total", ())] == 0 and fresh[("edgellm_breaker_opened_total", ())] == 0
    assert fresh[("edgellm_admission_refusals_total", ())] == 0 and fresh[("edgellm_cache_hits_total", ())] == 0
    for status in (200, 204, 201, 499, 400):  # statuses of one class: one series
        deps.state.telemetry.count_request("/v1/chat/completions", "@cf/m", "", status)
    (requests,) = [f for f in families(deps) if f.name == "edgellm_requests"]
    assert [(labels["status"], value) for _, labels, value in requests.samples] == [("2xx", 3.0), ("4xx", 2.0)]


@pytest.mark.parametrize(("value", "spelled"), [(math.inf, "+Inf"), (-math.inf, "-Inf"), (math.nan, "NaN"), (1, "1.0"), (0.25, "0.25"),
                                                (-2.5, "-2.5")])
def test_numbers_are_spelled_as_prometheus_spells_them(value: float, spelled: str) -> None:
    assert go_float(value) == spelled


def test_help_text_with_a_backslash_or_a_line_break_reads_back_as_written() -> None:
    help_text = "a \\ backslash, a literal \\n, and a\nbreak"
    text, _ = TextExposition().render([Family("edgellm_x", "gauge", help_text, [("", {}, 1.0)])])
    (family,) = text_string_to_metric_families(text.decode())
    assert family.documentation == help_text


def test_the_breaker_gauge_is_one_for_its_state_only() -> None:
    deps = busy_deps()
    states = {s[1]["state"]: s[2] for f in families(deps) if f.name == "edgellm_breaker_state" for s in f.samples}
    assert states == {"closed": 1.0, "half_open": 0.0, "open": 0.0}
    for now in ("open", "half_open"):
        from types import SimpleNamespace

        deps.state.routing.breaker = SimpleNamespace(state=now, opened_count=2)  # type: ignore[assignment]
        states = {s[1]["state"]: s[2] for f in families(deps) if f.name == "edgellm_breaker_state" for s in f.samples}
        assert states == {s: float(s == now) for s in ("closed", "half_open", "open")}


@pytest.mark.parametrize("described", [RuntimeError("engine gone"), {"slots": {}}, {"slots": "busy"}, {}])
def test_an_engine_that_cannot_say_its_load_never_fails_a_scrape(described: Any) -> None:
    class Engine:
        def describe(self, model: str, *, live: bool = False) -> dict[str, Any]:
            if isinstance(described, Exception):
                raise described
            return described

    deps = Deps(config=Config(), ai=Engine())  # type: ignore[arg-type]
    text, _ = TextExposition().render(families(deps))
    names = {f.name: f for f in text_string_to_metric_families(text.decode())}
    if described == {"slots": {}}:  # slots said, counts not: zeros
        assert [s.value for s in names["edgellm_slots_busy"].samples] == [0.0]
        assert [s.value for s in names["edgellm_num_requests_waiting"].samples] == [0.0]
        assert [s.value for s in names["edgellm_slots"].samples] == [0.0]
    else:
        assert "edgellm_slots_busy" not in names and "edgellm_requests" in names


def test_histogram_sums_and_token_counts_start_from_zero() -> None:
    h = Histogram()
    for value in (0.5, 2.0):
        h.observe(value)
    assert h.total == 2.5 and h.count == 2
    t = Telemetry()
    t.count_tokens("@cf/m", "acme", 12, 7)
    assert t.prompt_tokens == {("@cf/m", "acme"): 12} and t.generation_tokens == {("@cf/m", "acme"): 7}


def test_the_buckets_run_from_a_millisecond_to_a_minute_as_the_docs_say() -> None:
    assert TIME_BUCKETS[0] == 0.001 and TIME_BUCKETS[-1] == 60.0
    assert list(TIME_BUCKETS) == sorted(set(TIME_BUCKETS))
