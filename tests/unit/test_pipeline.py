"""The pipeline (`app.LAYERS`): each layer entered once per request, in the list's order, learning
what the layers before it told the context; and the list as docs/architecture.md shows it."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from edgellm.app import LAYERS, ROUTES
from edgellm.config import Config
from edgellm.context import RequestContext
from edgellm.deps import Deps
from edgellm.http import Request, Response
from edgellm.pipeline import METHODS, Layer, Next, compose, dispatch, stacks, works_on
from edgellm.router import Router, route

from edgellm_local.doubles.scripted import ScriptedAI

ROOT = Path(__file__).resolve().parents[2]
CHAT = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()


def deps() -> Deps:
    return Deps(config=Config(open_access=True), ai=ScriptedAI(), kv=None, log=logging.getLogger("edgellm.test"))


def chat() -> Request:
    return Request("POST", "http://edge.test/v1/chat/completions", {"content-type": "application/json", "origin": "http://localhost:3000"}, CHAT)


def recorded(layer: Layer, entered: list[str], keep_declaration: bool = False) -> Layer:
    """`layer`, noting its name when entered; with `keep_declaration`, declaring the methods it
    declared (`only_for`), so `stacks` leaves it out where it leaves `layer` out."""

    def enter(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Any:
        entered.append(layer.__name__)  # type: ignore[attr-defined]
        return layer(call_next, request, deps, ctx)

    if keep_declaration and hasattr(layer, "methods"):
        enter.methods = layer.methods  # type: ignore[attr-defined]
    return enter


async def run(layers: tuple[Layer, ...], request: Request) -> Response:
    return await compose(layers, dispatch)(request, deps(), RequestContext(ROUTES))


async def test_each_layer_is_entered_once_per_request_in_the_lists_order() -> None:
    entered: list[str] = []
    pipeline = tuple(recorded(layer, entered) for layer in LAYERS)
    for _ in range(2):
        entered.clear()
        response = await run(pipeline, chat())
        assert response.status == 200
        assert entered == [layer.__name__ for layer in LAYERS]  # type: ignore[attr-defined]


async def test_a_preflight_is_answered_by_its_layer_and_enters_none_after_it() -> None:
    entered: list[str] = []
    request = Request("OPTIONS", "http://edge.test/v1/chat/completions", {"origin": "http://localhost:3000",
                                                                          "access-control-request-method": "POST"})
    response = await run(tuple(recorded(layer, entered) for layer in LAYERS), request)
    names = [layer.__name__ for layer in LAYERS]  # type: ignore[attr-defined]
    assert response.status == 204 and entered == names[: names.index("preflight") + 1]
    assert response.headers["access-control-allow-origin"] == "http://localhost:3000" and response.headers["x-request-id"]


@pytest.mark.parametrize("position", range(len(LAYERS) + 1))
async def test_a_layer_at_any_position_sees_what_the_layers_before_it_learned_and_after_it_did(position: int) -> None:
    """A recording layer put at each position: entered once; on the way in the context holds what
    the outer layers learned and nothing of the inner ones; on the way out the answer carries what
    the inner layers added and nothing of the outer ones."""
    outer = {layer.__name__ for layer in LAYERS[:position]}  # type: ignore[attr-defined]
    seen: list[tuple[RequestContext, dict[str, str]]] = []

    async def probe(call_next: Next, request: Request, deps: Deps, ctx: RequestContext) -> Response:
        learned = RequestContext(ctx.router, ctx.started, ctx.id, ctx.span, ctx.route, ctx.handler, ctx.endpoint, ctx.params, ctx.principal)
        response = await call_next(request, deps, ctx)
        seen.append((learned, dict(response.headers)))  # as it left the layers inside the probe
        return response

    layers = LAYERS[:position] + (probe,) + LAYERS[position:]
    response = await run(layers, chat())
    assert response.status == 200 and len(seen) == 1
    learned, headers = seen[0]
    assert bool(learned.id) == ("request_id" in outer)
    assert (learned.started > 0) == ("telemetry" in outer)
    assert (learned.endpoint is not None, learned.route) == (
        (True, "/v1/chat/completions") if "match" in outer else (False, "unmatched"))
    assert (learned.principal is not None) == ("authentication" in outer)
    assert ("x-request-id" in headers) == ("request_id" not in outer)
    assert ("access-control-allow-origin" in headers) == ("cors" not in outer)


async def test_an_error_inside_the_error_layer_is_an_answer_to_every_layer_outside_it() -> None:
    """The error layer is the one place an exception becomes an answer: the layers outside it (usage,
    telemetry) see a 404 response, the request id and CORS headers are on it."""
    request = Request("GET", "http://edge.test/v1/nowhere", {"origin": "http://localhost:3000"})
    entered: list[str] = []
    response = await run(tuple(recorded(layer, entered) for layer in LAYERS), request)
    assert response.status == 404 and json.loads(response.body)["error"]["request_id"] == response.headers["x-request-id"]
    assert response.headers["access-control-allow-origin"] == "http://localhost:3000"
    names = [layer.__name__ for layer in LAYERS]  # type: ignore[attr-defined]
    assert entered == names[: names.index("match") + 1]  # no caller is looked for on a route that is not there


def test_the_architecture_doc_shows_the_list_the_code_holds() -> None:
    """docs/architecture.md's pipeline block names the layers in `app.LAYERS`'s order."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = re.search(r"<!-- pipeline -->\n```\n(.*?)```", text, re.S)
    assert block is not None, "docs/architecture.md has no pipeline block"
    shown = [line.split()[0] for line in block.group(1).splitlines() if line.strip() and not line.startswith(" ")]
    assert shown == [layer.__name__ for layer in LAYERS] + ["handler"]  # type: ignore[attr-defined]


