"""The Worker and its Durable Objects over the REAL Workers Python SDK (`workers-runtime-sdk`).

`src/entry.py`'s classes are the SDK's `WorkerEntrypoint` / `DurableObject` subclasses, the
Worker reaches its objects through the SDK's `_DurableObjectNamespaceWrapper` and `_FetcherWrapper`
(whose `fetch` is `workers.fetch`: keyword options, a `workers.Response` back), and every Response
is the SDK's. Only what lies under the SDK is stood in (`tests/support/fake_pyodide.py`: `js`,
`pyodide.ffi`, `pyodide.http`, the platform's JS objects and contexts).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from edgellm_local.emulator.kv import SqliteKV
from tests.support import fake_pyodide as fp

MODEL = "@cf/meta/llama-2-7b-chat-int8"
URL = "https://edge.example/v1/chat/completions"


class PlatformAI:
    """The `Ai` binding as the adapter meets it: `run(model, inputs, *options)`, a JS object back,
    or a JS ReadableStream of SSE for `stream: true` ([notes] "A stream from the AI binding
    (`stream: true`) is a JS ReadableStream"). `gate` holds a stream before its last token."""

    def __init__(self, words: tuple[str, ...] = ("Pa", "ris")) -> None:
        self.words, self.calls = words, 0
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def run(self, model: str, inputs: Any, *options: Any) -> Any:
        opts = fp.to_plain(fp.require_js_object(inputs))
        self.calls += 1
        self.started.set()
        usage = {"prompt_tokens": 3, "completion_tokens": len(self.words), "total_tokens": 3 + len(self.words)}
        if not opts.get("stream"):
            if self.gate is not None:
                try:
                    await self.gate.wait()
                except asyncio.CancelledError:
                    self.cancelled.set()
                    raise
            return fp.JsDict({"response": "".join(self.words), "usage": usage})
        return fp.FakeReadableStream(self._events(usage))

    async def _events(self, usage: dict[str, int]) -> Any:
        try:
            for i, word in enumerate(self.words):
                if i == len(self.words) - 1 and self.gate is not None:
                    await self.gate.wait()
                yield f'data: {json.dumps({"response": word})}\n\n'.encode()
            yield f'data: {json.dumps({"response": "", "usage": usage})}\n\ndata: [DONE]\n\n'.encode()
        finally:
            if self.gate is not None and not self.gate.is_set():
                self.cancelled.set()


class Platform:
    """One deployment: the Worker's env and ctx, a FLIGHTS and a CONVERSATIONS namespace
    hosting `entry.Flight` / `entry.Conversation` with envs of their own."""

    def __init__(self, rt: Any, entry: Any, ai: PlatformAI, **vars: str) -> None:
        self.rt, self.entry, self.ai = rt, entry, ai
        self.kv = SqliteKV(":memory:")
        settings = {"MODEL": MODEL, "OPEN_ACCESS": "true", **vars}
        self.env = fp.JsEnv(AI=ai, CACHE=fp.JsKVNamespace(self.kv), **settings)
        object_env = fp.JsEnv(AI=ai, CACHE=fp.JsKVNamespace(self.kv), **settings)
        self.flights = fp.DurableObjectNamespace(entry.Flight, object_env)
        self.env.FLIGHTS = self.flights
        self.ctx = fp.ExecutionContext()

    async def fetch(self, body: dict[str, Any], headers: dict[str, str] | None = None, url: str = URL,
                    method: str = "POST", signal: Any = None) -> Any:
        init: dict[str, Any] = {"method": method, "headers": {"content-type": "application/json", **(headers or {})}}
        if method != "GET":
            init["body"] = json.dumps(body).encode()
        if signal is not None:
            init["signal"] = signal
        request = fp.FakeRequest.new(url, fp.to_js(init, dict_converter=fp._from_entries))
        worker = self.entry.Default(self.ctx, self.env)
        return await worker.fetch(self.rt.workers.Request(request))

    async def settle(self) -> None:
        await self.ctx.settle()
        await self.flights.settle()


@pytest.fixture
def runtime() -> Any:
    with fp.installed() as rt:
        import entry

        yield rt, entry


def ask(content: str = "capital of France?", stream: bool = False, temperature: float = 0) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], "temperature": temperature, "stream": stream}


