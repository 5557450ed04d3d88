"""R2 behind the data centre's cache: a `BlobStore` that reads pinned versions through an `EdgeCache`.

A `get` pinned to one version (`only_if=R2Conditional(etag_matches=...)`, which is how the
artifact routes read bodies) is looked up in the cache under a URL holding the key AND the
ETag, so a republished file can never be served stale and nothing needs purging. The cache
answers ranges itself (206 cut from a stored full 200). On a miss, a full read of an object up
to `max_bytes` is copied into the cache in the background (`wait_until`) while the client
reads it; ranged reads are not cached (the Cache API refuses to store a 206). Everything else
(head, put, delete, list, unpinned reads) goes straight to the store.

The cache is an optimisation: a failed or odd answer (no description, a range ignored) falls
back to the store, so the wrong bytes are never sent.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable
from urllib.parse import quote

from ..ports import BlobStore, CachedResponse, EdgeCache, R2Conditional, R2Object, R2Range
from ..stream import close_source
from .conditional import parse_content_range, range_header

CACHE_HOST = "https://r2.edgellm.internal/"
# The copy buffers whatever the slower of its two readers has not taken yet, in isolate memory
# (128 MB in all): only objects this small are copied into the cache (manifests, tokenizers,
# small shards); larger shards stream from R2 every time.
CACHE_MAX_BYTES = 8 * 1024 * 1024
DESCRIPTION_HEADER = "x-edgellm-r2-object"


def cache_url(key: str, etag: str) -> str:
    return f"{CACHE_HOST}{quote(key)}?etag={quote(etag)}"


def pinned_etag(cond: R2Conditional | None) -> str | None:
    """The one version a conditional read asks for, if it asks for exactly one."""
    if cond is None or cond.etag_does_not_match or cond.uploaded_before or cond.uploaded_after:
        return None
    return cond.etag_matches.strip('"') if cond.etag_matches and "," not in cond.etag_matches else None


def describe(obj: R2Object) -> str:
    return json.dumps({"key": obj.key, "size": obj.size, "etag": obj.etag, "uploaded": obj.uploaded,
                       "http_metadata": obj.http_metadata, "custom_metadata": obj.custom_metadata,
                       "checksum_sha256": obj.checksum_sha256}, separators=(",", ":"))


@dataclass
class Tee:
    """One body read twice: by the client and by the cache copy. Each branch gets every chunk;
    the source is pulled by whichever branch is ahead (one at a time), and closing both branches
    closes the source. Both branches belong to the request that made them (the copy runs in its
    `waitUntil`), as a JS `tee()` does."""

    source: AsyncIterator[bytes]
    _buffers: tuple[list[bytes], list[bytes]] = field(default_factory=lambda: ([], []))
    _open: list[bool] = field(default_factory=lambda: [True, True])
    _ended: bool = False
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def branches(self) -> tuple["TeeBranch", "TeeBranch"]:
        return TeeBranch(self, 0), TeeBranch(self, 1)

    async def _next(self, side: int) -> bytes:
        while True:
            if self._buffers[side]:
                return self._buffers[side].pop(0)
            if self._ended:
                raise StopAsyncIteration
            async with self._lock:
                if self._buffers[side] or self._ended:
                    continue
                try:
                    chunk = await anext(self.source)
                except StopAsyncIteration:
                    self._ended = True
                    continue
                for other, is_open in enumerate(self._open):
                    if is_open:
                        self._buffers[other].append(chunk)

    async def _close(self, side: int) -> None:
        self._open[side] = False
        self._buffers[side].clear()
        if not any(self._open) and not self._ended:
            self._ended = True
            await close_source(self.source)


@dataclass
class TeeBranch:
    tee: Tee
    side: int

    def __aiter__(self) -> "TeeBranch":
        return self

    async def __anext__(self) -> bytes:
        if not self.tee._open[self.side]:
            raise StopAsyncIteration
        return await self.tee._next(self.side)

    async def aclose(self) -> None:
        if self.tee._open[self.side]:
            await self.tee._close(self.side)


@dataclass
class CachedBlobStore:
    """`store` (R2) with `cache` in front for pinned reads; `wait_until` keeps the copy going
    after the response (without it the cache is only read)."""

    store: BlobStore
    cache: EdgeCache
    wait_until: Callable[[Awaitable[Any]], None] | None = None
    max_bytes: int = CACHE_MAX_BYTES

    async def head(self, key: str) -> R2Object | None:
        return await self.store.head(key)

    async def get(self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None) -> R2Object | None:
        etag = pinned_etag(only_if)
        if etag:
            hit = await self._match(key, etag, range)
            if hit is not None:
                return hit
        obj = await self.store.get(key, range=range, only_if=only_if)
        if obj is not None and etag and range is None and obj.body is not None and obj.size <= self.max_bytes:
            self._copy(key, obj)
        return obj

    async def put(self, key: str, data: bytes | AsyncIterator[bytes], **options: Any) -> R2Object:
        return await self.store.put(key, data, **options)

    async def delete(self, key: str) -> None:
        await self.store.delete(key)

    async def list(self, prefix: str = "", **options: Any) -> dict[str, Any]:
        return await self.store.list(prefix, **options)

    async def _match(self, key: str, etag: str, rng: R2Range | None) -> R2Object | None:
        headers = {"range": range_header(rng.offset, rng.length, rng.suffix)} if rng is not None else {}
        try:
            hit = await self.cache.match(cache_url(key, etag), headers)
        except Exception:  # the cache is an optimisation: any failure falls back to R2
            return None
        if hit is None:
            return None
        return await _object_of(hit, rng)

    def _copy(self, key: str, obj: R2Object) -> None:
        if self.wait_until is None or obj.body is None:
            return
        to_client, to_cache = Tee(obj.body).branches()
        obj.body = to_client
        headers = {
            "content-length": str(obj.size),
            "etag": obj.http_etag,
            "cache-control": "public, max-age=604800",  # the key holds the ETag: entries never go stale
            DESCRIPTION_HEADER: describe(obj),
        }
        self.wait_until(self._put(cache_url(key, obj.etag), headers, to_cache))

    async def _put(self, url: str, headers: dict[str, str], body: TeeBranch) -> None:
        try:
            await self.cache.put(url, 200, headers, body)
        except Exception:
            pass  # a full or unavailable cache costs a later R2 read, nothing else
        finally:
            await body.aclose()


async def _object_of(hit: CachedResponse, rng: R2Range | None) -> R2Object | None:
    """The cached answer as an `R2Object`, or None (its body closed) when it cannot be trusted."""
    partial = parse_content_range(hit.headers.get("content-range"))
    try:
        described = hit.headers.get(DESCRIPTION_HEADER)
        if described is None or (rng is not None and (hit.status != 206 or not partial)):
            raise ValueError("no description, or the cache ignored the range")
        obj = R2Object(**json.loads(described))
    except (ValueError, TypeError):  # never send the wrong bytes: fall back to R2
        await close_source(hit.body)
        return None
    if partial:
        first, last, _total = partial
        obj.range = (first, last - first + 1)
    obj.body = hit.body
    return obj
