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
        if self.cancelled or not self.stream.chunks:
            return types.SimpleNamespace(done=True, value=None)
        return types.SimpleNamespace(done=False, value=Uint8Array(self.stream.chunks.pop(0)))

    async def cancel(self) -> None:
        check_owner(self.stream.owner, "a ReadableStream")
        self.cancelled = True

    def releaseLock(self) -> None:  # noqa: N802 (JS name)
        self.released = True


@contextmanager
def installed() -> Iterator[types.SimpleNamespace]:
    """Install the fake modules into sys.modules for the duration of a test."""
    js = types.ModuleType("js")
    js.Object = types.SimpleNamespace(fromEntries=_from_entries)  # type: ignore[attr-defined]
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
