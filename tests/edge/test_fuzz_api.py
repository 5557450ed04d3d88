"""Property-based fuzzing of the real local edge, driven by `public/openapi.json`.

Schemathesis turns the document into Hypothesis strategies of valid and invalid requests
(bodies, including bytes that are not JSON, and every documented header); artifact paths and
their conditional headers come from strategies of our own, since the document's `path` spans
segments that schemathesis would percent-encode. For every answer:

- no 5xx: the binding is healthy, so every refusal is the caller's and must be a 4xx;
- the status is one the document lists for the operation, and every 4xx is the error shape;
- the body (JSON, or each SSE event) and the documented headers conform to the document.

Deterministic (derandomized, no example database) and bounded: generated `max_tokens` are kept
small so that valid requests finish in milliseconds on the tiny model.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import string
import time
from typing import Any, Callable, Iterator, Mapping

import httpx
import jsonschema
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, example, given, settings, strategies as st
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from schemathesis import GenerationMode

from edgellm.config import Config
from edgellm.sse import SSEDecoder
from edgellm_local.edge import DEFAULT_PUBLIC
from edgellm_local.hub.manifest import Manifest, ModelFile, Shard
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.emulator.usage_sqlite import SqliteUsage

DOC_URI = "urn:edgellm:openapi"
ADMIN_TOKEN = "fuzz-admin-token"
SMALL_MAX_TOKENS = 8
MAX_PRELOAD_ITEMS = 2
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    # no shrinking: every attempt is a request to a real edge (up to its client timeout), so a
    # shrink could outlast the per-test timeout and hide the failure; the first failing example
    # is reported as found
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.filter_too_much, HealthCheck.data_too_large],
)

# Wall-clock seconds one POST route's fuzzing may take, well inside the 300 s per-test timeout (one
# 30 s client timeout and the edge's start fit beside it): under a CPU hog (load 14) 150 examples
# of the chat route alone took over 300 s. Past it, the examples left are not sent; a hang is still
# a failure, since every request has its 30 s client timeout.
POST_BUDGET_SECONDS = 180.0


class OutOfTime(Exception):
    """The route's fuzzing budget is spent: stop sending examples (not a failure)."""


POST_ROUTES = {  # template -> examples
    "/v1/chat/completions": 150,
    "/v1/completions": 120,
    "/client/v4/accounts/{account_id}/ai/run/{model}": 150,
    "/admin/cache/preload": 80,
    "/admin/cache/purge": 80,
    "/v1/responses": 100,
}
GET_ROUTES = ["/v1/models", "/healthz", "/models", "/admin/cache/stats", "/admin/usage"]

MODEL = "tiny"
BLOB = bytes(range(256)) * 8
BLOB_SHA256 = hashlib.sha256(BLOB).hexdigest()
# built with the manifest's own dataclasses, so the fixture is a manifest `edgellm pull` accepts
MANIFEST = Manifest(
    name=MODEL,
    model=ModelFile("tiny.gguf", len(BLOB), BLOB_SHA256),
    shard_size=len(BLOB),
    shards=(Shard(0, 0, len(BLOB), BLOB_SHA256, f"blobs/sha256-{BLOB_SHA256}"),),
    files=(),
)


# --- the document ------------------------------------------------------------------------