async def test_a_cacheable_miss_reaches_the_flight_object_through_the_sdk_stub(runtime: Any) -> None:
    """The stub is the SDK's `_FetcherWrapper` (keyword options only, a
    `workers.Response` back): a positional init was a TypeError, so every cacheable miss a 502."""
    rt, entry = runtime
    platform = Platform(rt, entry, PlatformAI())
    native = await platform.fetch(ask())
    assert isinstance(native, rt.workers.Response)
    body = json.loads(await native.bytes())
    assert native.status == 200, body
    assert body["choices"][0]["message"]["content"] == "Paris"
    assert platform.ai.calls == 1 and len(platform.flights.calls) == 1
    name, order = platform.flights.calls[0]
    assert order.method == "POST" and "|w|" in name

    streamed = await platform.fetch(ask("capital of Italy?", stream=True))
    text = (await streamed.bytes()).decode()
    assert streamed.status == 200 and streamed.headers["content-type"].startswith("text/event-stream")
    assert text.rstrip().endswith("data: [DONE]") and '"Pa"' in text
    await platform.settle()


async def test_an_object_failing_is_a_flight_failed_502_not_a_crash(runtime: Any, caplog: Any) -> None:
    """An exception in the object rejects the stub's fetch (pyfetch raises AbortError): the Worker
    answers a JSON 502 with Retry-After, in the OpenAI error shape. The object's own text (on workerd
    its traceback) is in the Worker's log, never in the client's message."""
    rt, entry = runtime
    platform = Platform(rt, entry, PlatformAI())

    class Broken(entry.Flight):
        async def fetch(self, request: Any) -> Any:
            raise RuntimeError("the object broke")

    platform.flights.cls = Broken
    native = await platform.fetch(ask())
    error = json.loads(await native.bytes())["error"]
    assert native.status == 502 and error["code"] == "flight_failed" and native.headers["retry-after"]
    assert "the object broke" not in error["message"] and "RuntimeError" not in error["message"]
    assert any("the object broke" in record.getMessage() for record in caplog.records)


async def test_a_coalesced_answer_is_written_to_kv_by_the_object(runtime: Any) -> None:
    """A Durable Object's waitUntil drops a bare coroutine, so the object schedules
    its KV write itself and hands the task over: the answer is cached, and the next ask is a HIT
    that never reaches the object or the model."""
    rt, entry = runtime
    platform = Platform(rt, entry, PlatformAI())
    first = await platform.fetch(ask())
    assert first.status == 200 and first.headers.get("cf-aig-cache-status") == "MISS"
    await first.bytes()
    await platform.settle()
    state = next(iter(platform.flights.states.values()))
    assert state.ignored == []  # nothing handed to the object's waitUntil as a bare coroutine
    assert [key async for key in _keys(platform.kv)], "the coalesced answer was never written to KV"
    second = await platform.fetch(ask())
    assert second.status == 200 and second.headers.get("cf-aig-cache-status") == "HIT"
    assert json.loads(await second.bytes())["choices"][0]["message"]["content"] == "Paris"
    assert platform.ai.calls == 1 and len(platform.flights.calls) == 1


async def _keys(kv: SqliteKV) -> Any:
    page = await kv.list(prefix="")
    for entry in page["keys"]:
        if "/keys/" not in entry["name"]:
            yield entry["name"]


async def test_identical_misses_share_one_generation_in_one_object(runtime: Any) -> None:
    """Three identical streamed misses while the first runs: one model call, one object, and every
    client gets the whole stream to [DONE]."""
    rt, entry = runtime
    ai = PlatformAI()
    ai.gate = asyncio.Event()
    platform = Platform(rt, entry, ai)

    async def one() -> str:
        native = await platform.fetch(ask(stream=True))
        return (await native.bytes()).decode()

    tasks = [asyncio.ensure_future(one()) for _ in range(3)]
    await ai.started.wait()
    while len(platform.flights.calls) < 3:
        await asyncio.sleep(0)
    ai.gate.set()
    texts = await asyncio.gather(*tasks)
    assert ai.calls == 1 and len(platform.flights.instances) == 1
    assert all(t.rstrip().endswith("data: [DONE]") for t in texts)
    await platform.settle()


