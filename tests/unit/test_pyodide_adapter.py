"""The Pyodide adapter's own logic, run under CPython over the real `workers` SDK, with only
what lies under it stood in (`tests/support/fake_pyodide`).

Each test pins one documented runtime behaviour the adapter must respect (workers-runtime.md):
misses are `jsnull`, options objects and bytes need `to_js`, errors arrive as `JsException`,
responses are the SDK's `workers.Response`.
"""

from __future__ import annotations

import asyncio
import email.message
import importlib
from types import SimpleNamespace
from typing import Any

import pytest

from edgellm.ports import BindingError, CapacityExceeded, InvalidModelInput, KVLimitError, ModelNotFound, R2Range
from tests.support import fake_pyodide as fp


@pytest.fixture
def adapter():
    with fp.installed():
        from edgellm.runtime import (pyodide, pyodide_ai, pyodide_bindings, pyodide_env, pyodide_kv, pyodide_native, pyodide_r2,
                                     pyodide_ratelimit, pyodide_usage)

        yield SimpleNamespace(pyodide=pyodide, ai=pyodide_ai, bindings=pyodide_bindings, env=pyodide_env, kv=pyodide_kv,
                              native=pyodide_native, r2=pyodide_r2, ratelimit=pyodide_ratelimit, usage=pyodide_usage)


class FakeAIBinding:
    def __init__(self, result: Any = None, error: str | None = None) -> None:
        self.result, self.error, self.calls = result, error, []

    async def run(self, model: str, inputs: Any) -> Any:
        self.calls.append((model, fp.require_js_object(inputs)))
        if self.error:
            raise fp.JsException(self.error)
        return self.result


async def test_ai_inputs_are_js_objects_and_results_dicts(adapter) -> None:
    binding = FakeAIBinding(fp.JsDict({"response": "Paris", "usage": {"prompt_tokens": 3}}))
    ai = adapter.ai.WorkersAI(binding)
    result = await ai.run("@cf/m", {"messages": [{"role": "user", "content": "hi"}], "temperature": 0})
    assert result["response"] == "Paris"
    model, inputs = binding.calls[0]
    assert model == "@cf/m" and inputs["temperature"] == 0
    assert isinstance(inputs["messages"][0], fp.JsObject)  # nested dicts converted too


@pytest.mark.parametrize("message,error", [
    ("InferenceUpstreamError: 5007: No such model @cf/meta/gone or task", ModelNotFound),
    ("AiError: 5006: Input validation error: /temperature must be <= 5", InvalidModelInput),
    ("InferenceUpstreamError: 3040: Capacity temporarily exceeded, please try again.", CapacityExceeded),
    ("InferenceUpstreamError: 3043: Internal server error", BindingError),
])
async def test_ai_errors_map_to_binding_errors(adapter, message: str, error: type) -> None:
    ai = adapter.ai.WorkersAI(FakeAIBinding(error=message))
    with pytest.raises(error) as info:
        await ai.run("@cf/m", {"prompt": "x"})
    assert type(info.value) is error and message in str(info.value)


async def test_ai_stream_is_read_from_the_js_stream_as_sse(adapter) -> None:
    stream = fp.FakeReadableStream(chunks=[b'data: {"response":"Pa"}\n\ndata: {"resp', b'onse":"ris"}\n\n', b"data: [DONE]\n\n"])
    binding = FakeAIBinding(stream)
    events = await adapter.ai.WorkersAI(binding).stream("@cf/m", {"prompt": "x"})
    assert [e["response"] async for e in events] == ["Pa", "ris"]
    assert binding.calls[0][1]["stream"] is True
    assert stream.reader.released  # closed at [DONE] by the code still awaiting, not by the GC