async def test_every_layers_way_out_shows_on_a_keyed_answer(caplog: pytest.LogCaptureFixture) -> None:
    """What each layer adds on the way out, on one keyed request through `app.handle`: the request
    id, CORS, the key's limits, its metrics, its log line (and the spent tokens the limits say)."""
    from edgellm.access.keys import KeyRing, new_key
    from edgellm.app import handle
    from edgellm_local.emulator.kv import SqliteKV

    kv = SqliteKV()
    made = new_key("acme", 0.0, tokens_per_minute=10_000)
    await KeyRing(kv).put(made.record)
    keyed = Deps(config=Config(), ai=ScriptedAI(), kv=kv, log=logging.getLogger("edgellm.test"))
    request = Request("POST", "http://edge.test/v1/chat/completions",
                      {"authorization": f"Bearer {made.api_key}", "origin": "http://localhost:3000"}, CHAT)
    with caplog.at_level(logging.INFO, logger="edgellm.test.access"):
        response = await handle(request, keyed)
    assert response.status == 200 and response.headers["x-request-id"]
    assert response.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert int(response.headers["x-ratelimit-remaining-tokens"]) < 10_000  # charged before the headers were made
    assert sum(n for (route, _, tenant, _), n in keyed.state.telemetry.requests.items() if route == "/v1/chat/completions") == 1
    lines = [r.edgellm for r in caplog.records if hasattr(r, "edgellm")]  # type: ignore[attr-defined]
    assert [(line["request_id"], line["tenant"], line["route"]) for line in lines] == [
        (response.headers["x-request-id"], "acme", "/v1/chat/completions")]


async def test_the_route_is_matched_before_a_credential_is_asked_for() -> None:
    """With keys required, a path no route serves is a 404 and a wrong method a 405 (with `Allow`),
    to a caller without a key: the match layer runs before authentication."""
    from edgellm.app import handle

    keyed = Deps(config=Config(), ai=ScriptedAI(), kv=None, log=logging.getLogger("edgellm.test"))
    missing = await handle(Request("POST", "http://edge.test/v1/nowhere", {}, b"{}"), keyed)
    assert missing.status == 404 and json.loads(missing.body)["error"]["code"] == "route_not_found"
    wrong = await handle(Request("DELETE", "http://edge.test/v1/chat/completions", {}, b""), keyed)
    assert wrong.status == 405 and "POST" in wrong.headers["allow"]
    assert (await handle(Request("POST", "http://edge.test/v1/chat/completions", {}, CHAT), keyed)).status == 401


class Ticking:
    """A clock that moves a quarter second on every read: two reads of one moment differ."""

    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def now(self) -> float:
        self.t += 0.25
        return self.t


class Rows:
    """A usage sink that keeps its rows."""

    def __init__(self) -> None:
        self.rows: list[Any] = []

    def record_now(self, event: Any) -> None:
        self.rows.append(event)

    async def record(self, event: Any) -> None:
        self.rows.append(event)

    async def query(self, start: float, end: float, group_by: tuple[str, ...], tenant: str | None = None) -> list[dict[str, Any]]:
        return []

    async def tokens_spent(self, key_id: str) -> int:
        return 0


