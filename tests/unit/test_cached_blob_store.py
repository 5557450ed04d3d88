"""`CachedBlobStore`: R2 (the local `FileR2`) behind the data centre's cache (the local
`MemoryEdgeCache`, answering as the Cache API does), in the core, with no Workers runtime."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Mapping

import pytest

from edgellm.artifacts.cached_store import CachedBlobStore, cache_url
from edgellm.ports import CachedResponse, R2Conditional, R2Object, R2Range
from edgellm_local.emulator.edge_cache import MemoryEdgeCache
from edgellm_local.emulator.r2 import FileR2
from tests.conftest import ManualClock

DATA = bytes(range(256)) * 64  # 16 KiB, several 4 KiB chunks


@dataclass
class CountingR2:
    """The real local R2, counting the reads that reach it."""

    inner: FileR2
    gets: list[tuple[str, R2Range | None]] = field(default_factory=list)

    async def get(self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None) -> R2Object | None:
        self.gets.append((key, range))
        return await self.inner.get(key, range=range, only_if=only_if)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass
class Background:
    tasks: list[asyncio.Future[Any]] = field(default_factory=list)

    def __call__(self, awaitable: Awaitable[Any]) -> None:
        self.tasks.append(asyncio.ensure_future(awaitable))

    async def drain(self) -> None:
        await asyncio.gather(*self.tasks)


@pytest.fixture
def r2(tmp_path: Path) -> CountingR2:
    return CountingR2(FileR2(tmp_path / "bucket", clock=ManualClock(), chunk_size=4096))


async def read(obj: R2Object | None) -> bytes:
    assert obj is not None and obj.body is not None
    return b"".join([chunk async for chunk in obj.body])


def pinned(obj: R2Object) -> R2Conditional:
    return R2Conditional(etag_matches=obj.http_etag)


async def test_a_pinned_read_is_copied_once_then_served_from_the_cache_ranges_included(r2: CountingR2) -> None:
    cache, background = MemoryEdgeCache(), Background()
    store = CachedBlobStore(r2, cache, background)
    put = await store.put("models/m/blobs/a", DATA, http_metadata={"contentType": "application/octet-stream"})
    first = await store.get("models/m/blobs/a", only_if=pinned(put))
    assert await read(first) == DATA
    await background.drain()
    assert cache.puts == 1 and len(r2.gets) == 1
    again = await store.get("models/m/blobs/a", only_if=pinned(put))
    assert await read(again) == DATA and len(r2.gets) == 1  # R2 was not asked again
    assert again is not None and (again.etag, again.size, again.http_metadata) == (put.etag, put.size, put.http_metadata)
    part = await store.get("models/m/blobs/a", range=R2Range(offset=5000, length=300), only_if=pinned(put))
    assert await read(part) == DATA[5000:5300] and part is not None and part.range == (5000, 300)
    tail = await store.get("models/m/blobs/a", range=R2Range(suffix=10), only_if=pinned(put))
    assert await read(tail) == DATA[-10:] and tail is not None and tail.range == (len(DATA) - 10, 10)
    assert len(r2.gets) == 1 and cache.puts == 1


async def test_a_republished_object_is_never_served_stale(r2: CountingR2) -> None:
    background = Background()
    store = CachedBlobStore(r2, MemoryEdgeCache(), background)
    old = await store.put("k", b"old version")
    await read(await store.get("k", only_if=pinned(old)))
    await background.drain()
    new = await store.put("k", b"the new version")
    assert await read(await store.get("k", only_if=pinned(new))) == b"the new version"
    assert cache_url("k", old.etag) != cache_url("k", new.etag)


async def test_what_is_not_copied(r2: CountingR2) -> None:
    """Unpinned reads, ranged misses (a 206 is never stored), objects over the size cap, and a
    failed precondition (no body) all go to R2 and leave the cache empty."""
    cache, background = MemoryEdgeCache(), Background()
    store = CachedBlobStore(r2, cache, background, max_bytes=len(DATA) - 1)
    small = await store.put("small", b"tiny")
    big = await store.put("big", DATA)
    await read(await store.get("small"))
    await read(await store.get("small", range=R2Range(offset=1, length=2), only_if=pinned(small)))
    await read(await store.get("big", only_if=pinned(big)))
    failed = await store.get("small", only_if=R2Conditional(etag_matches='"not-it"'))
    assert failed is not None and failed.body is None
    await background.drain()
    assert cache.puts == 0


async def test_the_copy_completes_when_the_client_leaves_after_the_first_chunk(r2: CountingR2) -> None:
    cache, background = MemoryEdgeCache(), Background()
    store = CachedBlobStore(r2, cache, background)
    put = await store.put("k", DATA)
    obj = await store.get("k", only_if=pinned(put))
    assert obj is not None and obj.body is not None
    assert len(await anext(obj.body)) == 4096
    await obj.body.aclose()  # type: ignore[attr-defined]
    await background.drain()
    hit = await store.get("k", only_if=pinned(put))
    assert await read(hit) == DATA and len(r2.gets) == 1


@dataclass
class OddCache:
    """A cache answering what cannot be trusted: an entry without its description, or the whole
    200 when a range was asked; or failing outright."""

    answer: str
    closed: int = 0

    async def match(self, url: str, headers: Mapping[str, str]) -> CachedResponse | None:
        if self.answer == "fail":
            raise RuntimeError("cache unavailable")
        outer = self

        class Body:
            sent = False

            def __aiter__(self) -> "Body":
                return self

            async def __anext__(self) -> bytes:
                if self.sent:
                    raise StopAsyncIteration
                self.sent = True
                return b"WRONG BYTES"

            async def aclose(self) -> None:
                outer.closed += 1

        described = {} if self.answer == "undescribed" else {"x-edgellm-r2-object": '{"key": "k", "size": 4, "etag": "e", "uploaded": 0}'}
        return CachedResponse(200, described, Body())

    async def put(self, url: str, status: int, headers: Mapping[str, str], body: AsyncIterator[bytes]) -> None:
        raise RuntimeError("cache full")


@pytest.mark.parametrize("answer", ["undescribed", "range-ignored", "fail"])
async def test_an_untrustworthy_cache_answer_falls_back_to_r2(r2: CountingR2, answer: str) -> None:
    cache, background = OddCache(answer), Background()
    store = CachedBlobStore(r2, cache, background)
    put = await store.put("k", b"good")
    rng = R2Range(offset=1, length=2) if answer == "range-ignored" else None
    obj = await store.get("k", range=rng, only_if=pinned(put))
    assert await read(obj) == (b"oo" if rng else b"good") and len(r2.gets) == 1
    assert cache.closed == (0 if answer == "fail" else 1)  # the cached body it refused was closed
    await background.drain()  # a failing put costs nothing but the copy
