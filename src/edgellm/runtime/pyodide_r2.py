"""R2 on the Worker: the `BlobStore` port over the real bucket binding, and the `EdgeCache`
port over the Cache API (the core's `CachedBlobStore` puts the one in front of the other).

Runtime facts it relies on (../shared/docs/workers-runtime.md): every options object goes
through `to_js(..., dict_converter=Object.fromEntries)` (a plain dict silently breaks ranges);
a miss is `jsnull`; `put` needs `to_js(bytes)`; a failed `onlyIf` returns an object without
`body`; `Response(obj.body)` streams an R2 body straight out, so the body object carries the JS
stream as `js_stream` for `to_native_response` and is only read in Python if the core iterates it.
The Cache API answers a Range itself (206 from a stored full 200) and refuses to store a 206.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

from ..ports import BindingError, CachedResponse, R2Conditional, R2Object, R2Range
from .pyodide_toolbox import is_missing, js_options, read_stream, to_native_body

CACHE_NAME = "edgellm-artifacts"
_RETRYABLE = ("(10001)", "(10043)", "(10058)")  # internal error, unavailable, too many requests


def r2_error(exc: BaseException) -> BindingError:
    message = str(getattr(exc, "message", None) or exc)
    error = BindingError(message)
    error.retryable = any(code in message for code in _RETRYABLE)
    return error


class R2Body:
    """An R2 (or cached) body: iterable in Python, or handed to the Response as `js_stream`."""

    def __init__(self, stream: Any) -> None:
        self.js_stream = stream
        self._chunks: AsyncIterator[bytes] | None = None

    def __aiter__(self) -> "R2Body":
        return self

    async def __anext__(self) -> bytes:
        if self._chunks is None:
            self._chunks = read_stream(self.js_stream)
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()  # type: ignore[attr-defined]
        else:
            try:
                await self.js_stream.cancel()
            except JsException:
                pass


def _entries(proxy: Any) -> dict[str, str]:
    if proxy is None or is_missing(proxy):
        return {}
    return {str(k): str(v) for k, v in (tuple(e) for e in js.Object.entries(proxy)) if not is_missing(v)}


def _checksum(obj: Any) -> str | None:
    checksums = getattr(obj, "checksums", None)
    if checksums is None or is_missing(checksums):
        return None
    value = getattr(checksums.toJSON(), "sha256", None)
    return None if value is None or is_missing(value) else str(value)


def to_r2_object(obj: Any) -> R2Object:
    """A JS R2Object / R2ObjectBody as the port's `R2Object` (the body only if R2 sent one)."""
    result = R2Object(
        key=str(obj.key), size=int(obj.size), etag=str(obj.etag), uploaded=float(obj.uploaded.getTime()) / 1000,
        http_metadata=_entries(getattr(obj, "httpMetadata", None)),
        custom_metadata=_entries(getattr(obj, "customMetadata", None)),
        checksum_sha256=_checksum(obj),
    )
    returned = getattr(obj, "range", None)
    if returned is not None and not is_missing(returned) and getattr(returned, "offset", None) is not None:
        result.range = (int(returned.offset), int(returned.length))
    body = getattr(obj, "body", None)
    if body is not None and not is_missing(body):
        result.body = R2Body(body)
    return result


def _range_options(rng: R2Range) -> dict[str, int]:
    # every field given goes to R2, which refuses a suffix with an offset or length (never reshaped here)
    return {k: v for k, v in (("offset", rng.offset), ("length", rng.length), ("suffix", rng.suffix)) if v is not None}


def _only_if_options(cond: R2Conditional) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if cond.etag_matches is not None:
        options["etagMatches"] = cond.etag_matches
    if cond.etag_does_not_match is not None:
        options["etagDoesNotMatch"] = cond.etag_does_not_match
    if cond.uploaded_before is not None:
        options["uploadedBefore"] = js.Date.new(cond.uploaded_before * 1000)
    if cond.uploaded_after is not None:
        options["uploadedAfter"] = js.Date.new(cond.uploaded_after * 1000)
    return options