async def test_a_request_ends_at_one_time_for_its_usage_row_its_metrics_and_its_log_line(caplog: pytest.LogCaptureFixture) -> None:
    """The usage record reads the clock when the answer is whole; the metrics and the log line,
    told right after, take that time: one request, one duration, wherever it is read."""
    from edgellm.app import handle

    rows = Rows()
    clocked = Deps(config=Config(open_access=True), ai=ScriptedAI(), kv=None, clock=Ticking(), usage=rows,  # type: ignore[arg-type]
                   log=logging.getLogger("edgellm.test"))
    with caplog.at_level(logging.INFO, logger="edgellm.test.access"):
        response = await handle(chat(), clocked)
    assert response.status == 200
    [row] = rows.rows
    [line] = [r.edgellm for r in caplog.records if hasattr(r, "edgellm")]  # type: ignore[attr-defined]
    [latency] = list(clocked.state.telemetry.latency.values())
    assert latency.count == 1 and latency.total > 0
    assert (row.latency_ms, line["ms"]) == (round(latency.total * 1000, 3), round(latency.total * 1000, 1))


@pytest.mark.parametrize(("path", "origin"), [
    ("/v1/chat/completions", None), ("/v1/chat/completions", "http://localhost:3000"), ("/v1/chat/completions", "https://elsewhere.example"),
    ("/models/m/resolve/main/x.gguf", None), ("/models/m/resolve/main/x.gguf", "https://elsewhere.example"), ("/healthz", None),
])
async def test_the_cors_layer_adds_what_cors_headers_says(path: str, origin: str | None) -> None:
    """The layer's way for a request without an `Origin` is `cors_headers`' answer, not another."""
    from edgellm.access.cors import cors_headers
    from edgellm.pipeline.cors import cors

    async def answer(request: Request, deps: Deps, ctx: RequestContext) -> Response:
        return Response(200, {}, b"")

    request = Request("GET", f"http://edge.test{path}", {"origin": origin} if origin else {})
    response = await compose((cors,), answer)(request, deps(), RequestContext(ROUTES))
    assert response.headers == dict(cors_headers(request, deps().config))


@pytest.mark.parametrize(("size", "declared"), [
    (10, None), (11, None), (0, "10"), (0, "11"), (0, "0011"), (10, "9"), (0, ""), (0, "abc"), (0, "-20"), (0, "1e3"), (11, "1"),
])
async def test_the_body_size_layer_refuses_what_refuse_oversized_refuses(size: int, declared: str | None) -> None:
    """The layer reads `refuse_oversized`'s rule itself (every request passes it): it refuses
    exactly the requests that function refuses, as its 413."""
    from edgellm.errors import GatewayError
    from edgellm.pipeline.body_size import body_size
    from edgellm.validation import refuse_oversized

    async def answer(request: Request, deps: Deps, ctx: RequestContext) -> Response:
        return Response(200)

    limited = Deps(config=Config(open_access=True, max_body_bytes=10), ai=ScriptedAI(), kv=None, log=logging.getLogger("edgellm.test"))
    request = Request("POST", "http://edge.test/v1/chat/completions", {} if declared is None else {"content-length": declared}, b"x" * size)
    try:
        refuse_oversized(request, 10)
        expected = None
    except GatewayError as error:
        expected = error.code
    try:
        await compose((body_size,), answer)(request, limited, RequestContext(ROUTES))
        refused = None
    except GatewayError as error:
        refused = error.code
    assert refused == expected and (expected is None) == (size <= 10 and declared in (None, "10", "9", "", "abc", "-20", "1e3"))


@pytest.mark.parametrize(("origins", "regions"), [((), {}), ((), {"EU": "x"}), (("http://origin.test",), {})])
async def test_a_request_has_a_span_when_an_origin_may_be_sent_its_trace(origins: tuple[str, ...], regions: dict[str, str]) -> None:
    """With no tracer recording, the request id layer makes a span only when origins are
    configured (the one call that carries the trace on, as `traceparent`), whatever else routing has."""
    from edgellm.pipeline.request_id import request_id
    from edgellm.routing.config import OriginConfig, RegionConfig, RoutingConfig

    spans: list[Any] = []

    async def answer(request: Request, deps: Deps, ctx: RequestContext) -> Response:
        spans.append(ctx.span)
        return Response(200)

    routing = RoutingConfig(origins=tuple(OriginConfig(f"o{i}", url) for i, url in enumerate(origins)),
                            regions={name: RegionConfig(name) for name in regions})
    routed = Deps(config=Config(open_access=True, routing=routing), ai=ScriptedAI(), kv=None, log=logging.getLogger("edgellm.test"))
    response = await compose((request_id,), answer)(chat(), routed, RequestContext(ROUTES))
    assert response.headers["x-request-id"] and (spans[0] is not None) == bool(origins)