async def test_a_deeply_nested_body_is_refused_before_parsing_on_the_worker(runtime: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """5000 deep was fatal to the isolate inside json.loads. The Worker refuses it
    with a 400 naming the limit without parsing it, and the same Worker keeps answering."""
    rt, entry = runtime
    from edgellm import validation

    platform = Platform(rt, entry, PlatformAI())
    real_loads, parsed = validation.json.loads, []

    def loads(data: Any, **kwargs: Any) -> Any:  # `json` is one module: note only the deep body
        if len(data) > 10_000:
            parsed.append(len(data))
        return real_loads(data, **kwargs)

    monkeypatch.setattr(validation.json, "loads", loads)
    request = fp.FakeRequest.new(URL, fp.to_js({"method": "POST", "headers": {"content-type": "application/json"},
                                                "body": b'{"messages": ' + b"[" * 5000 + b"]" * 5000 + b"}"},
                                               dict_converter=fp._from_entries))
    native = await entry.Default(platform.ctx, platform.env).fetch(rt.workers.Request(request))
    error = json.loads(await native.bytes())["error"]
    assert native.status == 400 and error["code"] == "json_too_deep" and str(validation.MAX_JSON_DEPTH) in error["message"]
    assert parsed == []
    after = await platform.fetch(ask())
    assert after.status == 200
    await platform.settle()


@pytest.mark.parametrize("temperature", [0, 0.7], ids=["through the flight object", "the Worker's own generation"])
async def test_a_non_streamed_client_that_leaves_cancels_its_generation(runtime: Any, temperature: float) -> None:
    """A non-streamed client that leaves is seen through `request.signal` (the
    `enable_request_signal` flag) and the generation is cancelled, as the local edge does; before,
    it ran to its end and was logged 200."""
    rt, entry = runtime
    ai = PlatformAI()
    ai.gate = asyncio.Event()
    platform = Platform(rt, entry, ai)
    controller = fp.AbortController()
    answer = asyncio.ensure_future(platform.fetch(ask(temperature=temperature), signal=controller.signal))
    await ai.started.wait()
    controller.abort()
    await asyncio.wait_for(ai.cancelled.wait(), 10)  # a guard only: the event is what the test waits on
    native = await answer
    assert native.status == 499
    assert not controller.signal.listeners  # the listener is removed (and its proxy destroyed)
    await platform.settle()


async def test_a_client_still_there_keeps_its_answer_and_the_listener_goes(runtime: Any) -> None:
    rt, entry = runtime
    platform = Platform(rt, entry, PlatformAI())
    controller = fp.AbortController()
    native = await platform.fetch(ask(temperature=0.7), signal=controller.signal)
    assert native.status == 200 and json.loads(await native.bytes())["choices"][0]["message"]["content"] == "Paris"
    assert not controller.signal.listeners
    controller.abort()  # after the answer: nothing left to cancel
    await platform.settle()


async def test_a_rate_limit_refusal_retries_after_the_limiters_window(runtime: Any) -> None:
    """Retry-After was always 60, whatever the binding's period."""
    import tomllib
    from pathlib import Path

    from edgellm.access.keys import KeyRing, new_key

    rt, entry = runtime

    class Refusing:  # the Rate Limiting binding: `limit({key})` -> `{success}`
        async def limit(self, options: Any) -> Any:
            return fp.JsDict({"success": False})

    platform = Platform(rt, entry, PlatformAI(), OPEN_ACCESS="false", RATE_LIMIT_PERIOD="10")
    platform.env.RATE_LIMITER = Refusing()
    made = new_key("acme", 0, requests_per_minute=0)
    await KeyRing(platform.kv).put(made.record)
    native = await platform.fetch(ask(), headers={"authorization": f"Bearer {made.api_key}"})
    assert native.status == 429 and native.headers["retry-after"] == "10"
    assert "10 s" in json.loads(await native.bytes())["error"]["message"]
    # what ships says the binding's period where the Worker can read it
    wrangler = tomllib.loads((Path(__file__).parents[2] / "wrangler.toml").read_text())
    assert wrangler["vars"]["RATE_LIMIT_PERIOD"] == str(wrangler["ratelimits"][0]["simple"]["period"])


async def test_the_flight_objects_spans_join_the_requests_trace(runtime: Any, caplog: Any) -> None:
    """The object runs in an isolate of its own on Cloudflare (here: a context of its own), where
    the request's span does not exist: the Worker sends `traceparent` with the order, so the
    generation's span and its KV write's, logged by the object (`TRACE_LOGS`), sit in the client's
    trace under the Worker's `cache.flight` span."""
    rt, entry = runtime
    platform = Platform(rt, entry, PlatformAI(), TRACE_LOGS="true")
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    caplog.set_level("INFO", logger="edgellm.trace")
    native = await platform.fetch(ask(), headers={"traceparent": f"00-{client_trace}-{client_span}-01"})
    assert native.status == 200 and native.headers.get("cf-aig-cache-status") == "MISS"
    await native.bytes()
    await platform.settle()
    spans = [json.loads(r.getMessage()) for r in caplog.records if r.name == "edgellm.trace"]
    by_name = {s["span"]: s for s in spans}
    assert {"cache.flight", f"chat {MODEL}", "cache.write"} <= set(by_name), sorted(by_name)
    assert {s["trace_id"] for s in spans} == {client_trace}  # one trace, the client's, on both sides of the object
    assert by_name[f"chat {MODEL}"]["parent_span_id"] == by_name["cache.flight"]["span_id"]
    (_, order), = platform.flights.calls
    assert order.headers.get("traceparent") == f"00-{client_trace}-{by_name['cache.flight']['span_id']}-01"