@dataclass
class WorkersR2:
    binding: Any

    async def head(self, key: str) -> R2Object | None:
        try:
            obj = await self.binding.head(key)
        except JsException as exc:
            raise r2_error(exc) from exc
        return None if is_missing(obj) else to_r2_object(obj)

    async def get(
        self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None
    ) -> R2Object | None:
        options: dict[str, Any] = {}
        if range is not None:
            options["range"] = _range_options(range)
        if only_if is not None:
            options["onlyIf"] = _only_if_options(only_if)
        try:
            obj = await self.binding.get(key, js_options(options))
        except JsException as exc:
            raise r2_error(exc) from exc
        return None if is_missing(obj) else to_r2_object(obj)

    async def put(
        self,
        key: str,
        data: bytes | AsyncIterator[bytes],
        *,
        http_metadata: dict[str, str] | None = None,
        custom_metadata: dict[str, str] | None = None,
        sha256: str | None = None,
    ) -> R2Object:
        if not isinstance(data, (bytes, bytearray)):
            # R2 only streams a body of known length (FixedLengthStream); publishing goes through
            # wrangler, so a Worker-side put of an iterator is small enough to gather.
            data = b"".join([chunk async for chunk in data])
        options: dict[str, Any] = {}
        if http_metadata:
            options["httpMetadata"] = http_metadata
        if custom_metadata:
            options["customMetadata"] = custom_metadata
        if sha256:
            options["sha256"] = sha256
        try:
            obj = await self.binding.put(key, to_js(bytes(data)), js_options(options))
        except JsException as exc:
            raise r2_error(exc) from exc
        return to_r2_object(obj)

    async def delete(self, key: str) -> None:
        try:
            await self.binding.delete(key)
        except JsException as exc:
            raise r2_error(exc) from exc

    async def list(
        self, prefix: str = "", *, cursor: str | None = None, limit: int = 1000, delimiter: str | None = None
    ) -> dict[str, Any]:
        options: dict[str, Any] = {"prefix": prefix, "limit": limit, "include": ["httpMetadata", "customMetadata"]}
        if cursor:
            options["cursor"] = cursor
        if delimiter:
            options["delimiter"] = delimiter
        try:
            result = await self.binding.list(js_options(options))
        except JsException as exc:
            raise r2_error(exc) from exc
        truncated = bool(result.truncated)
        page: dict[str, Any] = {
            "objects": [to_r2_object(o) for o in result.objects],
            "truncated": truncated,
            "delimitedPrefixes": [str(p) for p in result.delimitedPrefixes],
        }
        if truncated:
            page["cursor"] = str(result.cursor)
        return page


@dataclass
class WorkersEdgeCache:
    """The `EdgeCache` port over `caches.open(name)`: the data centre's cache, per colo."""

    name: str = CACHE_NAME

    async def match(self, url: str, headers: Mapping[str, str]) -> CachedResponse | None:
        try:
            cache = await js.caches.open(self.name)
            hit = await cache.match(js.Request.new(url, js_options({"headers": dict(headers)})))
        except JsException:
            return None  # the cache is an optimisation: any failure is a miss
        if hit is None or is_missing(hit):
            return None
        answered = {str(e[0]).lower(): str(e[1]) for e in hit.headers.entries()}
        return CachedResponse(int(hit.status), answered, R2Body(hit.body))

    async def put(self, url: str, status: int, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> None:
        try:
            declared = headers.get("content-length", "")
            native = to_native_body(body, int(declared) if declared.isdigit() else None)  # stored with its length, as served
            response = js.Response.new(native, js_options({"status": status, "headers": dict(headers)}))
            cache = await js.caches.open(self.name)
            await cache.put(url, response)
        except JsException:
            pass  # a full or unavailable cache costs a later R2 read, nothing else
