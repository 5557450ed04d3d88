"""The `BlobStore` contract, run against every implementation that can run here.

A new implementation joins by adding a factory to `IMPLEMENTATIONS`. The Workers adapter
(`WorkersR2`) runs on the stand-in Pyodide runtime over a JS-shaped bucket binding kept by the
local `FileR2`: options go as JS objects (dates as `Date`s), objects come back with
`uploaded.getTime()`, `checksums.toJSON()`, entries read with `Object.entries` and a body stream,
a miss is `jsnull`, and R2's refusals are `JsException`s the adapter turns into `BindingError`s.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

import pytest

from edgellm.ports import BindingError, BlobStore, R2Conditional, R2Object, R2Range
from edgellm_local.emulator.r2 import FileR2
from tests.conftest import ManualClock
from tests.support import fake_pyodide as fp


def _workers(root: Path, clock: ManualClock) -> BlobStore:
    from edgellm.runtime.pyodide_r2 import WorkersR2  # imported with the stand-in installed

    return WorkersR2(fp.JsR2Bucket(FileR2(root, clock=clock, chunk_size=4096)))


IMPLEMENTATIONS: dict[str, Callable[[Path, ManualClock], BlobStore]] = {
    "file": lambda root, clock: FileR2(root, clock=clock, chunk_size=4096),
    "workers": _workers,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def store(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[BlobStore]:
    if request.param == "workers":
        with fp.installed():
            yield IMPLEMENTATIONS[request.param](tmp_path / "bucket", clock)
    else:
        yield IMPLEMENTATIONS[request.param](tmp_path / "bucket", clock)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def read(obj: R2Object | None) -> bytes:
    assert obj is not None and obj.body is not None
    return b"".join([chunk async for chunk in obj.body])


async def pieces(data: bytes, size: int) -> AsyncIterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


DATA = bytes(range(256)) * 40  # 10240 bytes, several chunks


def test_put_then_get_round_trips_bytes_and_metadata(store: BlobStore, clock: ManualClock) -> None:
    put = run(store.put("a/b.bin", DATA, http_metadata={"contentType": "application/octet-stream"},
                        custom_metadata={"sha256": "x"}))
    assert put.etag == hashlib.md5(DATA).hexdigest()
    assert put.http_etag == f'"{put.etag}"'
    assert put.size == len(DATA) and put.uploaded == clock.now()

    async def check() -> None:
        got = await store.get("a/b.bin")
        assert got is not None
        assert (got.size, got.etag, got.range) == (len(DATA), put.etag, None)
        assert got.http_metadata == {"contentType": "application/octet-stream"}
        assert got.custom_metadata == {"sha256": "x"}
        assert got.checksum_sha256 is None  # R2 reports a SHA-256 only when the uploader gave one
        assert await read(got) == DATA

    run(check())


def test_streamed_put_with_checksum(store: BlobStore) -> None:
    digest = hashlib.sha256(DATA).hexdigest()
    put = run(store.put("k", pieces(DATA, 1000), sha256=digest))
    assert put.size == len(DATA) and put.checksum_sha256 == digest
    assert run(read_key(store, "k")) == DATA


async def read_key(store: BlobStore, key: str, **kwargs: Any) -> bytes:
    return await read(await store.get(key, **kwargs))


def test_checksum_mismatch_stores_nothing(store: BlobStore) -> None:
    run(store.put("k", b"old"))
    with pytest.raises(BindingError):
        run(store.put("k", pieces(DATA, 999), sha256="0" * 64))
    assert run(read_key(store, "k")) == b"old"
    with pytest.raises(BindingError):
        run(store.put("fresh", b"x", sha256=hashlib.sha256(b"y").hexdigest()))
    assert run(store.head("fresh")) is None


def test_missing_key_is_none(store: BlobStore) -> None:
    assert run(store.get("nope")) is None
    assert run(store.head("nope")) is None
    run(store.delete("nope"))  # deleting a missing key is not an error


def test_head_has_metadata_and_no_body(store: BlobStore) -> None:
    run(store.put("k", DATA))
    head = run(store.head("k"))
    assert head is not None and head.body is None and head.size == len(DATA)
    assert head.etag == hashlib.md5(DATA).hexdigest()


def test_overwrite_and_delete(store: BlobStore) -> None:
    run(store.put("k", b"one"))
    run(store.put("k", b"two!"))
    assert run(read_key(store, "k")) == b"two!"
    run(store.delete("k"))
    assert run(store.get("k")) is None


def test_reader_of_old_version_is_not_disturbed_by_overwrite(store: BlobStore) -> None:
    async def check() -> None:
        await store.put("k", DATA)
        old = await store.get("k")
        await store.put("k", b"new")
        assert await read(old) == DATA
        assert await read_key(store, "k") == b"new"

    run(check())


RANGES = [
    (R2Range(offset=2, length=3), (2, 3)),
    (R2Range(offset=0, length=1), (0, 1)),
    (R2Range(offset=10000), (10000, 240)),
    (R2Range(offset=10230, length=100), (10230, 10)),  # a length past the end is clipped
    (R2Range(suffix=4), (10236, 4)),
    (R2Range(suffix=99999), (0, 10240)),  # a suffix longer than the object is the whole object
    (R2Range(length=5), (0, 5)),
]


@pytest.mark.parametrize("rng, expected", RANGES)
def test_ranges(store: BlobStore, rng: R2Range, expected: tuple[int, int]) -> None:
    run(store.put("k", DATA))

    async def check() -> None:
        got = await store.get("k", range=rng)
        assert got is not None and got.range == expected and got.size == len(DATA)
        offset, length = expected
        assert await read(got) == DATA[offset : offset + length]

    run(check())


@pytest.mark.parametrize("rng", [R2Range(offset=20000), R2Range(offset=-1), R2Range(suffix=4, length=2)])
def test_invalid_ranges_raise(store: BlobStore, rng: R2Range) -> None:
    run(store.put("k", DATA))
    with pytest.raises(BindingError):
        run(store.get("k", range=rng))


def test_conditional_reads(store: BlobStore, clock: ManualClock) -> None:
    put = run(store.put("k", DATA))
    uploaded = put.uploaded
    cases = [
        (R2Conditional(etag_matches=put.etag), True),
        (R2Conditional(etag_matches=put.http_etag), True),  # quoted works too
        (R2Conditional(etag_matches="other"), False),
        (R2Conditional(etag_does_not_match=put.etag), False),
        (R2Conditional(etag_does_not_match="other"), True),
        (R2Conditional(uploaded_before=uploaded + 1), True),
        (R2Conditional(uploaded_before=uploaded - 1), False),
        (R2Conditional(uploaded_after=uploaded - 1), True),
        (R2Conditional(uploaded_after=uploaded + 1), False),
        # an ETag condition takes precedence over the date condition it pairs with (RFC 9110)
        (R2Conditional(etag_matches=put.etag, uploaded_before=uploaded - 1), True),
        (R2Conditional(etag_does_not_match="other", uploaded_after=uploaded + 1), True),
    ]

    async def check() -> None:
        for cond, passes in cases:
            got = await store.get("k", only_if=cond)
            assert got is not None, cond
            assert got.etag == put.etag and got.size == len(DATA)
            if passes:
                assert await read(got) == DATA, cond
            else:
                assert got.body is None, cond

    run(check())


def test_conditional_and_range_together(store: BlobStore) -> None:
    put = run(store.put("k", DATA))
    assert run(read_key(store, "k", range=R2Range(offset=5, length=5), only_if=R2Conditional(etag_matches=put.etag))) == DATA[5:10]
    failed = run(store.get("k", range=R2Range(offset=5, length=5), only_if=R2Conditional(etag_matches="x")))
    assert failed is not None and failed.body is None


def test_key_limits(store: BlobStore) -> None:
    longest = "k" * 1024
    run(store.put(longest, b"x"))
    assert run(read_key(store, longest)) == b"x"
    run(store.put("é" * 512, b"y"))  # 1024 bytes of UTF-8
    assert run(read_key(store, "é" * 512)) == b"y"
    for bad in ("k" * 1025, "é" * 513, ""):
        with pytest.raises(BindingError):
            run(store.put(bad, b"x"))
        with pytest.raises(BindingError):
            run(store.get(bad))


def test_list_pages_through_every_key(store: BlobStore) -> None:
    keys = sorted(f"models/m{i:02d}/manifest.json" for i in range(25)) + ["other"]
    for key in keys:
        run(store.put(key, key.encode()))
    seen: list[str] = []
    cursor = None
    while True:
        page = run(store.list("models/", cursor=cursor, limit=10))
        seen += [o.key for o in page["objects"]]
        assert page["delimitedPrefixes"] == []
        if not page["truncated"]:
            break
        cursor = page["cursor"]
    assert seen == keys[:-1]
    first = run(store.list("models/", limit=10))["objects"][0]
    assert first.size == len(keys[0]) and first.body is None


def test_list_with_delimiter(store: BlobStore) -> None:
    for key in ["models/a/manifest.json", "models/a/blobs/sha256-1", "models/b/manifest.json",
                "models/c/x", "models/top.json", "elsewhere"]:
        run(store.put(key, b"."))
    page = run(store.list("models/", delimiter="/"))
    assert page["delimitedPrefixes"] == ["models/a/", "models/b/", "models/c/"]
    assert [o.key for o in page["objects"]] == ["models/top.json"]
    assert page["truncated"] is False

    prefixes: list[str] = []
    cursor = None
    while True:
        page = run(store.list("models/", delimiter="/", limit=1, cursor=cursor))
        prefixes += page["delimitedPrefixes"] + [o.key for o in page["objects"]]
        if not page["truncated"]:
            break
        cursor = page["cursor"]
    assert prefixes == ["models/a/", "models/b/", "models/c/", "models/top.json"]


@pytest.mark.parametrize("limit", [0, 1001])
def test_list_limit_bounds(store: BlobStore, limit: int) -> None:
    with pytest.raises(BindingError):
        run(store.list(limit=limit))


def test_file_r2_survives_reopen(tmp_path: Path, clock: ManualClock) -> None:
    """The local edge restarts over the same state directory."""
    run(FileR2(tmp_path / "b", clock=clock).put("k", DATA))
    assert run(read_key(FileR2(tmp_path / "b", clock=clock), "k")) == DATA
