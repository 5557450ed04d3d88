"""What lies UNDER the Workers Python SDK, stood in so that the real SDK runs under CPython.

The tests import the real `workers` package (PyPI `workers-runtime-sdk`, pinned in the `test`
extra: see pyproject.toml for which version and why). Only what the SDK itself imports from the
platform is stood in here: the `js` module (the platform's JS classes and bindings), `pyodide`,
`pyodide.ffi`, `pyodide.http`, and the runtime's private `_cloudflare_compat_flags` and
`_pyodide_entrypoint_helper`. Nothing here copies the SDK: `workers.Response`, `workers.Request`,
`workers.fetch`, the Durable Object stub (`_FetcherWrapper`), `_EnvWrapper` and the entrypoint
classes are the package's own code.

Every contract kept names its source:
- [ffi]   pyodide 0.28 `pyodide/ffi` as node_modules/pyodide/python_stdlib.zip ships it:
          `to_js` copies bytes into a Uint8Array and, with `dict_converter=Object.fromEntries`,
          dicts into JS objects; `create_proxy(bytes).getBuffer().data` (used by
          workers/utils.py `_get_js_body`); `JsException` carries `.message` and `.name`.
- [http]  pyodide 0.28 `pyodide/http.py` (same zip): `pyfetch(url, *, signal=None, fetcher=None,
          **kwargs)` calls `fetcher(url, to_js(kwargs, dict_converter=Object.fromEntries))` with an
          AbortController's signal added, wraps the answer in `FetchResponse(url, js_response,
          controller, signal)`, and raises `AbortError` for a `JsException`.
- [notes] a line of /work/shared/docs/workers-runtime.md, quoted where it is kept.
- [sdk]   what a workers/*.py file of the SDK reads of a JS object (named there).
- [length] which streams workerd knows the length of: a body stream (an R2 object's, a fixed
          body's) and the readable half of a `FixedLengthStream` ("Provided readable stream must
          have a known length (request/response body or readable half of FixedLengthStream)",
          workerd's error quoted in Miniflare PR #712); a Response over any other stream goes out
          chunked, without Content-Length ([notes] "Seen in workerd (2026-12-04)").
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import traceback
import types
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from edgellm_local.emulator.isolation import check_owner, current_request


# --- pyodide.ffi -----------------------------------------------------------------------------


class JsProxy:
    """[ffi] the base of every JS object seen from Python. The SDK tells JS classes apart by
    `obj.constructor.name` (workers/utils.py `_is_js_instance`, `_get_js_constructor_name`)."""

    js_name = "Object"

    @property
    def constructor(self) -> Any:
        return types.SimpleNamespace(name=self.js_name)


class JsNull:
    """[notes] "a KV or R2 miss | `pyodide.ffi.jsnull`, NOT `None` (`is None` is False; it is falsy)"."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "jsnull"


jsnull = JsNull()


class JsException(Exception):
    """[notes] "Errors surface as `pyodide.ffi.JsException` with the JS message"."""

    def __init__(self, message: str, name: str = "Error") -> None:
        super().__init__(message)
        self.message, self.name = message, name


class JsBuffer(JsProxy):
    pass


@dataclass
class JsObject(JsProxy):
    """[ffi] what `to_js(dict, dict_converter=Object.fromEntries)` yields: a JS object."""

    entries: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.entries[name]
        except KeyError:
            return None  # JS undefined


@dataclass
class Uint8Array(JsProxy):
    js_name = "Uint8Array"
    data: bytes

    def to_bytes(self) -> bytes:
        return self.data


@dataclass
class ArrayBuffer(JsProxy):
    js_name = "ArrayBuffer"
    data: bytes

    def to_bytes(self) -> bytes:
        return self.data


@dataclass
class JsDict(JsProxy):
    """A JS object handed back to Python: `.to_py()` gives the dict."""

    value: Any

    def to_py(self, **kwargs: Any) -> Any:
        return self.value

    def __getattr__(self, name: str) -> Any:
        if isinstance(self.value, dict) and name in self.value:
            return self.value[name]
        raise AttributeError(name)


class PyProxy(JsProxy):
    """[ffi] `create_proxy(obj)`: JS's handle on a Python object. For bytes, `getBuffer()`
    (workers/utils.py `_get_js_body` hands `.data` to `new Response`)."""

    js_name = "PyProxy"

    def __init__(self, obj: Any) -> None:
        self.obj, self.destroyed = obj, False

    def getBuffer(self) -> Any:  # noqa: N802 (JS name)
        return types.SimpleNamespace(data=Uint8Array(bytes(self.obj)), release=lambda: None)

    def destroy(self) -> None:
        self.destroyed = True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.obj(*args, **kwargs)


def create_proxy(obj: Any, **kwargs: Any) -> PyProxy:
    return obj if isinstance(obj, PyProxy) else PyProxy(obj)


def _unproxy(obj: Any) -> Any:
    return obj.obj if isinstance(obj, PyProxy) else obj


def _from_entries(entries: Any) -> JsObject:
    return JsObject(dict(entries))