async def _any(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    return Response(200, {}, b"{}")


ANY_METHOD = Router((route(("GET", "POST", "PUT", "PATCH", "DELETE", "PROPFIND"), "/x", _any),))


@pytest.mark.parametrize("method", [*METHODS, "PROPFIND"])
async def test_each_methods_stack_enters_every_layer_with_work_on_it_in_the_lists_order(method: str) -> None:
    """`stacks` leaves a layer out only of the stacks of the methods it declared no work for
    (`only_for`: HEAD's body for `head`, OPTIONS for `preflight`); every other layer is in every
    method's stack, a method no stack was made for included, in the list's order."""
    entered: list[str] = []
    by_method, other = stacks(tuple(recorded(layer, entered, keep_declaration=True) for layer in LAYERS), dispatch)
    request = Request(method, "http://edge.test/x", {"origin": "http://localhost:3000", "access-control-request-method": "GET"})
    response = await by_method.get(method, other)(request, deps(), RequestContext(ANY_METHOD))
    only = {"head": "HEAD", "preflight": "OPTIONS"}  # what the two declare (the next test holds it)
    names = [layer.__name__ for layer in LAYERS if only.get(layer.__name__, method) == method]  # type: ignore[attr-defined]
    if method == "OPTIONS":  # answered by its layer: none after it entered
        assert response.status == 204 and entered == names[: names.index("preflight") + 1]
    else:
        assert response.status == 200 and entered == names
    assert [works_on(layer, method) for layer in LAYERS] == [only.get(layer.__name__, method) == method for layer in LAYERS]  # type: ignore[attr-defined]
    assert response.headers["x-request-id"] and response.headers["vary"] == "Origin"


def test_only_head_and_preflight_declare_methods_and_the_app_runs_its_stacks() -> None:
    """The layers that declare their methods (the rest have work on every request), and
    `app.handle` serves each request with its method's stack."""
    from edgellm import app

    declared = {layer.__name__: set(layer.methods) for layer in LAYERS if hasattr(layer, "methods")}  # type: ignore[attr-defined]
    assert declared == {"head": {"HEAD"}, "preflight": {"OPTIONS"}}
    assert app._BY_METHOD.keys() >= set(METHODS) and app._OTHER_METHODS is not app._BY_METHOD["POST"]


@pytest.mark.parametrize(("name", "method"), [(layer.__name__, method) for layer in LAYERS if hasattr(layer, "methods")  # type: ignore[attr-defined]
                                              for method in [*METHODS, "PROPFIND"] if method not in layer.methods])  # type: ignore[attr-defined]
def test_a_layer_that_declares_its_methods_passes_every_other_on_untouched(name: str, method: str) -> None:
    """What `only_for` says is true: on another method's request the layer only hands it on, so
    leaving it out of that method's stack changes nothing."""
    layer = next(layer for layer in LAYERS if layer.__name__ == name)  # type: ignore[attr-defined]
    ctx = RequestContext(ROUTES)
    before = repr(ctx)
    passed = object()
    request = Request(method, "http://edge.test/v1/chat/completions", {"access-control-request-method": "POST"})
    assert layer(lambda request, deps, ctx: passed, request, deps(), ctx) is passed  # type: ignore[arg-type,return-value]
    assert repr(ctx) == before


def test_the_contexts_own_init_takes_every_field_with_its_default() -> None:
    """`RequestContext` writes its `__init__` by hand (one is made per request); a field added to
    the class and not to it would be unset (a slot) until a layer read it and failed."""
    import dataclasses
    import inspect

    params = list(inspect.signature(RequestContext.__init__).parameters.values())[1:]
    fields = dataclasses.fields(RequestContext)
    assert [p.name for p in params] == [f.name for f in fields]
    defaults = [f.default_factory() if f.default is dataclasses.MISSING else f.default for f in fields[1:]]  # type: ignore[misc]  # after the router
    assert [p.default for p in params[1:]] == defaults
    ctx = RequestContext(ROUTES)
    assert [getattr(ctx, f.name) for f in fields[1:]] == defaults