async def test_closing_an_ai_stream_early_cancels_and_releases_the_reader(adapter) -> None:
    stream = fp.FakeReadableStream(chunks=[b'data: {"response":"a"}\n\n'] * 50 + [b"data: [DONE]\n\n"])
    events = await adapter.ai.WorkersAI(FakeAIBinding(stream)).stream("@cf/m", {"prompt": "x"})
    assert (await anext(events))["response"] == "a"
    await events.aclose()
    assert stream.reader.cancelled and stream.reader.released
    assert not stream.cancelled  # once read, the reader that holds the stream cancels it, once; the stream is not cancelled again


async def test_closing_an_ai_stream_before_its_first_read_cancels_the_js_stream(adapter) -> None:
    """A client gone before the first token: no reader was ever taken, and the binding's stream
    must still be told to stop (`cancel`), not left to the garbage collector."""
    stream = fp.FakeReadableStream(chunks=[b'data: {"response":"a"}\n\n'] * 50 + [b"data: [DONE]\n\n"])
    events = await adapter.ai.WorkersAI(FakeAIBinding(stream)).stream("@cf/m", {"prompt": "x"})
    await events.aclose()
    await events.aclose()
    assert stream.cancelled and stream.reader is None


async def test_an_ai_stream_cut_before_done_is_a_stream_cut_error(adapter) -> None:
    from edgellm.ports import StreamCutError

    stream = fp.FakeReadableStream(chunks=[b'data: {"response":"a"}\n\n'])
    events = await adapter.ai.WorkersAI(FakeAIBinding(stream)).stream("@cf/m", {"prompt": "x"})
    with pytest.raises(StreamCutError):
        [e async for e in events]
    assert stream.reader.released


def test_a_stream_opened_by_one_request_fails_when_another_reads_it(adapter) -> None:
    """The stand-in runtime enforces request isolation as workerd does."""
    from edgellm_local.emulator import isolation
    from edgellm_local.emulator.isolation import CrossRequestIOError, request_context

    async def main() -> None:
        with request_context("A"):
            stream = fp.FakeReadableStream(chunks=[b'data: {"response":"a"}\n\n', b"data: [DONE]\n\n"])
        events = await adapter.ai.WorkersAI(FakeAIBinding(stream)).stream("@cf/m", {"prompt": "x"})
        with request_context("B"):
            with pytest.raises(CrossRequestIOError):
                await asyncio.ensure_future(anext(events))

    isolation.run(main())


async def test_a_client_leaving_closes_the_cores_body(adapter) -> None:
    from edgellm.http import Response

    closed = []

    async def body():
        try:
            for i in range(100):
                yield f"data: {i}\n\n".encode()
        finally:
            closed.append(True)

    native = adapter.native.to_native_response(Response(200, {"content-type": "text/event-stream"}, body()))
    chunks = native.body.source
    await anext(chunks)
    await chunks.aclose()  # what GeneratorExit from ReadableStream.from_ amounts to
    assert closed == [True]


class FakeKVBinding:
    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, Any]] = {}
        self.kinds: list[Any] = []  # what each read asked for: "arrayBuffer", or {type, cacheTtl}

    async def getWithMetadata(self, key: str, kind: Any) -> Any:  # noqa: N802 (JS name)
        self.kinds.append(kind if isinstance(kind, str) else fp.require_js_object(kind))
        if key not in self.data:
            return SimpleNamespace(value=fp.jsnull, metadata=fp.jsnull)
        value, metadata = self.data[key]
        return SimpleNamespace(value=fp.Uint8Array(value), metadata=fp.JsDict(metadata) if metadata else fp.jsnull)

    async def put(self, key: str, value: Any, options: Any) -> None:
        assert isinstance(value, fp.Uint8Array), "bytes must go through to_js"
        opts = fp.require_js_object(options)
        if opts.get("expirationTtl", 60) < 60:
            raise fp.JsException(f"KV PUT failed: 400 Invalid expiration_ttl of {opts['expirationTtl']}. Expiration TTL must be at least 60.")
        self.data[key] = (value.data, opts.get("metadata"))