class OpenAPIDoc:
    """The served document, and conformance checks of responses against it."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.registry = Registry().with_resource(DOC_URI, DRAFT202012.create_resource(doc))

    def resolve(self, node: dict[str, Any], pointer: str) -> tuple[dict[str, Any], str]:
        while "$ref" in node:
            pointer = node["$ref"][1:]
            node = self.at(pointer)
        return node, pointer

    def at(self, pointer: str) -> Any:
        node: Any = self.doc
        for part in pointer.lstrip("/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def validate(self, instance: Any, pointer: str) -> None:
        jsonschema.Draft202012Validator({"$ref": f"{DOC_URI}#{pointer}"}, registry=self.registry).validate(instance)

    def check(self, template: str, method: str, status: int, headers: Mapping[str, str], body: bytes) -> None:
        described = f"{method.upper()} {template} -> {status} {body[:400]!r}"
        assert status < 500, f"a healthy edge answered 5xx: {described}"
        path_item = self.at(f"/paths/{_escape(template)}")
        op_pointer = f"/paths/{_escape(template)}/{method if method in path_item else 'get'}"  # HEAD is GET without a body
        responses = self.at(op_pointer)["responses"]
        assert str(status) in responses, f"undocumented status: {described}"
        documented, pointer = self.resolve(responses[str(status)], f"{op_pointer}/responses/{status}")
        for name, header in documented.get("headers", {}).items():
            header, header_pointer = self.resolve(header, f"{pointer}/headers/{_escape(name)}")
            value = headers.get(name.lower())
            assert value is not None or not header.get("required"), f"missing {name}: {described}"
            if value is not None:
                schema = header["schema"]
                self.validate(int(value) if schema.get("type") == "integer" else value, f"{header_pointer}/schema")
        if method == "head" or status == 304:
            assert body == b"", described
            return
        media_type = headers.get("content-type", "").split(";")[0].strip()
        content = documented.get("content", {})
        assert media_type in content, f"undocumented content type {media_type!r}: {described}"
        schema_pointer = f"{pointer}/content/{_escape(media_type)}/schema"
        if 400 <= status < 500:
            error = json.loads(body)["error"]
            assert set(error) == {"message", "type", "param", "code", "request_id"} and error["message"], described
        if media_type == "application/json" and status != 206:  # a byte range of JSON is not JSON
            self.validate(json.loads(body), schema_pointer)
        elif media_type == "text/event-stream":
            self.check_events(body, content[media_type]["x-event-schemas"], described)

    def check_events(self, body: bytes, event_schemas: list[str], described: str) -> None:
        decoder = SSEDecoder()
        events = [*decoder.feed(body), *decoder.flush()]
        assert events, described
        for data in events[:-1]:
            self.validate_any(json.loads(data), event_schemas, described)
        last = events[-1]
        if last == "[DONE]":
            return
        final = json.loads(last)
        if isinstance(final.get("type"), str) and final["type"].startswith(("response.", "error")):
            # the Responses event stream has no [DONE]: it ends with its terminal event
            self.validate_any(final, event_schemas, described)
            assert final["type"] in ("response.completed", "response.incomplete", "response.failed", "error"), described
        else:  # a chat or Workers AI stream that failed after it started ends with an error event
            assert "error" in final, described

    def validate_any(self, instance: Any, pointers: list[str], described: str) -> None:
        errors = []
        for ref in pointers:
            try:
                return self.validate(instance, ref[1:])
            except jsonschema.ValidationError as exc:
                errors.append(exc.message)
        raise AssertionError(f"SSE event {instance!r} matches no documented event ({errors}): {described}")


def lower(headers: Mapping[str, Any]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


def _escape(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


@pytest.fixture(scope="module")
def openapi() -> OpenAPIDoc:
    return OpenAPIDoc(json.loads((DEFAULT_PUBLIC / "openapi.json").read_text()))


@pytest.fixture(scope="module")
def schema(openapi: OpenAPIDoc) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_dict(openapi.doc)


@pytest.fixture
def fuzz_edge(start_edge: Callable[..., EdgeServer]) -> EdgeServer:
    """A local edge with the admin routes on and one published model in its R2."""
    edge = start_edge(config=Config(admin_token=ADMIN_TOKEN, open_access=True), usage=SqliteUsage())
    r2 = edge.app.deps.r2
    assert r2 is not None and edge.loop is not None

    async def publish() -> None:
        await r2.put(f"models/{MODEL}/manifest.json", json.dumps(MANIFEST.to_json()).encode())
        await r2.put(f"models/{MODEL}/blobs/sha256-{_sha256(BLOB)}", BLOB)

    asyncio.run_coroutine_threadsafe(publish(), edge.loop).result(10)
    return edge


@pytest.fixture
def session() -> Iterator[requests.Session]:
    with requests.Session() as s:
        yield s


def _sha256(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


# --- generated requests ------------------------------------------------------------------


def keep_small(value: Any, top: bool = True) -> Any:
    """Valid token budgets anywhere in a body (preload items too) made small, so generation is
    fast; invalid ones (0, 8193, strings) are kept, since rejecting them is under test. A budget
    left out or sent as `null` (valid for `max_tokens`: the default, 256) is made small too: under a CPU hog one
    such request took the whole 30 s client timeout (CI failed on `"max_tokens": null` and on
    Responses bodies, whose `max_output_tokens` this once left alone)."""
    if isinstance(value, list):
        return [keep_small(v, top=False) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: keep_small(v, top=False) for k, v in value.items()}
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        v = out.get(name)
        if name in out and v is None and name != "max_output_tokens" or isinstance(v, (int, float)) and not isinstance(v, bool) and SMALL_MAX_TOKENS < v <= 8192:
            out[name] = SMALL_MAX_TOKENS
    if "messages" in out or "prompt" in out:
        out.setdefault("max_tokens", SMALL_MAX_TOKENS)  # the default, 256, is valid but slow to fuzz with
    if top and "input" in out:  # a Responses body (only at the top: `input` may name a schema's property)
        out.setdefault("max_output_tokens", SMALL_MAX_TOKENS)
    if isinstance(out.get("requests"), list):
        out["requests"] = out["requests"][:MAX_PRELOAD_ITEMS]
    return out


def within_edge_rules(body: dict[str, Any]) -> dict[str, Any]:
    """A positive case held to the rules the edge adds to the document's types, which the
    document states in prose (ChatMessage's description) and a generator cannot read: content is
    null only on an assistant turn that called tools, only an assistant turn carries tool calls,
    a tool message names its call, `parallel_tool_calls` only beside `tools`. Without this, most
    positive cases of the preload route were 400s and a 200 was luck."""
    for message in body.get("messages") if isinstance(body.get("messages"), list) else []:
        if not isinstance(message, dict):
            continue
        if message.get("role") != "assistant":
            message.pop("tool_calls", None)
        if message.get("content") is None and not message.get("tool_calls"):
            message["content"] = "Hi"
        if message.get("role") == "tool" and not message.get("tool_call_id"):
            message["tool_call_id"] = "call_1"
    if not body.get("tools"):
        body.pop("parallel_tool_calls", None)
    return body


@st.composite
def streaming_and_caching(draw: st.DrawFn, *, preload: bool) -> dict[str, Any]:
    """Valid bodies leave optional members out most of the time; streams and cache hits are
    where the interesting code is, so ask for them often."""
    extra: dict[str, Any] = {}
    # deterministic: cached, so repeats are HITs replayed from KV. A preload item must be (else
    # the whole call is a 400), and one item in two left random made a 200 a matter of luck.
    if preload or draw(st.booleans()):
        extra["temperature"] = 0
    if not preload and draw(st.booleans()):
        extra["stream"] = True
        extra["stream_options"] = {"include_usage": draw(st.booleans())}
    return extra


def auth_headers() -> st.SearchStrategy[dict[str, str]]:
    return st.sampled_from([
        {"Authorization": f"Bearer {ADMIN_TOKEN}"}, {"Authorization": f"bearer  {ADMIN_TOKEN}"},
        {}, {"Authorization": "Bearer wrong"}, {"Authorization": ADMIN_TOKEN}, {"Authorization": "Basic eDp5"},
    ])


def post_cases(schema: schemathesis.BaseSchema, template: str) -> st.SearchStrategy[tuple[Any, dict[str, str]]]:
    operation = schema[template]["POST"]
    case = st.one_of(operation.as_strategy(generation_mode=GenerationMode.POSITIVE).map(lambda c: (c, True)),
                     operation.as_strategy(generation_mode=GenerationMode.NEGATIVE).map(lambda c: (c, False)))

    @st.composite
    def fuzzed(draw: st.DrawFn) -> tuple[Any, dict[str, str]]:
        c, valid = draw(case)
        if valid and isinstance(c.body, dict):
            items = c.body.get("requests") if template == "/admin/cache/preload" else [c.body]
            for item in items if isinstance(items, list) else []:
                if isinstance(item, dict):
                    within_edge_rules(item).update(draw(streaming_and_caching(preload=item is not c.body)))
        if isinstance(c.body, (dict, list)):
            c.body = keep_small(c.body)
        if c.path_parameters and "model" in c.path_parameters:  # now and then a model that exists
            c.path_parameters["model"] = draw(st.sampled_from([*Config().models, c.path_parameters["model"]]))
        headers = draw(auth_headers()) if template.startswith("/admin/") else {}
        return c, headers

    return fuzzed()


@pytest.mark.parametrize("template", list(POST_ROUTES))
def test_post_routes_never_fail_and_answer_as_documented(
    template: str, schema: schemathesis.BaseSchema, openapi: OpenAPIDoc, fuzz_edge: EdgeServer, session: requests.Session
) -> None:
    statuses: set[int] = set()
    stop_at = time.monotonic() + POST_BUDGET_SECONDS

    @settings(FUZZ, max_examples=POST_ROUTES[template])
    @given(post_cases(schema, template))
    def run(fuzzed: tuple[Any, dict[str, str]]) -> None:
        if time.monotonic() > stop_at:
            raise OutOfTime
        case, headers = fuzzed
        # sent by hand: schemathesis' own transport stops reading an event stream after a few events
        response = session.request(**case.as_transport_kwargs(base_url=fuzz_edge.url, headers=headers), timeout=30)
        openapi.check(template, "post", response.status_code, lower(response.headers), response.content)
        statuses.add(response.status_code)

    try:
        run()
    except OutOfTime:
        pass
    # the fuzzing reached both sides: some requests answered, some rejected
    assert 200 in statuses and any(400 <= s < 500 for s in statuses), statuses


@pytest.mark.parametrize("template", GET_ROUTES)
def test_get_routes_answer_as_documented(
    template: str, openapi: OpenAPIDoc, fuzz_edge: EdgeServer
) -> None:
    query = st.dictionaries(st.text(string.ascii_letters, min_size=1, max_size=5), st.text(max_size=8), max_size=3)

    @settings(FUZZ, max_examples=15)
    @given(method=st.sampled_from(["get", "head"]), params=query, headers=auth_headers())
    def run(method: str, params: dict[str, str], headers: dict[str, str]) -> None:
        response = httpx.request(method.upper(), fuzz_edge.url + template, params=params, headers=headers)
        openapi.check(template, method, response.status_code, lower(response.headers), response.content)

    run()


# --- artifact paths ----------------------------------------------------------------------

# Characters a request target may carry on the wire (h11 accepts any visible ASCII); `?` and `#`
# would start a query or fragment, so they are left out.
PATH_CHARS = "".join(c for c in string.printable if c.isprintable() and c not in " ?#")
SEGMENT = st.text(PATH_CHARS.replace("/", ""), max_size=10)
NAMES = st.one_of(st.just(MODEL), st.sampled_from(["", ".", "..", "Tiny", "a" * 65, "-x", "tiny..x", "%74iny"]),
                  st.from_regex(r"[a-z0-9][a-z0-9._-]{0,8}", fullmatch=True), SEGMENT)
FILES = st.one_of(
    st.sampled_from(["manifest.json", "tokenizer.json", "tokenizer_config.json", "config.json", f"blobs/sha256-{_sha256(BLOB)}",
                     f"blobs/sha256-{_sha256(BLOB).upper()}", "blobs/sha256-abc", "blobs/", "manifest.json/", "blobs/x/y",
                     "blobs/%2e%2e", "..%2fmanifest.json", "manifest.json%00", "blobs\\sha256-0"]),
    st.lists(SEGMENT, max_size=3).map("/".join),
)
ARTIFACT_PATHS = st.one_of(st.builds(lambda n, f: f"{n}/{f}", NAMES, FILES), st.text(PATH_CHARS, max_size=30))
HEADER_TEXT = st.text(string.printable.strip() + " ", max_size=24).map(str.strip)


def range_headers(size: int) -> st.SearchStrategy[str]:
    n = st.integers(0, size + 10)
    return st.one_of(
        st.builds("bytes={}-{}".format, n, n), st.builds("bytes={}-".format, n), st.builds("bytes=-{}".format, n),
        st.sampled_from(["bytes=0-0,5-9", "bytes=", "bytes=-", "items=0-1", "bytes=5-1", f"bytes={size}-", "bytes=-0",
                         "bytes=99999999999999999999999-"]),
        HEADER_TEXT,
    )


def etag_headers(etag: str) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from([etag, f"W/{etag}", "*", f'"x", {etag}', '"other"', etag.strip('"'), "", ","]), HEADER_TEXT)


def test_artifact_paths_and_conditional_headers_answer_as_documented(openapi: OpenAPIDoc, fuzz_edge: EdgeServer) -> None:
    template = "/models/{path}"
    blob_path = f"/models/{MODEL}/blobs/sha256-{_sha256(BLOB)}"
    etag = httpx.head(fuzz_edge.url + blob_path).headers["etag"]
    assert Manifest.parse(httpx.get(fuzz_edge.url + f"/models/{MODEL}/manifest.json").content) == MANIFEST
    optional = lambda strategy: st.one_of(st.none(), strategy)  # noqa: E731
    seldom = lambda strategy: st.one_of(st.none(), st.none(), st.none(), strategy)  # noqa: E731
    statuses: set[int] = set()

    with httpx.Client() as client:

        blob = blob_path.removeprefix("/models/")

        @settings(FUZZ, max_examples=200)
        @example("get", blob, "bytes=10-19", None, None)  # 206
        @example("get", blob, f"bytes={len(BLOB)}-", None, None)  # 416
        @example("get", blob, "bytes=10-19", etag, None)  # 304
        @example("get", blob, "bytes=10-19", None, '"stale"')  # If-Range mismatch: 200
        @given(method=st.sampled_from(["get", "head"]), path=st.one_of(st.just(f"{MODEL}/blobs/sha256-{_sha256(BLOB)}"), ARTIFACT_PATHS),
               range_=optional(range_headers(len(BLOB))), if_none_match=seldom(etag_headers(etag)),
               if_range=seldom(etag_headers(etag)))
        def run(method: str, path: str, range_: str | None, if_none_match: str | None, if_range: str | None) -> None:
            headers = {k: v for k, v in (("range", range_), ("if-none-match", if_none_match), ("if-range", if_range)) if v is not None}
            url = httpx.URL(fuzz_edge.url).copy_with(raw_path=f"/models/{path}".encode())
            response = client.request(method.upper(), url, headers=headers)
            openapi.check(template, method, response.status_code, lower(response.headers), response.content)
            statuses.add(response.status_code)
            if method == "get" and path.endswith(_sha256(BLOB)) and response.status_code in (200, 206):
                whole = response.status_code == 200
                first = 0 if whole else int(response.headers["content-range"].split()[1].split("-")[0])
                assert response.content == (BLOB if whole else BLOB[first:first + len(response.content)])

        run()
    assert {200, 206, 304, 400, 404, 416} <= statuses, statuses
