"""A stand-in for the Pyodide runtime's `js`, `pyodide.ffi` and `workers` modules, reproducing
the behaviours workers-runtime.md documents (and which bit us): a miss is `jsnull` (falsy, not
None); options must be converted with `to_js(d, dict_converter=js.Object.fromEntries)` — the
bindings here reject a raw dict, as the real R2 binding silently misreads one; bytes must be
converted too; failures are `JsException`s carrying the JS message.

It lets the adapter's own logic run under CPython. It proves nothing about workerd itself:
`wrangler deploy --dry-run` and the real runtime remain the judges of that.
"""

from __future__ import annotations

import asyncio
import sys
import types
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

from edgellm_local.isolation import check_owner, current_request


class JsNull:
    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "jsnull"


jsnull = JsNull()


class JsException(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class JsObject:
    """What `to_js(dict, dict_converter=Object.fromEntries)` yields: a JS object."""

    entries: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.entries[name]
        except KeyError:
            return None


@dataclass
class Uint8Array:
    data: bytes

    def to_bytes(self) -> bytes:
        return self.data


@dataclass
class JsDict:
    """A JS object handed back to Python: `.to_py()` gives the dict."""

    value: Any

    def to_py(self) -> Any:
        return self.value

    def __getattr__(self, name: str) -> Any:
        if isinstance(self.value, dict) and name in self.value:
            return self.value[name]
        raise AttributeError(name)


def _from_entries(entries: Any) -> JsObject:
    return JsObject(dict(entries))


def to_js(value: Any, dict_converter: Any = None) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return Uint8Array(bytes(value))
    if isinstance(value, dict):
        if dict_converter is None:
            return value  # a Map-like proxy: the fake bindings reject it, like R2 misreads it
        return dict_converter({k: to_js(v, dict_converter) for k, v in value.items()}.items())
    if isinstance(value, list):
        return [to_js(v, dict_converter) for v in value]
    return value


def require_js_object(options: Any) -> dict[str, Any]:
    if not isinstance(options, JsObject):
        raise TypeError(f"binding options must be a JS object made by to_js(..., dict_converter=Object.fromEntries), got {type(options).__name__}")
    return {k: (v.entries if isinstance(v, JsObject) else v) for k, v in options.entries.items()}


@dataclass
class FakeResponse:
    body: Any
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


class FakeReadableStream:
    """`ReadableStream.from_(agen)` (what the adapter hands back), or a binding's stream of
    byte chunks (`chunks`). Like a JS stream, it belongs to the request that created it: reading
    it while serving another request fails as workerd fails it (the local edge's isolation)."""

    def __init__(self, source: Any = None, chunks: list[bytes] | None = None) -> None:
        self.source = source
        self.chunks = list(chunks or [])
        self.owner = current_request()
        self.reader: "FakeReader | None" = None

    @classmethod
    def from_(cls, source: Any) -> "FakeReadableStream":
        return cls(source)

    def getReader(self) -> "FakeReader":  # noqa: N802 (JS name)
        if self.reader is not None and not self.reader.released:
            raise JsException("TypeError: ReadableStream is locked")
        self.reader = FakeReader(self)
        return self.reader


class FakeReader:
    def __init__(self, stream: FakeReadableStream) -> None:
        self.stream = stream
        self.cancelled = False
        self.released = False

    async def read(self) -> Any:
        check_owner(self.stream.owner, "a ReadableStream")
        if self.released:
            raise JsException("TypeError: the reader was released")
        await asyncio.sleep(0)
        if not self.cancelled and not self.stream.chunks and self.stream.source is not None:
            try:  # a stream over an async iterator (`from_`, or a binding's body) pulls it
                chunk = await anext(self.stream.source)
            except StopAsyncIteration:
                return types.SimpleNamespace(done=True, value=None)
            return types.SimpleNamespace(done=False, value=chunk if isinstance(chunk, Uint8Array) else Uint8Array(bytes(chunk)))
        if self.cancelled or not self.stream.chunks:
            return types.SimpleNamespace(done=True, value=None)
        return types.SimpleNamespace(done=False, value=Uint8Array(self.stream.chunks.pop(0)))

    async def cancel(self) -> None:
        check_owner(self.stream.owner, "a ReadableStream")
        self.cancelled = True
        close = getattr(self.stream.source, "aclose", None)
        if close is not None:
            await close()

    def releaseLock(self) -> None:  # noqa: N802 (JS name)
        self.released = True


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


@dataclass(frozen=True)
class FakeDate:
    ms: float

    @classmethod
    def new(cls, ms: float) -> "FakeDate":
        return cls(ms)

    def getTime(self) -> float:  # noqa: N802 (JS name)
        return self.ms


def _js_error(exc: Exception) -> JsException:
    return JsException(str(exc))


class JsKVNamespace:
    """A KV namespace binding as workerd hands it to Python (`getWithMetadata(key, "arrayBuffer")`,
    options as JS objects, a miss as `jsnull`, failures as `JsException`s with KV's message), kept
    by a real local store (`SqliteKV`), so the KV contract runs through `WorkersKV` too."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def getWithMetadata(self, key: str, kind: str) -> Any:  # noqa: N802 (JS name)
        assert kind == "arrayBuffer", "the adapter reads values as bytes"
        try:
            entry = await self.store.get(key)
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
        body=FakeReadableStream(obj.body) if obj.body is not None else None,
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


@dataclass
class FakeHeaders:
    values: dict[str, str]

    def entries(self) -> list[list[str]]:
        return [[k, v] for k, v in self.values.items()]

    def get(self, name: str) -> Any:
        return self.values.get(name.lower(), jsnull)


@dataclass
class FakeRequest:
    url: str
    headers: dict[str, str]

    @classmethod
    def new(cls, url: str, init: Any = None) -> "FakeRequest":
        headers = to_plain(require_js_object(init)).get("headers") or {} if init is not None else {}
        return cls(url, {k.lower(): v for k, v in headers.items()})


@dataclass
class FakeJsResponse:
    body: Any
    status: int
    headers: FakeHeaders

    @classmethod
    def new(cls, body: Any, init: Any) -> "FakeJsResponse":
        opts = to_plain(require_js_object(init))
        return cls(body, int(opts.get("status", 200)), FakeHeaders({k.lower(): v for k, v in (opts.get("headers") or {}).items()}))


class FakeCacheStorage:
    """`caches`: `open(name)` gives a cache answering as the Cache API does, kept by the local
    edge's `MemoryEdgeCache` (a whole 200 stored, a Range answered with a 206 from it)."""

    def __init__(self) -> None:
        from edgellm_local.edge_cache import MemoryEdgeCache

        self.caches: dict[str, Any] = {}
        self._new = MemoryEdgeCache

    async def open(self, name: str) -> "FakeCache":
        return FakeCache(self.caches.setdefault(name, self._new()))


@dataclass
class FakeCache:
    store: Any

    async def match(self, request: FakeRequest) -> Any:
        hit = await self.store.match(request.url, request.headers)
        if hit is None:
            return None  # JS undefined
        return FakeJsResponse(FakeReadableStream(hit.body), hit.status, FakeHeaders(hit.headers))

    async def put(self, url: str, response: FakeJsResponse) -> None:
        reader = response.body.getReader()

        async def chunks() -> Any:
            while not (result := await reader.read()).done:
                yield result.value.to_bytes()

        try:
            await self.store.put(url, response.status, response.headers.values, chunks())
        except ValueError as exc:
            raise JsException(f"TypeError: {exc}") from exc


@contextmanager
def installed() -> Iterator[types.SimpleNamespace]:
    """Install the fake modules into sys.modules for the duration of a test."""
    js = types.ModuleType("js")
    js.Object = types.SimpleNamespace(fromEntries=_from_entries, entries=_entries)  # type: ignore[attr-defined]
    js.Date = FakeDate  # type: ignore[attr-defined]
    js.caches = FakeCacheStorage()  # type: ignore[attr-defined]
    js.Request = FakeRequest  # type: ignore[attr-defined]
    js.Response = FakeJsResponse  # type: ignore[attr-defined]
    js.ReadableStream = FakeReadableStream  # type: ignore[attr-defined]
    js.null = jsnull  # type: ignore[attr-defined]
    pyodide = types.ModuleType("pyodide")
    ffi = types.ModuleType("pyodide.ffi")
    ffi.JsException = JsException  # type: ignore[attr-defined]
    ffi.create_proxy = lambda obj: obj  # type: ignore[attr-defined]
    ffi.to_js = to_js  # type: ignore[attr-defined]
    ffi.jsnull = jsnull  # type: ignore[attr-defined]
    pyodide.ffi = ffi  # type: ignore[attr-defined]
    workers = types.ModuleType("workers")
    workers.Response = FakeResponse  # type: ignore[attr-defined]
    modules = {"js": js, "pyodide": pyodide, "pyodide.ffi": ffi, "workers": workers}
    saved = {name: sys.modules.get(name) for name in modules}
    adapters = [name for name in sys.modules if name.startswith("edgellm.runtime.pyodide")]
    for name in adapters:
        del sys.modules[name]
    sys.modules.update(modules)
    try:
        yield types.SimpleNamespace(js=js, ffi=ffi, workers=workers)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for name in [n for n in sys.modules if n.startswith("edgellm.runtime.pyodide")]:
            del sys.modules[name]