async def test_kv_miss_is_jsnull_and_values_round_trip(adapter) -> None:
    kv = adapter.kv.WorkersKV(FakeKVBinding())
    assert await kv.get("absent") is None
    await kv.put("k", b"\x00value", expiration_ttl=60, metadata={"model": "m"})
    entry = await kv.get("k")
    assert entry.value == b"\x00value" and entry.metadata == {"model": "m"}


async def test_kv_cache_ttl_goes_as_the_options_object_kv_reads(adapter) -> None:
    binding = FakeKVBinding()
    kv = adapter.kv.WorkersKV(binding)
    await kv.put("k", b"v", expiration_ttl=60)
    assert (await kv.get("k", cache_ttl=60)).value == b"v" and (await kv.get("k")).value == b"v"
    assert binding.kinds == [{"type": "arrayBuffer", "cacheTtl": 60}, "arrayBuffer"]  # unasked: the bare type, as before


async def test_kv_limit_errors_are_translated(adapter) -> None:
    kv = adapter.kv.WorkersKV(FakeKVBinding())
    with pytest.raises(KVLimitError, match="at least 60"):
        await kv.put("k", b"v", expiration_ttl=30)


class FakeR2Binding:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    async def get(self, key: str, options: Any) -> Any:
        self.calls.append(fp.require_js_object(options))
        return fp.jsnull


async def test_r2_options_are_js_objects_and_a_miss_is_none(adapter) -> None:
    binding = FakeR2Binding()
    r2 = adapter.r2.WorkersR2(binding)
    assert await r2.get("models/x/blobs/sha256-" + "0" * 64, range=R2Range(offset=2, length=3)) is None
    assert binding.calls[0]["range"] == {"offset": 2, "length": 3}


async def test_request_conversion_skips_oversized_bodies(adapter) -> None:
    headers = email.message.Message()
    headers["Content-Type"] = "application/json"
    headers["Content-Length"] = str(2 * 1024 * 1024)

    class NativeRequest:
        method, url = "POST", "https://edge.example/v1/chat/completions"

        def __init__(self) -> None:
            self.headers = headers

        async def bytes(self) -> bytes:
            raise AssertionError("an oversized body must not be read")

    request = await adapter.native.to_core_request(NativeRequest(), 1024 * 1024)
    assert request.header("content-type") == "application/json" and request.body == b""


async def test_streamed_responses_become_readable_streams_of_uint8arrays(adapter) -> None:
    from edgellm.http import Response

    async def body():
        yield b"data: 1\n\n"
        yield b"data: [DONE]\n\n"

    native = adapter.native.to_native_response(Response(200, {"content-type": "text/event-stream"}, body()))
    assert isinstance(native.body, fp.FakeReadableStream)
    chunks = [chunk async for chunk in native.body.source]
    assert all(isinstance(c, fp.Uint8Array) for c in chunks) and b"".join(c.data for c in chunks).endswith(b"[DONE]\n\n")
    plain = adapter.native.to_native_response(Response(404, {"content-type": "application/json"}, b"{}"))
    assert plain.status == 404 and await plain.bytes() == b"{}"


def test_config_reads_vars_from_env_attributes(adapter) -> None:
    env = SimpleNamespace(MODEL="@cf/meta/other", FALLBACK_MODELS="a,b", CACHE_CLASSES='{"news": 120}', ADMIN_TOKEN=fp.jsnull)
    config = adapter.bindings.Config.from_env(adapter.env.EnvMapping(env))
    assert config.model == "@cf/meta/other" and config.fallback_models == ("a", "b")
    assert config.cache_classes == {"news": 120} and config.admin_token is None


