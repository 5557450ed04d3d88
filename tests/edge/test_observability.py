"""Observability through the local edge's real HTTP server: request ids on every answer, one
structured log line per request, `/metrics` read by `prometheus_client`'s own parser and moving
with traffic, and spans recorded by the OpenTelemetry SDK (an in-memory exporter), parent to child.
The model is the tiny GGUF: tests assert fields, counts and shapes, never wording."""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import replace
from typing import Any, Callable, Iterator

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from edgellm.app import ROUTES
from edgellm.config import Config
from edgellm.telemetry.exposition import TextExposition, families
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.telemetry import OtelTracer
from tests.prometheus_oracle import PrometheusExposition

ADMIN = "metrics-admin"
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
FRESH_ID = r"[0-9a-f]{12}-[0-9a-f]+"  # the isolate's random prefix, then its count


def chat(content: str = "Hello there", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0, **extra}


class Records(logging.Handler):
    """The access records as they are logged; `wait(n)` returns once n have been (an event, no sleep)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[dict[str, Any]] = []
        self.messages: list[str] = []
        self.changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self.changed:
            self.records.append(record.edgellm)  # type: ignore[attr-defined]
            self.messages.append(record.getMessage())
            self.changed.notify_all()

    def wait(self, count: int, timeout: float = 30) -> list[dict[str, Any]]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.records) >= count, timeout), self.records
            return list(self.records)


@pytest.fixture
def records() -> Iterator[Records]:
    handler = Records()
    logger = logging.getLogger("edgellm.test.access")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(previous)


def metrics_of(text: str) -> dict[str, Any]:
    """`/metrics` as `prometheus_client`'s parser reads it: family name -> family."""
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample_value(families: dict[str, Any], family: str, sample: str, **labels: str) -> float:
    matching = [s.value for s in families[family].samples if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    return sum(matching)


def test_every_answer_carries_a_request_id_and_errors_name_it(start_edge: Callable[..., EdgeServer]) -> None:
    server = start_edge(kv=None)
    with httpx.Client(base_url=server.url, timeout=60) as client:
        ok = client.post("/v1/chat/completions", json=chat())
        assert ok.status_code == 200 and re.fullmatch(FRESH_ID, ok.headers["x-request-id"])
        again = client.post("/v1/chat/completions", json=chat())
        assert again.headers["x-request-id"] != ok.headers["x-request-id"]  # a new id per request
        for sent in ("client-id:42.a_b", "has space", "x" * 129, "semi;colon"):  # a client's own id never becomes the operator's
            fresh = client.get("/healthz", headers={"x-request-id": sent}).headers["x-request-id"]
            assert fresh != sent and re.fullmatch(FRESH_ID, fresh)
        ray = client.get("/healthz", headers={"cf-ray": "8f2a1b3c4d5e6f70-AMS", "x-request-id": "mine"})
        assert ray.headers["x-request-id"] == "8f2a1b3c4d5e6f70-AMS"  # Cloudflare's ray id, when one came
        bad = client.post("/v1/chat/completions", json={"messages": "nope"}, headers={"x-request-id": "find-me-1"})
        assert bad.status_code == 400 and re.fullmatch(FRESH_ID, bad.headers["x-request-id"])
        assert bad.json()["error"]["request_id"] == bad.headers["x-request-id"]  # the body names it too
        missing = client.get("/v1/nowhere")
        assert missing.status_code == 404 and missing.json()["error"]["request_id"] == missing.headers["x-request-id"]
        rest = client.post("/client/v4/accounts/acct/ai/run/@cf/nope/nope", json={"prompt": "hi"})
        assert rest.status_code >= 400 and rest.json()["success"] is False  # Cloudflare's envelope, and the id
        assert rest.json()["error"]["request_id"] == rest.headers["x-request-id"]
        page = client.get("/chat")
        assert page.status_code == 200 and re.fullmatch(FRESH_ID, page.headers["x-request-id"])
        preflight = client.options("/v1/chat/completions", headers={"origin": server.url, "access-control-request-method": "POST"})
        assert "x-request-id" in preflight.headers["access-control-expose-headers"]  # a browser client may read it


def test_one_json_line_per_request_with_its_fields_and_never_the_prompt(start_edge: Callable[..., EdgeServer], records: Records) -> None:
    server = start_edge()
    secret = "my secret prompt text"
    with httpx.Client(base_url=server.url, timeout=60) as client:
        miss = client.post("/v1/chat/completions", json=chat(secret), headers={"x-request-id": "line-1", "traceparent": TRACEPARENT})
        hit = client.post("/v1/chat/completions", json=chat(secret))
        with client.stream("POST", "/v1/chat/completions", json=chat("a streamed one", stream=True)) as streamed:
            streamed_id = streamed.headers["x-request-id"]
            body = streamed.read()
        bad = client.post("/v1/chat/completions", json={"messages": []})
    assert (miss.headers["cf-aig-cache-status"], hit.headers["cf-aig-cache-status"], bad.status_code) == ("MISS", "HIT", 400)
    assert b"[DONE]" in body
    lines = {r["request_id"]: r for r in records.wait(4)}
    first = lines[miss.headers["x-request-id"]]
    assert first["client_request_id"] == "line-1"  # the client's own id, beside the operator's
    assert first["trace_id"] == CLIENT_TRACE  # the client's trace
    assert (first["status"], first["cache"], first["route"], first["handler"], first["tenant"]) == (
        200, "MISS", "/v1/chat/completions", "create_chat_completion", "default")
    assert first["model"] == Config().model and first["prompt_tokens"] > 0 and 0 < first["completion_tokens"] <= 8
    assert 0 <= first["ttft_ms"] <= first["ms"]
    answered = miss.json()["usage"]
    assert (first["prompt_tokens"], first["completion_tokens"]) == (answered["prompt_tokens"], answered["completion_tokens"])
    second = lines[hit.headers["x-request-id"]]
    assert second["cache"] == "HIT" and second["model"] == first["model"]
    stream_line = lines[streamed_id]  # written when the stream ended: its tokens are known
    assert stream_line["completion_tokens"] > 0 and stream_line["ttft_ms"] is not None and stream_line["ttft_ms"] <= stream_line["ms"]
    refused = lines[bad.headers["x-request-id"]]
    assert refused["status"] == 400 and refused["model"] is None and re.fullmatch(r"[0-9a-f]{32}", refused["trace_id"])
    assert all(json.loads(m) == r for m, r in zip(records.messages, records.records))  # the line is the record's JSON
    assert not any(secret in m or "streamed one" in m for m in records.messages)
    assert all("prompt" not in r for r in records.records)


def test_log_prompts_puts_the_prompt_in_the_line(start_edge: Callable[..., EdgeServer], records: Records) -> None:
    server = start_edge(config=Config(open_access=True, log_prompts=True), kv=None)
    httpx.post(server.url + "/v1/chat/completions", json=chat("say the magic words"), timeout=60)
    (line,) = records.wait(1)
    assert "say the magic words" in line["prompt"]


def families_now(client: httpx.Client, **headers: str) -> dict[str, Any]:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"  # what the text is, as the client labels it
    return metrics_of(response.text)


def parsed(text: str) -> list[tuple[str, str, list[tuple[str, tuple[tuple[str, str], ...], float]]]]:
    return sorted((f.name, f.type, sorted((s.name, tuple(sorted(s.labels.items())), s.value) for s in f.samples))
                  for f in text_string_to_metric_families(text))


def test_metrics_parse_and_move_with_traffic_and_every_label_is_bounded(start_edge: Callable[..., EdgeServer]) -> None:
    """Served by the edge's own writer (the Worker's too), parsed by `prometheus_client`'s parser,
    and the same real edge's families read back the same from the writer and from the client's
    own rendering (the oracle)."""
    server = start_edge(config=Config(open_access=True, metrics_open=True))
    model = Config().model
    with httpx.Client(base_url=server.url, timeout=60) as client:
        before = families_now(client)
        assert sample_value(before, "edgellm_requests", "edgellm_requests_total") == 0
        secret = "a prompt that must never be a label"
        miss = client.post("/v1/chat/completions", json=chat(secret))
        hit = client.post("/v1/chat/completions", json=chat(secret))
        bad = client.post("/v1/chat/completions", json={"messages": "nope"})
        client.get("/v1/responses/resp_0123456789abcdef")  # a path with an id: its template is the label
        assert (miss.headers["cf-aig-cache-status"], hit.headers["cf-aig-cache-status"], bad.status_code) == ("MISS", "HIT", 400)
        after = families_now(client)
    route = {"route": "/v1/chat/completions"}
    assert sample_value(after, "edgellm_requests", "edgellm_requests_total", status="2xx", model=model, **route) == 2
    assert sample_value(after, "edgellm_requests", "edgellm_requests_total", status="4xx", model="", **route) == 1
    assert sample_value(after, "edgellm_requests", "edgellm_requests_total", route="/v1/responses/{response_id}") == 1
    assert sample_value(after, "edgellm_cache_hits", "edgellm_cache_hits_total") == 1
    assert sample_value(after, "edgellm_cache_misses", "edgellm_cache_misses_total") == 1
    usage = miss.json()["usage"]  # the HIT counts no tokens
    assert sample_value(after, "edgellm_prompt_tokens", "edgellm_prompt_tokens_total", model=model, tenant="default") == usage["prompt_tokens"]
    assert sample_value(after, "edgellm_generation_tokens", "edgellm_generation_tokens_total", model=model) == usage["completion_tokens"]
    for histogram in ("edgellm_time_to_first_token_seconds", "edgellm_e2e_request_latency_seconds"):
        assert after[histogram].type == "histogram"
        assert sample_value(after, histogram, histogram + "_count", model=model, served_by="edge") == 1
        assert sample_value(after, histogram, histogram + "_count", model=model, served_by="cache") == 1
        inf = sample_value(after, histogram, histogram + "_bucket", served_by="edge", le="+Inf")
        assert inf == 1
    assert sample_value(after, "edgellm_routed", "edgellm_routed_total", to="edge") == 1  # the MISS; the HIT generated nothing
    assert after["edgellm_num_requests_running"].samples[0].value == 0  # every generation has ended
    isolate = server.app.deps.state.telemetry.isolate
    assert {s.labels.get("isolate") for f in after.values() for s in f.samples} == {isolate}  # one bounded value, on every series
    real = families(server.app.deps)  # the Worker's writer on a real edge's metrics, against the client's rendering
    assert parsed(TextExposition().render(real)[0].decode()) == parsed(PrometheusExposition().render(real)[0].decode())
    assert {s.labels["state"] for s in after["edgellm_breaker_state"].samples} == {"closed", "half_open", "open"}
    # bounded labels: routes are templates, models served ones, never the prompt, a path with an id, a key or a URL
    allowed = {"route": {r.template for r in ROUTES.routes} | {"unmatched", "workers-ai"},
               "model": {"", model}, "tenant": {"", "default"}, "status": {"1xx", "2xx", "3xx", "4xx", "5xx"},
               "served_by": {"cache", "edge", "origin", "fallback"}, "isolate": {isolate}}
    for family in after.values():
        for sample in family.samples:
            assert secret not in json.dumps(sample.labels) and "resp_0123" not in json.dumps(sample.labels)
            for name, value in sample.labels.items():
                if name in allowed:
                    assert value in allowed[name], (sample.name, name, value)


def test_metrics_are_behind_the_admin_token_unless_open(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Any]) -> None:
    import asyncio

    from edgellm.access.keys import KeyRing, new_key

    deps = make_deps(config=Config(admin_token=ADMIN))
    tenant_key = new_key("acme", 0)
    asyncio.run(KeyRing(deps.kv).put(tenant_key.record))
    closed = start_edge(deps)
    assert httpx.get(closed.url + "/metrics").status_code == 401
    assert httpx.get(closed.url + "/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
    as_tenant = httpx.get(closed.url + "/metrics", headers={"authorization": f"Bearer {tenant_key.api_key}"})
    assert as_tenant.status_code == 403 and as_tenant.json()["error"]["code"] == "admin_only"  # a key, known as one: not a bad token
    ok = httpx.get(closed.url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"})
    assert ok.status_code == 200 and "edgellm_requests" in metrics_of(ok.text)
    assert httpx.get(closed.url + "/healthz").json()["metrics_open"] is False
    off = start_edge(config=Config(open_access=True), kv=None)  # no admin token: the route answers as absent
    refused = httpx.get(off.url + "/metrics")
    assert refused.status_code == 404 and "admin token" in refused.json()["error"]["message"]
    opened = start_edge(config=Config(open_access=True, metrics_open=True), kv=None)
    assert httpx.get(opened.url + "/metrics").status_code == 200 and httpx.get(opened.url + "/healthz").json()["metrics_open"] is True
    assert httpx.get(opened.url + "/metrics", headers={"authorization": "Bearer el-nosuchkey000.abc"}).status_code == 200  # open is open


@pytest.fixture
def spans() -> Iterator[tuple[OtelTracer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield OtelTracer(provider), exporter
    provider.shutdown()


def test_an_otlp_exporter_sees_one_requests_spans_parent_to_child(start_edge: Callable[..., EdgeServer], spans: Any, records: Records) -> None:
    tracer, exporter = spans
    server = start_edge(tracer=tracer)
    response = httpx.post(server.url + "/v1/chat/completions", json=chat("trace me"), headers={"traceparent": TRACEPARENT}, timeout=60)
    assert response.status_code == 200 and response.headers["cf-aig-cache-status"] == "MISS"
    records.wait(1)  # the request's span ends with its log line
    server.drain()  # the KV write behind the answer
    finished = exporter.get_finished_spans()
    by_name = {s.name: s for s in finished}
    assert {"POST /v1/chat/completions", "cache.lookup", "cache.flight", "cache.write"} <= set(by_name), sorted(by_name)
    generation = next((s for s in finished if s.name.startswith("chat ")), None)
    assert generation is not None, sorted(by_name)
    root = by_name["POST /v1/chat/completions"]
    assert {format(s.context.trace_id, "032x") for s in finished} == {CLIENT_TRACE}  # one trace: the client's
    assert format(root.parent.span_id, "016x") == CLIENT_SPAN  # the request span is the client span's child
    ids = {s.context.span_id: s for s in finished}

    def ancestors(span: Any) -> list[str]:
        chain = []
        while span.parent is not None and span.parent.span_id in ids:
            span = ids[span.parent.span_id]
            chain.append(span.name)
        return chain

    for name in ("cache.lookup", "cache.flight", "cache.write"):
        assert "POST /v1/chat/completions" in ancestors(by_name[name]), (name, ancestors(by_name[name]))
    assert ancestors(generation)[-1] == "POST /v1/chat/completions" and "cache.flight" in ancestors(generation)
    attributes = generation.attributes
    usage = response.json()["usage"]
    assert attributes["gen_ai.request.model"] == Config().model and attributes["gen_ai.response.model"] == Config().model
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert attributes["gen_ai.operation.name"] == "chat" and attributes["gen_ai.request.max_tokens"] == 8
    assert root.attributes["http.response.status_code"] == 200 and root.attributes["http.route"] == "/v1/chat/completions"
    assert root.attributes["edgellm.request_id"] == response.headers["x-request-id"]
    assert all("trace me" not in json.dumps(dict(s.attributes)) for s in finished)  # never the prompt


def test_a_request_without_traceparent_starts_a_trace(start_edge: Callable[..., EdgeServer], spans: Any) -> None:
    tracer, exporter = spans
    server = start_edge(tracer=tracer, kv=None)
    httpx.post(server.url + "/v1/chat/completions", json=chat(), headers={"traceparent": "00-" + "0" * 32 + "-" + CLIENT_SPAN + "-01"}, timeout=60)
    (root,) = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/chat/completions"]
    assert root.parent is None and root.context.trace_id != 0  # an invalid traceparent is a new trace


@pytest.mark.parametrize("coalesced", [False, True], ids=["own-generation", "through-the-flights-object"])
def test_the_origin_receives_the_requests_trace_with_a_span_id_of_its_own(
        start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Any], tiny_model: Any, tmp_path: Any, coalesced: bool) -> None:
    """With a KV namespace a miss runs in the flights object, which on Cloudflare is another
    isolate: the trace reaches the origin only because the Worker sends it along."""
    from edgellm_local.doubles.faults import FaultPlan, FaultyAI
    from edgellm_local.emulator.http_fetch import HttpxFetch
    from tests.support.origin_process import OriginProcess

    origin = OriginProcess.start(tiny_model, tmp_path)
    try:
        config = Config.from_env({"ORIGINS": json.dumps([{"name": "central", "url": origin.url, "context_window": 2048}]),
                                  "OPEN_ACCESS": "true", "METRICS_OPEN": "true", "EDGE_FIRST_TOKEN_MS": "60000", "EDGE_STALL_MS": "60000"})
        deps = make_deps(config=config)
        deps = replace(deps, ai=FaultyAI(deps.ai, FaultPlan(fail=1.0)), fetch=HttpxFetch())  # the edge fails: the origin answers
        if not coalesced:
            deps = replace(deps, kv=None)
        server = start_edge(deps)
        with httpx.Client(base_url=server.url, timeout=60) as client:
            answered = client.post("/v1/chat/completions", json=chat(), headers={"traceparent": TRACEPARENT})
            assert answered.status_code == 200 and answered.headers["x-edgellm-route"].startswith("origin")
            fresh = client.post("/v1/chat/completions", json=chat("no trace sent"))
            families = families_now(client)
        sent = [r["traceparent"] for r in origin.generation_requests()]
        assert len(sent) == 2
        version, trace_id, span_id, flags = sent[0].split("-")
        assert (version, trace_id, flags) == ("00", CLIENT_TRACE, "01") and span_id != CLIENT_SPAN and re.fullmatch(r"[0-9a-f]{16}", span_id)
        started = sent[1].split("-")[1]
        assert re.fullmatch(r"[0-9a-f]{32}", started) and started != CLIENT_TRACE  # a request without one got a trace of its own
        assert fresh.status_code == 200
        latency = "edgellm_e2e_request_latency_seconds"
        assert sample_value(families, latency, latency + "_count", served_by="origin") == 2
        assert sample_value(families, "edgellm_routed", "edgellm_routed_total", to="origin") == 2
        # the origin is `edgellm dev` on loopback: its /metrics is open, through prometheus_client, with its engine's slots
        at_origin = metrics_of(httpx.get(origin.url + "/metrics", timeout=30).text)
        assert sample_value(at_origin, "edgellm_requests", "edgellm_requests_total", route="/v1/chat/completions", status="2xx") == 2
        assert sample_value(at_origin, "edgellm_slots", "edgellm_slots") >= 1
        assert sample_value(at_origin, "edgellm_slots_busy", "edgellm_slots_busy") == 0
    finally:
        origin.stop()
