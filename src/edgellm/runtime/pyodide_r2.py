"""R2 on the Worker: the `BlobStore` port over the real bucket binding, with the Cache API in front.

Runtime facts it relies on (../shared/docs/workers-runtime.md): every options object goes
through `to_js(..., dict_converter=Object.fromEntries)` (a plain dict silently breaks ranges);
a miss is `jsnull`; `put` needs `to_js(bytes)`; a failed `onlyIf` returns an object without
`body`; `Response(obj.body)` streams an R2 body straight out, so the body object carries the JS
stream as `js_stream` for `to_native_response` and is only read in Python if the core iterates it.

Cache API: a `get` pinned to one version (`only_if=R2Conditional(etag_matches=...)`, which is
how the artifact routes read bodies) is looked up in the `edgellm-artifacts` cache under a URL
holding the key AND the ETag, so a republished file can never be served stale and nothing needs
purging. The cache answers ranges itself (206 from a stored full 200). On a miss, a full read of
an object up to `cache_max_bytes` is teed into the cache in the background (`wait_until`); ranged
reads are not cached (the Cache API refuses to store a 206).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable
from urllib.parse import quote

import js  # type: ignore[import-not-found]
from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

from ..artifacts.conditional import parse_content_range, range_header
from ..ports import BindingError, R2Conditional, R2Object, R2Range
from .pyodide import is_missing, js_options, read_stream

CACHE_NAME = "edgellm-artifacts"
CACHE_HOST = "https://r2.edgellm.internal/"
# The tee buffers whatever the slower of its two readers has not taken yet, in isolate memory
# (128 MB in all): only objects this small are copied into the cache (manifests, tokenizers,
# small shards); larger shards stream from R2 every time.
CACHE_MAX_BYTES = 8 * 1024 * 1024
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
    if rng.suffix is not None:
        return {"suffix": rng.suffix}
    return {k: v for k, v in (("offset", rng.offset), ("length", rng.length)) if v is not None}


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


def _pinned_etag(cond: R2Conditional | None) -> str | None:
    if cond is None or cond.etag_does_not_match or cond.uploaded_before or cond.uploaded_after:
        return None
    return cond.etag_matches.strip('"') if cond.etag_matches and "," not in cond.etag_matches else None


@dataclass
class WorkersR2:
    binding: Any
    wait_until: Callable[[Any], None] | None = None  # ctx.waitUntil; without it the cache is read-only
    cache_name: str | None = CACHE_NAME
    cache_max_bytes: int = CACHE_MAX_BYTES

    async def head(self, key: str) -> R2Object | None:
        try:
            obj = await self.binding.head(key)
        except JsException as exc:
            raise r2_error(exc) from exc
        return None if is_missing(obj) else to_r2_object(obj)

    async def get(
        self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None
    ) -> R2Object | None:
        etag = _pinned_etag(only_if) if self.cache_name else None
        if etag:
            hit = await self._cache_match(key, etag, range)
            if hit is not None:
                return hit
        options: dict[str, Any] = {}
        if range is not None:
            options["range"] = _range_options(range)
        if only_if is not None:
            options["onlyIf"] = _only_if_options(only_if)
        try:
            obj = await self.binding.get(key, js_options(options))
        except JsException as exc:
            raise r2_error(exc) from exc
        if is_missing(obj):
            return None
        result = to_r2_object(obj)
        if etag and range is None and result.body is not None and result.size <= self.cache_max_bytes:
            self._cache_put(key, result)
        return result

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

    # --- the Cache API in front of R2 ----------------------------------------------------

    @staticmethod
    def _cache_url(key: str, etag: str) -> str:
        return f"{CACHE_HOST}{quote(key)}?etag={quote(etag)}"

    async def _cache_match(self, key: str, etag: str, rng: R2Range | None) -> R2Object | None:
        headers = {}
        if rng is not None:
            headers["range"] = range_header(rng.offset, rng.length, rng.suffix)
        try:
            cache = await js.caches.open(self.cache_name)
            request = js.Request.new(self._cache_url(key, etag), js_options({"headers": headers}))
            hit = await cache.match(request)
        except JsException:
            return None  # the cache is an optimisation: any failure falls back to R2
        if hit is None or is_missing(hit):
            return None
        described = hit.headers.get("x-edgellm-r2-object")
        partial = parse_content_range(str(hit.headers.get("content-range") or ""))
        try:
            if is_missing(described) or (rng is not None and (hit.status != 206 or not partial)):
                raise ValueError("no description, or the cache ignored the range")
            obj = R2Object(**json.loads(str(described)))
        except (ValueError, TypeError):  # never send the wrong bytes: fall back to R2
            await R2Body(hit.body).aclose()
            return None
        if partial:
            first, last, _total = partial
            obj.range = (first, last - first + 1)
        obj.body = R2Body(hit.body)
        return obj

    def _cache_put(self, key: str, obj: R2Object) -> None:
        if self.wait_until is None or obj.body is None:
            return
        to_client, to_cache = obj.body.js_stream.tee()  # type: ignore[attr-defined]
        obj.body = R2Body(to_client)
        described = {
            "key": obj.key, "size": obj.size, "etag": obj.etag, "uploaded": obj.uploaded,
            "http_metadata": obj.http_metadata, "custom_metadata": obj.custom_metadata,
            "checksum_sha256": obj.checksum_sha256,
        }
        headers = {
            "content-length": str(obj.size),
            "etag": obj.http_etag,
            "cache-control": "public, max-age=604800",  # the key holds the ETag: entries never go stale
            "x-edgellm-r2-object": json.dumps(described, separators=(",", ":")),
        }
        try:
            response = js.Response.new(to_cache, js_options({"status": 200, "headers": headers}))
            self.wait_until(_put_in_cache(self.cache_name, self._cache_url(key, obj.etag), response))
        except JsException:
            pass


async def _put_in_cache(cache_name: str | None, url: str, response: Any) -> None:
    try:
        cache = await js.caches.open(cache_name)
        await cache.put(url, response)
    except JsException:
        pass  # a full or unavailable cache costs a later R2 read, nothing else