async def test_a_misconfigured_worker_answers_json_not_a_bare_500(adapter) -> None:
    class NativeRequest:
        method, url = "GET", "https://edge.example/healthz"
        headers = email.message.Message()

    env = SimpleNamespace(AI=object(), CACHE=fp.jsnull, ARTIFACTS=None, CACHE_CLASSES="news=300")
    ctx = SimpleNamespace(waitUntil=lambda aw: None)
    from edgellm.state import IsolateState

    native = await adapter.pyodide.fetch(NativeRequest(), env, ctx, IsolateState())
    error = __import__("json").loads(await native.bytes())["error"]
    assert native.status == 503 and native.headers["content-type"] == "application/json" and native.headers["retry-after"]
    # the message names the variable and what it accepts, not only the parser's exception
    # (every route and variable: tests/unit/test_worker_misconfigured.py)
    assert error["code"] == "worker_misconfigured" and "CACHE_CLASSES must be a JSON object" in error["message"]


async def test_a_binding_failing_while_the_worker_sets_up_keeps_its_text_in_the_log(adapter, monkeypatch, caplog) -> None:
    """A failure that is not a [vars] value the config refused (a binding's, the runtime's) is named
    by its type; its text (an internal path here) is in the log only."""
    class NativeRequest:
        method, url = "GET", "https://edge.example/healthz"
        headers = email.message.Message()

    def broken(*args, **kwargs):
        raise RuntimeError("JsException: binding AI at /srv/worker/internal-5d1e is gone")

    monkeypatch.setattr(adapter.pyodide, "build_deps", broken)
    from edgellm.state import IsolateState

    native = await adapter.pyodide.fetch(NativeRequest(), SimpleNamespace(), SimpleNamespace(waitUntil=lambda aw: None), IsolateState())
    error = __import__("json").loads(await native.bytes())["error"]
    assert native.status == 500 and error["code"] == "worker_setup_failed" and "RuntimeError" in error["message"]
    assert "/srv/worker/internal-5d1e" not in error["message"]
    assert any("/srv/worker/internal-5d1e" in record.getMessage() or "/srv/worker/internal-5d1e" in (record.exc_text or "")
               or (record.exc_info and "/srv/worker/internal-5d1e" in str(record.exc_info[1])) for record in caplog.records)


def test_vars_are_parsed_once_per_isolate_and_a_jsnull_kv_is_no_kv(adapter) -> None:
    from edgellm.state import IsolateState

    state = IsolateState()
    env = SimpleNamespace(AI=object(), CACHE=fp.jsnull, ARTIFACTS=None, MODEL="@cf/a")
    ctx = SimpleNamespace(waitUntil=lambda aw: None)
    first = adapter.bindings.build_deps(env, ctx, state)
    env.MODEL = "@cf/b"
    second = adapter.bindings.build_deps(env, ctx, state)
    assert first.config is second.config and second.config.model == "@cf/a"
    assert first.kv is None and first.r2 is None and first.state is state


@pytest.mark.parametrize("message,error", [
    ("KV PUT failed: 429 Too Many Requests", "KVRateLimited"),
    ("KV PUT failed: 414 UTF-8 encoded length of 513 exceeds key length limit of 512.", "KVLimitError"),
    ("KV GET failed: 503 Service Unavailable (tried 404 times)", "BindingError"),
    ("network connection lost after 400 ms", "BindingError"),
])
def test_kv_errors_are_classified_by_their_status(adapter, message: str, error: str) -> None:
    assert type(adapter.kv.kv_error(fp.JsException(message))).__name__ == error