def to_js(value: Any, dict_converter: Any = None, default_converter: Any = None, **kwargs: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return Uint8Array(bytes(value))
    if isinstance(value, dict):
        if dict_converter is None:
            return value  # a Map-like proxy: the binding stand-ins reject it, like R2 misreads it
        return dict_converter({k: to_js(v, dict_converter, default_converter) for k, v in value.items()}.items())
    if isinstance(value, (list, tuple)):
        return [to_js(v, dict_converter, default_converter) for v in value]
    return value


def require_js_object(options: Any) -> dict[str, Any]:
    if not isinstance(options, JsObject):
        raise TypeError(f"binding options must be a JS object made by to_js(..., dict_converter=Object.fromEntries), got {type(options).__name__}")
    return {k: (v.entries if isinstance(v, JsObject) else v) for k, v in options.entries.items()}


def to_plain(value: Any) -> Any:
    """What a JS object handed to a binding holds, as Python data (nested objects included)."""
    if isinstance(value, JsObject):
        return {k: to_plain(v) for k, v in value.entries.items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value


def _entries(obj: Any) -> list[list[Any]]:
    """`Object.entries`."""
    data = obj.entries if isinstance(obj, JsObject) else dict(obj)
    return [[k, v] for k, v in data.items()]


# --- streams ---------------------------------------------------------------------------------


class FakeReadableStream(JsProxy):
    """`ReadableStream.from_(create_proxy(agen))` (what the adapter hands back), or a binding's
    stream of byte chunks (`chunks`). [notes] every chunk from Python must be `to_js(bytes)`:
    "plain bytes or str give an empty body and `This ReadableStream did not return bytes`". Like a
    JS stream it belongs to the request that created it ([notes] "Requests are isolated")."""

    js_name = "ReadableStream"

    def __init__(self, source: Any = None, chunks: list[bytes] | None = None, length: int | None = None) -> None:
        self.source = _unproxy(source)
        self.chunks = list(chunks or [])
        self.owner = current_request()
        self.reader: "FakeReader | None" = None
        self.from_python = False
        # [length] what workerd knows of the stream's length: a body stream's (an R2 object's, a
        # fixed body's) or a FixedLengthStream's readable half; None for `from_` (a Python generator)
        self.length = length
        self.cancelled = False  # `cancel` called on the stream itself (not through a reader)

    def pipeThrough(self, transform: Any) -> "FakeReadableStream":  # noqa: N802 (JS name)
        return transform.piped(self)

    @classmethod
    def from_(cls, source: Any) -> "FakeReadableStream":
        stream = cls(source)
        stream.from_python = True
        return stream

    def getReader(self) -> "FakeReader":  # noqa: N802 (JS name)
        if self.reader is not None and not self.reader.released:
            raise JsException("ReadableStream is locked", "TypeError")
        self.reader = FakeReader(self)
        return self.reader

    async def cancel(self, reason: Any = None) -> None:
        self.cancelled = True
        await FakeReader(self).cancel()

    async def read_all(self) -> bytes:
        reader, parts = self.getReader(), []
        while not (result := await reader.read()).done:
            parts.append(result.value.to_bytes())
        reader.releaseLock()
        return b"".join(parts)


class FixedLengthStream(JsProxy):
    """[length] workerd's `FixedLengthStream(n)`: an identity transform whose readable half has a
    known length (so a Response over it keeps `Content-Length`) and which fails a stream that
    carries more or fewer than `n` bytes ("Provided readable stream must have a known length
    (request/response body or readable half of FixedLengthStream)", workerd via Miniflare #712)."""

    js_name = "FixedLengthStream"

    def __init__(self, length: int) -> None:
        self.length = int(length)

    @classmethod
    def new(cls, length: int) -> "FixedLengthStream":
        return cls(length)

    def piped(self, source: FakeReadableStream) -> FakeReadableStream:
        expected = self.length

        async def counted() -> Any:
            seen = 0
            reader = source.getReader()
            while not (result := await reader.read()).done:
                seen += len(result.value.to_bytes())
                if seen > expected:
                    raise JsException(f"FixedLengthStream: more than the {expected} bytes expected", "TypeError")
                yield result.value
            if seen != expected:
                raise JsException(f"FixedLengthStream: {seen} of the {expected} bytes expected", "TypeError")

        return FakeReadableStream(counted(), length=expected)


class FakeReader:
    def __init__(self, stream: FakeReadableStream) -> None:
        self.stream = stream
        self.cancelled = False
        self.released = False

    async def read(self) -> Any:
        check_owner(self.stream.owner, "a ReadableStream")
        if self.released:
            raise JsException("the reader was released", "TypeError")
        await asyncio.sleep(0)
        if not self.cancelled and not self.stream.chunks and self.stream.source is not None:
            try:  # a stream over an async iterator (`from_`, or a binding's body) pulls it
                chunk = await anext(self.stream.source)
            except StopAsyncIteration:
                return types.SimpleNamespace(done=True, value=None)
            if not isinstance(chunk, Uint8Array):
                if self.stream.from_python:
                    raise JsException("This ReadableStream did not return bytes.", "TypeError")
                chunk = Uint8Array(bytes(chunk))
            return types.SimpleNamespace(done=False, value=chunk)
        if self.cancelled or not self.stream.chunks:
            return types.SimpleNamespace(done=True, value=None)
        return types.SimpleNamespace(done=False, value=Uint8Array(self.stream.chunks.pop(0)))

    async def cancel(self, reason: Any = None) -> None:
        check_owner(self.stream.owner, "a ReadableStream")
        self.cancelled = True
        close = getattr(self.stream.source, "aclose", None)
        if close is not None:
            await close()

    def releaseLock(self) -> None:  # noqa: N802 (JS name)
        self.released = True


class _BytesSource:
    """A fixed body's chunks (what `new Response(bytes)` streams)."""

    def __init__(self, data: bytes) -> None:
        self.data: bytes | None = data

    def __aiter__(self) -> "_BytesSource":
        return self

    async def __anext__(self) -> bytes:
        if not self.data:
            raise StopAsyncIteration
        data, self.data = self.data, None
        return data


def _body_stream(body: Any) -> Any:
    """A Request/Response body as the platform holds it: a stream, or null for no body."""
    body = _unproxy(body)
    if body is None or body is jsnull:
        return jsnull
    if isinstance(body, FakeReadableStream):
        return body
    if isinstance(body, (Uint8Array, ArrayBuffer)):
        return FakeReadableStream(_BytesSource(body.data), length=len(body.data))
    if isinstance(body, str):
        return FakeReadableStream(_BytesSource(body.encode()), length=len(body.encode()))
    if isinstance(body, (bytes, bytearray)):
        # [notes] "R2 `put(key, bytes)` fails with a TypeError: pass `pyodide.ffi.to_js(data)`"
        raise JsException("a Python bytes body must go through to_js (or the SDK's getBuffer)", "TypeError")
    raise JsException(f"Unsupported body type {type(body).__name__}", "TypeError")


# --- Headers, Request, Response, AbortController -----------------------------------------------


class Headers(JsProxy):
    """JS `Headers`: names lower-cased; iterating gives [name, value] pairs ([sdk] workers/utils.py
    `_js_headers_to_http_message` iterates it; `_to_js_headers` calls `Headers.new(items)`)."""

    js_name = "Headers"

    def __init__(self, values: dict[str, str] | None = None) -> None:
        self.values = {k.lower(): str(v) for k, v in (values or {}).items()}

    @classmethod
    def new(cls, init: Any = None) -> "Headers":
        if init is None or init is jsnull:
            return cls()
        if isinstance(init, Headers):
            return cls(init.values)
        if isinstance(init, JsObject):
            return cls(dict(init.entries))
        if isinstance(init, dict):
            return cls(init)
        return cls({str(k): str(v) for k, v in init})

    def __iter__(self) -> Iterator[list[str]]:
        return iter([[k, v] for k, v in self.values.items()])

    def entries(self) -> list[list[str]]:
        return [[k, v] for k, v in self.values.items()]

    def get(self, name: str) -> Any:
        return self.values.get(name.lower(), jsnull)

    def has(self, name: str) -> bool:
        return name.lower() in self.values

    def set(self, name: str, value: str) -> None:
        self.values[name.lower()] = str(value)

    def getSetCookie(self) -> list[str]:  # noqa: N802 (JS name)
        return []


def _init(init: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A JS call's options: a JS object, or Python keywords (pyodide turns `f(x, **kw)` into
    `f(x, {..kw})`, which is how the SDK calls `Response.new(body, **options)`)."""
    options = dict(init.entries) if isinstance(init, JsObject) else dict(init or {})
    options.update(kwargs)
    return options


class AbortSignal(JsProxy):
    """JS `AbortSignal`: `aborted`, `reason`, and 'abort' listeners ([notes] "Workers exposes the
    client's departure as `request.signal` (the `enable_request_signal` compatibility flag)")."""

    js_name = "AbortSignal"

    def __init__(self) -> None:
        self.aborted, self.reason, self.listeners = False, None, []

    def addEventListener(self, kind: str, listener: Any, *options: Any) -> None:  # noqa: N802 (JS name)
        assert kind == "abort"
        assert isinstance(listener, PyProxy), "a Python listener kept by JS must be a create_proxy"
        self.listeners.append(listener)

    def removeEventListener(self, kind: str, listener: Any, *options: Any) -> None:  # noqa: N802 (JS name)
        self.listeners = [entry for entry in self.listeners if entry is not listener]

    def abort(self, reason: Any = None) -> None:
        if self.aborted:
            return
        self.aborted, self.reason = True, reason
        for listener in list(self.listeners):
            listener(types.SimpleNamespace(type="abort"))


class AbortController(JsProxy):
    js_name = "AbortController"

    def __init__(self) -> None:
        self.signal = AbortSignal()

    @classmethod
    def new(cls) -> "AbortController":
        return cls()

    def abort(self, reason: Any = None) -> None:
        self.signal.abort(reason)


class FakeRequest(JsProxy):
    """JS `Request` ([sdk] workers/request.py reads `method`, `url`, `headers`, `cf`, `bodyUsed`,
    `arrayBuffer()`, `text()`; [notes] "`request.cf` is not on the Python `Request`")."""

    js_name = "Request"

    def __init__(self, url: str, method: str = "GET", headers: Headers | None = None, body: Any = jsnull,
                 cf: Any = None, signal: AbortSignal | None = None) -> None:
        self.url, self.method, self.headers = url, method.upper(), headers or Headers()
        self.body, self.cf = body, cf
        self.signal = signal or AbortSignal()
        self.bodyUsed = False

    @classmethod
    def new(cls, url: Any, init: Any = None, **kwargs: Any) -> "FakeRequest":
        options = _init(init, kwargs)
        if isinstance(url, FakeRequest):
            return cls(url.url, url.method, Headers.new(url.headers), url.body, url.cf, url.signal)
        return cls(str(url), str(options.get("method") or "GET"), Headers.new(options.get("headers")),
                   _body_stream(options.get("body")), options.get("cf"), options.get("signal"))

    async def arrayBuffer(self) -> ArrayBuffer:  # noqa: N802 (JS name)
        self.bodyUsed = True
        return ArrayBuffer(b"" if self.body is jsnull else await self.body.read_all())

    async def text(self) -> str:
        return (await self.arrayBuffer()).data.decode()


class FakeJsResponse(JsProxy):
    """JS `Response` ([sdk] workers/response.py: `Response.new(body, **options)`, `status`,
    `statusText`, `headers`, `body`, `url`, `type`, `bodyUsed`; pyodide/http.py reads `ok`,
    `arrayBuffer()`, `text()`)."""

    js_name = "Response"

    def __init__(self, body: Any, status: int = 200, headers: Headers | None = None, status_text: str = "") -> None:
        self.body, self.status, self.headers = body, status, headers or Headers()
        self.statusText, self.url, self.type, self.redirected = status_text, "", "default", False
        self.bodyUsed = False

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @classmethod
    def new(cls, body: Any = None, init: Any = None, **kwargs: Any) -> "FakeJsResponse":
        options = _init(init, kwargs)
        stream, headers = _body_stream(body), Headers.new(options.get("headers"))
        if isinstance(stream, FakeReadableStream) and stream.length is None:
            # [notes] "An R2 object body served through the Worker reached the client without
            # `content-length`": over a stream of unknown length workerd sends the body chunked
            headers.values.pop("content-length", None)
        return cls(stream, int(options.get("status") or 200), headers, str(options.get("statusText") or ""))

    async def arrayBuffer(self) -> ArrayBuffer:  # noqa: N802 (JS name)
        if self.bodyUsed:
            raise JsException("Body has already been used", "TypeError")
        self.bodyUsed = True
        return ArrayBuffer(b"" if self.body is jsnull else await self.body.read_all())

    async def text(self) -> str:
        return (await self.arrayBuffer()).data.decode()


# the names earlier tests used
FakeHeaders = Headers


@dataclass(frozen=True)
class FakeDate:
    ms: float

    @classmethod
    def new(cls, ms: float) -> "FakeDate":
        return cls(ms)

    def getTime(self) -> float:  # noqa: N802 (JS name)
        return self.ms


# --- pyodide.http ------------------------------------------------------------------------------


class BodyUsedError(OSError):
    pass


class AbortError(OSError):
    """[http] `AbortError(reason: JsException)`; [notes] "Errors thrown in the DO reach the
    Worker's `await stub.fetch(...)` as `pyodide.http.AbortError` carrying the DO's traceback text"."""

    def __init__(self, reason: Any) -> None:
        super().__init__(getattr(reason, "message", reason))
        self.reason = reason


class FetchResponse:
    """[http] `FetchResponse(url, js_response, abort_controller, abort_signal)`: what
    `workers.Response` subclasses (workers/response.py)."""

    def __init__(self, url: str, js_response: Any, abort_controller: Any = None, abort_signal: Any = None) -> None:
        self._url, self.js_response = url, js_response
        self.abort_controller, self.abort_signal = abort_controller, abort_signal

    @property
    def body_used(self) -> bool:
        return bool(self.js_response.bodyUsed)

    @property
    def headers(self) -> dict[str, str]:
        return dict(self.js_response.headers.entries())

    @property
    def ok(self) -> bool:
        return bool(self.js_response.ok)

    @property
    def status(self) -> int:
        return int(self.js_response.status)

    @property
    def status_text(self) -> str:
        return str(self.js_response.statusText)

    @property
    def url(self) -> str:
        return self._url

    def _raise_if_failed(self) -> None:
        if self.body_used:
            raise BodyUsedError

    async def buffer(self) -> Any:
        self._raise_if_failed()
        return await self.js_response.arrayBuffer()

    async def bytes(self) -> bytes:
        return (await self.buffer()).to_bytes()

    async def text(self) -> str:
        return (await self.bytes()).decode()

    async def json(self, **kwargs: Any) -> Any:
        import json

        return json.loads(await self.text(), **kwargs)

    def abort(self, reason: Any = None) -> None:
        if self.abort_controller is not None:
            self.abort_controller.abort(reason)


async def pyfetch(url: Any, /, *, signal: Any = None, fetcher: Any = None, **kwargs: Any) -> FetchResponse:
    """[http] pyfetch, as pyodide 0.28.3 has it (abortSignalAny of a given signal left out)."""
    controller = AbortController.new()
    kwargs["signal"] = signal or controller.signal
    fetcher = fetcher or _js_module().fetch
    try:
        return FetchResponse(url, await fetcher(url, to_js(kwargs, dict_converter=_from_entries)), controller, kwargs["signal"])
    except asyncio.CancelledError:
        controller.abort()
        raise
    except JsException as exc:
        raise AbortError(exc) from None


def _js_module() -> Any:
    return sys.modules["js"]


# --- bindings (KV, R2, the Cache API) kept by the local edge's real stores ----------------------


def _js_error(exc: Exception) -> JsException:
    return JsException(str(exc))


class JsAi(JsProxy):
    """The `Ai` binding (`env.AI`) as workerd hands it to Python, answered by a real local AI
    binding (`backend`: the local edge's llama.cpp binding, or `ScriptedAI`), as the KV and R2
    stand-ins are kept by real local stores. Its contract, each line from its source:
    - `run(model, inputs, options?)`: `inputs` must be a JS object ([notes] "Pass every options
      object to a binding as `to_js(d, dict_converter=js.Object.fromEntries)`"); the answer is a
      JS object whose `.to_py()` is the dict ([notes] "`await env.AI.run(...)` returns a JsProxy:
      `.to_py()` gives the dict").
    - whenever `inputs.stream` is truthy the answer is a `ReadableStream` of SSE bytes instead, for
      every model and whatever else the inputs hold, JSON mode and tools included ([notes] "Seen in
      workerd (2026-12-04)": "a caller that wants an object must not pass `stream` at all"); one
      `data: {...}` event per backend event (`{"response": token}`, a last one with `usage`), then
      `data: [DONE]` ([notes] "Workers AI: ... Stream").
    - failures are `JsException`s carrying Workers AI's numbered message (`InferenceUpstreamError:
      5007: No such model ...`), at the call or from the stream's reader ([notes] "Errors surface as
      `pyodide.ffi.JsException` with the JS message").
    - the binding has no `describe()` ([notes] "The `Ai` binding class has no `describe()`").
    `calls` keeps (model, inputs as a dict, options) per call."""

    js_name = "Ai"

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.calls: list[tuple[str, dict[str, Any], Any]] = []

    async def run(self, model: str, inputs: Any, options: Any = None) -> Any:
        opts = {name: to_plain(value) for name, value in require_js_object(inputs).items()}
        self.calls.append((model, opts, to_plain(options) if options is not None else None))
        rest = {name: value for name, value in opts.items() if name != "stream"}
        try:
            if opts.get("stream"):
                return FakeReadableStream(self._sse(await self.backend.stream(model, rest)))
            return JsDict(await self.backend.run(model, rest))
        except Exception as exc:
            raise _ai_error(exc) from None

    @staticmethod
    async def _sse(events: Any) -> Any:
        import json

        try:
            async for event in events:
                yield b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        except Exception as exc:
            raise _ai_error(exc) from None
        finally:
            close = getattr(events, "aclose", None)
            if close is not None:
                await close()


def _ai_error(exc: Exception) -> JsException:
    """A backend's failure as the binding raises it: its numbered text under the JS error name
    Workers AI gives it ([notes] "`InferenceUpstreamError: 5006: <message>`")."""
    return JsException(f"InferenceUpstreamError: {exc}", "InferenceUpstreamError")


class JsKVNamespace:
    """A KV namespace binding as workerd hands it to Python (`getWithMetadata(key, "arrayBuffer")`,
    options as JS objects, a miss as `jsnull`, failures as `JsException`s with KV's message), kept
    by a real local store (`SqliteKV`), so the KV contract runs through `WorkersKV` too."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def getWithMetadata(self, key: str, kind: Any) -> Any:  # noqa: N802 (JS name)
        # the type as a string, or an options object {type, cacheTtl} (workers-runtime.md: cacheTtl >= 60)
        options = {"type": kind} if isinstance(kind, str) else to_plain(require_js_object(kind))
        assert options["type"] == "arrayBuffer", "the adapter reads values as bytes"
        cache_ttl = options.get("cacheTtl")
        if cache_ttl is not None and cache_ttl < 60:
            raise _js_error(ValueError(f"KV GET failed: 400 Invalid cache_ttl of {cache_ttl}. Cache TTL must be at least 60."))
        try:
            entry = await self.store.get(key, cache_ttl=cache_ttl)
        except Exception as exc:
            raise _js_error(exc) from exc
        if entry is None:
            return types.SimpleNamespace(value=jsnull, metadata=jsnull)
        return types.SimpleNamespace(value=Uint8Array(entry.value), metadata=JsDict(entry.metadata) if entry.metadata is not None else jsnull)

    async def put(self, key: str, value: Any, options: Any) -> None:
        if isinstance(value, dict):
            raise TypeError("KV put: a value must be a string, ArrayBuffer or stream")
        data = value.data if isinstance(value, Uint8Array) else value
        opts = to_plain(require_js_object(options))
        try:
            await self.store.put(key, data, expiration_ttl=opts.get("expirationTtl"), metadata=opts.get("metadata"),
                                 expiration=opts.get("expiration"))
        except Exception as exc:
            raise _js_error(exc) from exc

    async def delete(self, key: str) -> None:
        try:
            await self.store.delete(key)
        except Exception as exc:
            raise _js_error(exc) from exc

    async def list(self, options: Any) -> Any:
        opts = to_plain(require_js_object(options))
        try:
            return JsDict(await self.store.list(prefix=opts.get("prefix", ""), limit=opts.get("limit", 1000), cursor=opts.get("cursor")))
        except Exception as exc:
            raise _js_error(exc) from exc


def _js_r2_object(obj: Any) -> Any:
    checksums = {"sha256": obj.checksum_sha256} if obj.checksum_sha256 else {}
    return types.SimpleNamespace(
        key=obj.key, size=obj.size, etag=obj.etag, httpEtag=obj.http_etag, uploaded=FakeDate(obj.uploaded * 1000),
        httpMetadata=JsObject(dict(obj.http_metadata)), customMetadata=JsObject(dict(obj.custom_metadata)),
        checksums=types.SimpleNamespace(toJSON=lambda: JsObject(checksums)),
        range=types.SimpleNamespace(offset=obj.range[0], length=obj.range[1]) if obj.range else None,
        body=FakeReadableStream(obj.body, length=obj.range[1] if obj.range else obj.size) if obj.body is not None else None,
    )


class JsR2Bucket:
    """An R2 bucket binding as workerd hands it to Python (options as JS objects, `Date`s for
    `uploadedBefore/After`, objects with `uploaded.getTime()`, `checksums.toJSON()` and a body
    stream, a miss as `jsnull`, failures as `JsException`s), kept by a real local store (`FileR2`),
    so the R2 contract runs through `WorkersR2` too."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def head(self, key: str) -> Any:
        try:
            obj = await self.store.head(key)
        except Exception as exc:
            raise _js_error(exc) from exc
        return jsnull if obj is None else _js_r2_object(obj)

    async def get(self, key: str, options: Any) -> Any:
        from edgellm.ports import R2Conditional, R2Range

        opts = require_js_object(options)
        rng = to_plain(opts.get("range"))
        cond = opts.get("onlyIf") or {}
        cond = cond.entries if isinstance(cond, JsObject) else cond
        when = {name: (value.getTime() / 1000 if isinstance(value, FakeDate) else value) for name, value in cond.items()}
        try:
            obj = await self.store.get(
                key,
                range=R2Range(rng.get("offset"), rng.get("length"), rng.get("suffix")) if rng else None,
                only_if=R2Conditional(when.get("etagMatches"), when.get("etagDoesNotMatch"), when.get("uploadedBefore"),
                                      when.get("uploadedAfter")) if when else None,
            )
        except Exception as exc:
            raise _js_error(exc) from exc
        return jsnull if obj is None else _js_r2_object(obj)

    async def put(self, key: str, value: Any, options: Any) -> Any:
        if not isinstance(value, Uint8Array):
            raise TypeError("R2 put: bytes must go through to_js")
        opts = to_plain(require_js_object(options))
        try:
            obj = await self.store.put(key, value.data, http_metadata=opts.get("httpMetadata"),
                                       custom_metadata=opts.get("customMetadata"), sha256=opts.get("sha256"))
        except Exception as exc:
            raise _js_error(exc) from exc
        return _js_r2_object(obj)

    async def delete(self, key: str) -> None:
        try:
            await self.store.delete(key)
        except Exception as exc:
            raise _js_error(exc) from exc

    async def list(self, options: Any) -> Any:
        opts = to_plain(require_js_object(options))
        try:
            page = await self.store.list(opts.get("prefix", ""), cursor=opts.get("cursor"), limit=opts.get("limit", 1000),
                                         delimiter=opts.get("delimiter"))
        except Exception as exc:
            raise _js_error(exc) from exc
        return types.SimpleNamespace(truncated=page["truncated"], objects=[_js_r2_object(o) for o in page["objects"]],
                                     delimitedPrefixes=list(page.get("delimitedPrefixes", [])), cursor=page.get("cursor"))


class FakeCacheStorage:
    """`caches`: `open(name)` gives a cache answering as the Cache API does, kept by the local
    edge's `MemoryEdgeCache` (a whole 200 stored, a Range answered with a 206 from it)."""

    def __init__(self) -> None:
        from edgellm_local.emulator.edge_cache import MemoryEdgeCache

        self.caches: dict[str, Any] = {}
        self._new = MemoryEdgeCache

    async def open(self, name: str) -> "FakeCache":
        return FakeCache(self.caches.setdefault(name, self._new()))


@dataclass
class FakeCache:
    store: Any

    async def match(self, request: FakeRequest) -> Any:
        hit = await self.store.match(request.url, request.headers.values)
        if hit is None:
            return None  # JS undefined
        declared = str(hit.headers.get("content-length", ""))
        # [length] a response body: its length is known where the stored response declared one
        body = FakeReadableStream(hit.body, length=int(declared) if declared.isdigit() else None)
        return FakeJsResponse(body, hit.status, FakeHeaders(hit.headers))

    async def put(self, url: str, response: FakeJsResponse) -> None:
        reader = response.body.getReader()

        async def chunks() -> Any:
            while not (result := await reader.read()).done:
                yield result.value.to_bytes()

        try:
            await self.store.put(url, response.status, response.headers.values, chunks())
        except ValueError as exc:
            raise JsException(f"TypeError: {exc}") from exc




# --- the platform: contexts and the Durable Object binding -----------------------------------


class ExecutionContext(JsProxy):
    """The Worker's `ctx`. [notes] "Background work after the response: `self.ctx.waitUntil(coro_or_future)`
    (a bare coroutine, a task or a future all work) **on the Worker's context only**"."""

    js_name = "ExecutionContext"

    def __init__(self) -> None:
        self.kept: list[asyncio.Future[Any]] = []

    def waitUntil(self, awaitable: Any) -> None:  # noqa: N802 (JS name)
        self.kept.append(asyncio.ensure_future(awaitable))

    async def settle(self) -> None:
        """What the runtime does after the response: wait for everything handed to waitUntil."""
        while pending := [f for f in self.kept if not f.done()]:
            await asyncio.gather(*pending, return_exceptions=True)


class DurableObjectState(ExecutionContext):
    """A Durable Object's `ctx`. [notes] "A Durable Object's `self.ctx.waitUntil` is not adapted for
    Python awaitables: a bare coroutine handed to it never runs (the log says `coroutine '...' was
    never awaited`); schedule it first (`asyncio.ensure_future`, keep a reference) and hand over the
    task". A coroutine handed over is dropped here (closed, its name kept in `ignored`)."""

    js_name = "DurableObjectState"

    def __init__(self, storage: Any = None) -> None:
        super().__init__()
        self.storage = storage
        self.ignored: list[str] = []

    def waitUntil(self, awaitable: Any) -> None:  # noqa: N802 (JS name)
        if asyncio.iscoroutine(awaitable):
            self.ignored.append(awaitable.__qualname__)
            awaitable.close()  # never awaited, as in the runtime (closed here to keep the test quiet)
            return
        self.kept.append(asyncio.ensure_future(awaitable))


class JsEnv(JsProxy):
    """The JS `env` the platform hands an entrypoint: bindings and `[vars]` as attributes (the SDK
    wraps it in `_EnvWrapper`, workers/rpc.py). A missing name raises AttributeError, as
    `getattr(jsproxy, missing)` does. Binding stand-ins carry no `constructor` name in the SDK's
    `_EnvWrapper._BINDING_TYPES`: workerd 1.20260426's SDK copy hands KV, R2, AI and the rate limiter
    over unwrapped (its `_EnvWrapper`: "TODO: Implement APIs for bindings"), and so does this env."""

    js_name = "Object"

    def __init__(self, **bindings: Any) -> None:
        self.__dict__.update(bindings)


@dataclass(frozen=True)
class DurableObjectId(JsProxy):
    js_name = "DurableObjectId"
    name: str

    def toString(self) -> str:  # noqa: N802 (JS name)
        return f"id:{self.name}"


class DurableObjectNamespace(JsProxy):
    """A Durable Object binding hosting a Python `workers.DurableObject` class: one instance per
    id, made on first use with its own `DurableObjectState` and the object's env ([notes] "One
    single-threaded instance per id"; "on Cloudflare a Durable Object runs in its own isolate":
    nothing here links the instances to the Worker but `fetch`). `stub.fetch(url, init)` runs the
    object's `fetch` with a `workers.Request` and answers its `workers.Response`'s JS object; an
    exception in the object rejects the call with its traceback ([notes] "Errors thrown in the DO
    reach the Worker's `await stub.fetch(...)` as `pyodide.http.AbortError` carrying the DO's
    traceback text")."""

    js_name = "DurableObjectNamespace"

    def __init__(self, cls: Any, env: Any, storage: Any = None) -> None:
        self.cls, self.env, self.storage = cls, env, storage
        self.instances: dict[str, Any] = {}
        self.states: dict[str, DurableObjectState] = {}
        self.calls: list[tuple[str, FakeRequest]] = []

    def idFromName(self, name: str) -> DurableObjectId:  # noqa: N802 (JS name)
        return DurableObjectId(name)

    def get(self, object_id: DurableObjectId) -> "DurableObjectStub":
        return DurableObjectStub(self, object_id.name)

    def instance(self, name: str) -> Any:
        if name not in self.instances:
            state = DurableObjectState(self.storage() if callable(self.storage) else self.storage)
            self.states[name] = state
            self.instances[name] = self.cls(state, self.env)
        return self.instances[name]

    async def settle(self) -> None:
        for state in list(self.states.values()):
            await state.settle()


@dataclass
class DurableObjectStub(JsProxy):
    js_name = "DurableObject"
    namespace: DurableObjectNamespace
    name: str

    async def fetch(self, url: Any, init: Any = None) -> FakeJsResponse:
        request = FakeRequest.new(url, init)
        self.namespace.calls.append((self.name, request))
        workers = sys.modules["workers"]
        # in a context of its own: the object runs in another isolate ([notes] "on Cloudflare a
        # Durable Object runs in its own isolate"), where no context variable the Worker's request
        # set (its span, its admitted tenant) exists
        serving = asyncio.get_running_loop().create_task(self.namespace.instance(self.name).fetch(workers.Request(request)),
                                                         context=contextvars.Context())
        try:
            answer = await serving
        except Exception:
            raise JsException("PythonError: " + traceback.format_exc()) from None
        return answer.js_object




@contextmanager
def installed(**flags: bool) -> Iterator[types.SimpleNamespace]:
    """Install the stand-ins into sys.modules and import the real `workers` SDK over them, for the
    duration of a test (the SDK and the adapters are imported afresh, bound to this test's `js`).
    `flags` are compatibility flags as `_cloudflare_compat_flags` exposes them."""
    js = types.ModuleType("js")
    js.Object = types.SimpleNamespace(fromEntries=_from_entries, entries=_entries)  # type: ignore[attr-defined]
    js.Date = FakeDate  # type: ignore[attr-defined]
    js.caches = FakeCacheStorage()  # type: ignore[attr-defined]
    js.Request = FakeRequest  # type: ignore[attr-defined]
    js.Response = FakeJsResponse  # type: ignore[attr-defined]
    js.Headers = Headers  # type: ignore[attr-defined]
    js.ReadableStream = FakeReadableStream  # type: ignore[attr-defined]
    js.FixedLengthStream = FixedLengthStream  # type: ignore[attr-defined]
    js.AbortController = AbortController  # type: ignore[attr-defined]
    js.Array = types.SimpleNamespace(new=list)  # type: ignore[attr-defined]
    js.Error = types.SimpleNamespace(new=lambda message: JsException(message))  # type: ignore[attr-defined]
    js.null = jsnull  # type: ignore[attr-defined]

    async def no_network(url: Any, init: Any = None) -> Any:
        raise JsException("no network in the tests: set js.fetch", "TypeError")

    js.fetch = no_network  # type: ignore[attr-defined]
    pyodide = types.ModuleType("pyodide")
    pyodide.__version__ = "0.28.2"  # type: ignore[attr-defined]  # [notes] "workerd 1.20260426 + Pyodide 0.28.2"
    pyodide.__path__ = []  # type: ignore[attr-defined]
    ffi = types.ModuleType("pyodide.ffi")
    ffi.JsException = JsException  # type: ignore[attr-defined]
    ffi.JsProxy = JsProxy  # type: ignore[attr-defined]
    ffi.JsBuffer = JsBuffer  # type: ignore[attr-defined]
    ffi.create_proxy = create_proxy  # type: ignore[attr-defined]
    ffi.create_once_callable = create_proxy  # type: ignore[attr-defined]
    ffi.destroy_proxies = lambda proxies: None  # type: ignore[attr-defined]
    ffi.to_js = to_js  # type: ignore[attr-defined]
    ffi.jsnull = jsnull  # type: ignore[attr-defined]
    http = types.ModuleType("pyodide.http")
    http.pyfetch = pyfetch  # type: ignore[attr-defined]
    http.FetchResponse = FetchResponse  # type: ignore[attr-defined]
    http.AbortError = AbortError  # type: ignore[attr-defined]
    http.BodyUsedError = BodyUsedError  # type: ignore[attr-defined]
    pyodide.ffi, pyodide.http = ffi, http  # type: ignore[attr-defined]
    compat = types.ModuleType("_cloudflare_compat_flags")
    for name, value in flags.items():
        setattr(compat, name, value)
    helper = types.ModuleType("_pyodide_entrypoint_helper")
    # workerd's JS side of the SDK: `patchWaitUntil(ctx)` adapts the Worker's ctx for Python
    # awaitables; what it leaves undone in a Durable Object is DurableObjectState's own behaviour
    helper.patchWaitUntil = lambda ctx: None  # type: ignore[attr-defined]
    modules = {"js": js, "pyodide": pyodide, "pyodide.ffi": ffi, "pyodide.http": http,
               "_cloudflare_compat_flags": compat, "_pyodide_entrypoint_helper": helper}
    saved = {name: sys.modules.get(name) for name in modules}

    def forget() -> None:  # modules bound to a test's stand-ins: the SDK, the adapters, the entry module
        for name in [n for n in sys.modules if n == "workers" or n.startswith(("workers.", "edgellm.runtime.pyodide")) or n == "entry"]:
            del sys.modules[name]

    forget()
    sys.modules.update(modules)
    try:
        import workers  # the real SDK

        yield types.SimpleNamespace(js=js, ffi=ffi, http=http, workers=workers, compat=compat)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        forget()