async def test_a_durable_object_stub_fetch_streams_the_answer(adapter) -> None:
    """Through the SDK's stub (`_DurableObjectNamespaceWrapper` -> `_FetcherWrapper` ->
    `workers.fetch`): the order goes as keywords, the streamed answer comes back read chunk by
    chunk from the JS body, and its reader is released at the end."""
    import workers

    from edgellm.cache.coalescing import FlightEvents
    from edgellm.http import Request, Response
    from edgellm.runtime import pyodide_durable

    seen: list[Any] = []

    class Answering(workers.DurableObject):
        async def fetch(self, request: Any) -> Any:
            seen.append((request.method, request.url, request.headers.get("content-type"), await request.bytes()))

            async def lines():
                for line in (b'{"token":"Pa"}\n{"tok', b'en":"ris"}\n', b'{"finish":"stop","usage":{}}\n'):
                    yield line

            return pyodide_durable.to_native_response(Response(200, {"content-type": "application/x-ndjson", "x-edgellm-model": "@cf/m"}, lines()))

    binding = fp.DurableObjectNamespace(Answering, fp.JsEnv())
    flights = workers._EnvWrapper(fp.JsEnv(FLIGHTS=binding)).FLIGHTS
    stub = pyodide_durable.WorkersDurableObjectNamespace(flights).get("cache/k|w|60")
    response = await stub.fetch(Request("POST", "https://flight.edgellm.internal/generate", {"content-type": "application/json"}, b"{}"))
    assert response.status == 200 and response.is_streaming and response.headers["x-edgellm-model"] == "@cf/m"
    assert seen == [("POST", "https://flight.edgellm.internal/generate", "application/json", b"{}")]
    assert list(binding.instances) == ["cache/k|w|60"]
    events = [e async for e in FlightEvents(response.body)]
    assert [getattr(e, "text", None) for e in events] == ["Pa", "ris", None]
    assert response.body.js_stream.reader.released


async def test_an_object_takes_an_order_larger_than_a_client_body(adapter) -> None:
    """A flight's order is the client's whole input (up to the Worker's 1 MiB) plus its key and
    route: the object must read it whole, not as an empty body."""
    from edgellm.config import MAX_BODY_BYTES
    from edgellm.http import Response
    from edgellm.runtime import pyodide_durable

    order = b"x" * (MAX_BODY_BYTES + 4096)
    seen: list[bytes] = []

    class Echo:
        async def fetch(self, request: Any) -> Response:
            seen.append(request.body)
            return Response(204)

    class NativeRequest:
        method, url = "POST", "https://flight.edgellm.internal/generate"
        headers = {"content-length": str(len(order))}
        js_object = SimpleNamespace()

        async def bytes(self) -> bytes:
            return order

    await pyodide_durable.serve_object(Echo(), NativeRequest())
    assert seen == [order]


class FakeRateLimit:
    def __init__(self, allow: int) -> None:
        self.allow, self.keys = allow, []

    async def limit(self, options: Any) -> Any:
        self.keys.append(fp.require_js_object(options)["key"])
        return fp.JsDict({"success": len(self.keys) <= self.allow})


class FakeDataset:
    def __init__(self) -> None:
        self.points: list[dict[str, Any]] = []

    def writeDataPoint(self, point: Any) -> None:  # noqa: N802 - the binding's own name
        self.points.append(fp.require_js_object(point))


async def test_rate_limit_and_usage_bindings_are_thin(adapter) -> None:
    from edgellm.ports import UsageEvent, UsageNotQueryable
    from edgellm.state import IsolateState

    limiter = adapter.ratelimit.WorkersRateLimit(FakeRateLimit(allow=1))
    assert [await limiter.limit("k1"), await limiter.limit("k1")] == [True, False]
    assert limiter.binding.keys == ["k1", "k1"]
    usage = adapter.usage.AnalyticsEngineUsage(FakeDataset())
    await usage.record(UsageEvent(1.0, "acme", "k1", "@cf/m", "/v1/chat/completions", "HIT", 3, 5, 1.5, 200))
    point = usage.binding.points[0]
    assert point["blobs"] == ["acme", "k1", "@cf/m", "/v1/chat/completions", "HIT", ""]  # the guardrails' verdicts last
    assert point["doubles"] == [3, 5, 1.5, 200] and point["indexes"] == ["acme"]
    env = SimpleNamespace(AI=object(), CACHE=None, ARTIFACTS=None, RATE_LIMITER=FakeRateLimit(5), USAGE=FakeDataset())
    deps = adapter.bindings.build_deps(env, SimpleNamespace(waitUntil=lambda aw: None), IsolateState())
    assert deps.rate_limiter is not None and deps.usage is not None
    bare = adapter.bindings.build_deps(SimpleNamespace(AI=object(), CACHE=None, ARTIFACTS=None, RATE_LIMITER=fp.jsnull),
                                      SimpleNamespace(waitUntil=lambda aw: None), IsolateState())
    assert bare.rate_limiter is None and bare.usage is None
    assert deps.usage.reader is None  # type: ignore[union-attr]  # no account or token: /admin/usage says it cannot query
    with pytest.raises(UsageNotQueryable):
        await deps.usage.query(0, 1, ())  # type: ignore[union-attr]
    reading = adapter.bindings.build_deps(
        SimpleNamespace(**vars(env), ANALYTICS_ACCOUNT_ID="acc123", ANALYTICS_API_TOKEN="tok", USAGE_DATASET="my_usage"),
        SimpleNamespace(waitUntil=lambda aw: None), IsolateState())
    reader = reading.usage.reader  # type: ignore[union-attr]
    assert (reader.account_id, reader.api_token, reader.dataset) == ("acc123", "tok", "my_usage")

    class Reader:
        async def query(self, *args: Any) -> list[dict[str, Any]]:
            return [{"asked": args}]

    assert await adapter.usage.AnalyticsEngineUsage(FakeDataset(), Reader()).query(0, 1, ("model",), "acme") == [{"asked": (0, 1, ("model",), "acme")}]
class FakeFetchResponse:
    def __init__(self, status: int, chunks: list[bytes]) -> None:
        self.status, self.headers = status, {"content-type": "text/event-stream"}
        self.body = FakeJsStream(chunks)


class FakeJsStream:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks, self.cancelled = list(chunks), False

    def getReader(self) -> "FakeJsStream":
        return self

    async def read(self) -> Any:
        if not self.chunks:
            return SimpleNamespace(done=True, value=None)
        return SimpleNamespace(done=False, value=fp.Uint8Array(self.chunks.pop(0)))

    async def cancel(self) -> None:
        self.cancelled = True

    def releaseLock(self) -> None:  # noqa: N802 (JS name): every real reader has it
        self.released = True


class FakeAbortController:
    def __init__(self) -> None:
        self.signal, self.aborted = object(), False

    @classmethod
    def new(cls) -> "FakeAbortController":
        return cls()

    def abort(self) -> None:
        self.aborted = True


async def test_origin_fetch_sends_a_js_init_and_streams_the_body(adapter) -> None:
    pyodide_fetch = importlib.import_module("edgellm.runtime.pyodide_fetch")  # this test's fake `js`, not a stale one

    sent: list[Any] = []

    async def fetch(url: str, init: Any) -> Any:
        sent.append((url, fp.require_js_object(init)))
        return FakeFetchResponse(200, [b"data: {}\n\n", b"data: [DONE]\n\n"])

    js = __import__("js")
    js.fetch, js.AbortController = fetch, FakeAbortController
    response = await pyodide_fetch.WorkersFetch().post("https://o/v1/chat/completions", b'{"a":1}', {"authorization": "Bearer t"}, 5)
    assert response.status == 200 and [c async for c in response.body] == [b"data: {}\n\n", b"data: [DONE]\n\n"]
    url, init = sent[0]
    assert url == "https://o/v1/chat/completions" and init["method"] == "POST" and init["body"] == '{"a":1}'
    assert init["headers"] == {"authorization": "Bearer t"}


@pytest.mark.parametrize("read", [0, 1], ids=["unread", "partly-read"])
async def test_an_origin_body_closed_early_cancels_the_js_stream(adapter, read: int) -> None:
    """The edge closes an origin's body when its client left, possibly before the first read:
    the connection is given back (`cancel`) either way, not when the garbage collector runs."""
    pyodide_fetch = importlib.import_module("edgellm.runtime.pyodide_fetch")
    answers: list[FakeFetchResponse] = []

    async def fetch(url: str, init: Any) -> Any:
        answers.append(FakeFetchResponse(200, [b"data: {}\n\n"] * 5 + [b"data: [DONE]\n\n"]))
        return answers[-1]

    js = __import__("js")
    js.fetch, js.AbortController = fetch, FakeAbortController
    response = await pyodide_fetch.WorkersFetch().post("https://o/v1/chat/completions", b"{}", {}, 5)
    for _ in range(read):
        await anext(response.body)
    await response.body.aclose()  # type: ignore[attr-defined]
    assert answers[0].body.cancelled


async def test_origin_fetch_failures_and_timeouts_are_fetch_errors(adapter) -> None:
    import asyncio

    from edgellm.ports import FetchError
    pyodide_fetch = importlib.import_module("edgellm.runtime.pyodide_fetch")  # this test's fake `js`, not a stale one

    js = __import__("js")
    controllers: list[FakeAbortController] = []

    class Recording(FakeAbortController):
        @classmethod
        def new(cls) -> "Recording":
            controllers.append(cls())
            return controllers[-1]

    async def refused(url: str, init: Any) -> Any:
        raise fp.JsException("TypeError: Network connection lost.")

    async def silent(url: str, init: Any) -> Any:
        await asyncio.Event().wait()

    js.AbortController = Recording
    js.fetch = refused
    with pytest.raises(FetchError, match="Network connection lost"):
        await pyodide_fetch.WorkersFetch().post("https://o", b"{}", {}, 5)
    js.fetch = silent
    with pytest.raises(FetchError, match="no response"):
        await pyodide_fetch.WorkersFetch().post("https://o", b"{}", {}, 0.01)
    assert controllers[-1].aborted  # the abandoned fetch is aborted, not left running


async def test_request_cf_country_and_continent_reach_the_core(adapter) -> None:
    # as workers.Request has it: `cf` only on the JS object underneath, not on the Python wrapper
    request = SimpleNamespace(method="GET", url="https://x/healthz", headers={},
                              js_object=SimpleNamespace(cf=SimpleNamespace(country="DE", continent="EU")))
    core = await adapter.native.to_core_request(request, 1024)
    assert core.cf == {"country": "DE", "continent": "EU"}
    bare = SimpleNamespace(method="GET", url="https://x/healthz", headers={}, js_object=SimpleNamespace())
    assert (await adapter.native.to_core_request(bare, 1024)).cf == {}


class CountingBucket(fp.JsR2Bucket):
    gets = 0

    async def get(self, key: str, options: Any) -> Any:
        self.gets += 1
        return await super().get(key, options)


async def test_r2_behind_the_cache_api_through_the_workers_adapters(adapter, tmp_path) -> None:
    """CachedBlobStore over WorkersR2 and WorkersEdgeCache: the first pinned read is copied into
    the Cache API (through a JS Response over the copy's stream), the next ones, ranges included,
    never reach the bucket."""
    from edgellm.artifacts.cached_store import CachedBlobStore
    from edgellm.ports import R2Conditional
    from edgellm_local.emulator.r2 import FileR2
    from tests.conftest import ManualClock

    data = bytes(range(256)) * 32
    bucket = CountingBucket(FileR2(tmp_path / "bucket", clock=ManualClock(), chunk_size=1000))
    copies: list[asyncio.Future[Any]] = []
    store = CachedBlobStore(adapter.r2.WorkersR2(bucket), adapter.r2.WorkersEdgeCache(),
                            wait_until=lambda aw: copies.append(asyncio.ensure_future(aw)))
    put = await store.put("models/m/blobs/a", data)
    pinned = R2Conditional(etag_matches=put.http_etag)

    async def read(**kwargs: Any) -> Any:
        obj = await store.get("models/m/blobs/a", only_if=pinned, **kwargs)
        return obj, b"".join([chunk async for chunk in obj.body])

    assert (await read())[1] == data
    await asyncio.gather(*copies)
    obj, whole = await read()
    part, piece = await read(range=R2Range(offset=100, length=50))
    assert whole == data and piece == data[100:150] and part.range == (100, 50)
    assert obj.etag == put.etag and bucket.gets == 1
