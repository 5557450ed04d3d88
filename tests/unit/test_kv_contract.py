"""SqliteKV against Workers KV's real limits, so code that passes locally does not fail on
Cloudflare: key <= 512 bytes, value <= 25 MiB, metadata <= 1024 bytes, TTL >= 60 s, an absolute
expiration >= 60 s ahead, list by prefix with cursor and limit, expiry, persistence.

Each promise is also held through the Workers adapter (`WorkersKV`) on the stand-in Pyodide
runtime, over a JS-shaped binding kept by the same local store: options become JS objects,
values `Uint8Array`s, misses `jsnull`, and KV's refusals `JsException`s the adapter must turn
back into the port's errors (`KVLimitError`, `KVRateLimited`) by their message alone."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from edgellm.ports import KVEntry, KVLimitError, KVRateLimited, KVStore
from edgellm_local.emulator.kv import SqliteKV
from tests.conftest import ManualClock
from tests.support import fake_pyodide as fp

MiB = 1024 * 1024


@pytest.fixture(params=["memory", "file", "workers"])
def kv(request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock) -> Iterator[SqliteKV]:
    store = SqliteKV(":memory:" if request.param != "file" else tmp_path / "state" / "kv.sqlite3", clock=clock)
    if request.param == "workers":
        with fp.installed():
            from edgellm.runtime.pyodide_kv import WorkersKV

            yield WorkersKV(fp.JsKVNamespace(store))  # type: ignore[misc]
    else:
        yield store
    store.close()


async def test_sqlite_kv_keeps_the_ports_promises(kv: SqliteKV, clock: ManualClock) -> None:
    """Through the port's own names only: what is put is got back with its metadata, a TTL
    expires it, list sees it by prefix, delete removes it."""
    store: KVStore = kv
    await store.put("p/a", b"1", expiration_ttl=60, metadata={"m": 1})
    await store.put("p/b", b"2")
    await store.put("q/c", b"3")
    assert await store.get("p/a") == KVEntry(b"1", {"m": 1})
    assert [k["name"] for k in (await store.list(prefix="p/"))["keys"]] == ["p/a", "p/b"]
    clock.advance(61)
    assert await store.get("p/a") is None and (await store.get("p/b")).value == b"2"  # type: ignore[union-attr]
    await store.delete("p/b")
    assert await store.get("p/b") is None and [k["name"] for k in (await store.list(prefix="p/"))["keys"]] == []


async def test_put_get_delete(kv: SqliteKV, clock: ManualClock) -> None:
    assert await kv.get("k") is None
    await kv.put("k", b"v1", metadata={"model": "m", "n": 1})
    assert await kv.get("k") == KVEntry(b"v1", {"model": "m", "n": 1})
    clock.advance(1)
    await kv.put("k", b"v2")  # last write wins, metadata included
    assert await kv.get("k") == KVEntry(b"v2", None)
    await kv.delete("k")
    assert await kv.get("k") is None
    await kv.delete("k")  # deleting a missing key is not an error


async def test_one_write_per_second_to_the_same_key(kv: SqliteKV, clock: ManualClock) -> None:
    await kv.put("k", b"v1")
    clock.advance(0.5)
    with pytest.raises(KVRateLimited, match="429"):
        await kv.put("k", b"v2")
    await kv.put("other", b"v")  # the limit is per key
    assert (await kv.get("k")).value == b"v1"  # type: ignore[union-attr]
    clock.advance(0.5)
    await kv.put("k", b"v2")
    assert (await kv.get("k")).value == b"v2"  # type: ignore[union-attr]


async def test_values_are_bytes_exactly(kv: SqliteKV) -> None:
    value = bytes(range(256)) * 3 + b"\x00"
    await kv.put("bin", value)
    assert (await kv.get("bin")).value == value  # type: ignore[union-attr]
    await kv.put("text", "caf\u00e9")  # type: ignore[arg-type]  # KV accepts strings too
    assert (await kv.get("text")).value == "caf\u00e9".encode()  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("a" * 512, True),
        ("a" * 513, False),
        ("\u00e9" * 256, True),  # 512 bytes in UTF-8
        ("\u00e9" * 256 + "a", False),  # 513 bytes: the limit counts bytes, not characters
        ("\U0001F600" * 128, True),
        ("\U0001F600" * 128 + "a", False),
        ("", False),
        (".", False),
        ("..", False),
        ("a/b c?d#e", True),
    ],
)
async def test_key_limits(kv: SqliteKV, key: str, ok: bool) -> None:
    if ok:
        await kv.put(key, b"v")
        assert (await kv.get(key)).value == b"v"  # type: ignore[union-attr]
        return
    with pytest.raises(KVLimitError) as info:
        await kv.put(key, b"v")
    assert "KV PUT failed" in str(info.value)
    if key:
        assert str(len(key.encode())) in str(info.value) or key in str(info.value)


async def test_value_limit_is_25_mib(kv: SqliteKV) -> None:
    await kv.put("big", b"x" * (25 * MiB))
    assert len((await kv.get("big")).value) == 25 * MiB  # type: ignore[union-attr]
    with pytest.raises(KVLimitError, match="413"):
        await kv.put("bigger", b"x" * (25 * MiB + 1))
    assert await kv.get("bigger") is None


@pytest.mark.parametrize(("size", "ok"), [(1024, True), (1025, False)])
async def test_metadata_limit_is_1024_bytes_of_json(kv: SqliteKV, size: int, ok: bool) -> None:
    overhead = len('{"m":""}')
    metadata = {"m": "x" * (size - overhead)}
    if ok:
        await kv.put("k", b"v", metadata=metadata)
        assert (await kv.get("k")).metadata == metadata  # type: ignore[union-attr]
    else:
        with pytest.raises(KVLimitError, match="Metadata"):
            await kv.put("k", b"v", metadata=metadata)


@pytest.mark.parametrize("ttl", [0, 1, 30, 59, -60])
async def test_ttl_below_60_seconds_is_rejected(kv: SqliteKV, ttl: int) -> None:
    with pytest.raises(KVLimitError, match="at least 60"):
        await kv.put("k", b"v", expiration_ttl=ttl)
    assert await kv.get("k") is None


async def test_ttl_expires_on_the_clock(kv: SqliteKV, clock: ManualClock) -> None:
    await kv.put("k", b"v", expiration_ttl=60)
    await kv.put("forever", b"v")
    clock.advance(59.9)
    assert await kv.get("k") is not None
    assert [k["name"] for k in (await kv.list())["keys"]] == ["forever", "k"]
    clock.advance(0.1)
    assert await kv.get("k") is None
    assert [k["name"] for k in (await kv.list())["keys"]] == ["forever"]
    clock.advance(10 * 365 * 86400)
    assert await kv.get("forever") is not None


async def test_a_rewrite_resets_or_clears_the_expiry(kv: SqliteKV, clock: ManualClock) -> None:
    await kv.put("k", b"v", expiration_ttl=60)
    clock.advance(50)
    await kv.put("k", b"v2", expiration_ttl=60)
    clock.advance(50)
    assert (await kv.get("k")).value == b"v2"  # type: ignore[union-attr]
    await kv.put("k", b"v3")
    clock.advance(1000)
    assert (await kv.get("k")).value == b"v3"  # type: ignore[union-attr]


@pytest.mark.parametrize(("ahead", "ok"), [(59, False), (0, False), (-10, False), (60, True), (3600, True)])
async def test_absolute_expiration_must_be_60_seconds_ahead(kv: SqliteKV, clock: ManualClock, ahead: int, ok: bool) -> None:
    at = clock.now() + ahead
    if not ok:
        with pytest.raises(KVLimitError, match="60 seconds in the future"):
            await kv.put("k", b"v", expiration=at)
        return
    await kv.put("k", b"v", expiration=at)
    assert (await kv.list())["keys"] == [{"name": "k", "expiration": int(at)}]
    clock.advance(ahead - 1)
    assert await kv.get("k") is not None
    clock.advance(1)
    assert await kv.get("k") is None


async def test_list_by_prefix_in_key_order_with_metadata_and_expiration(kv: SqliteKV, clock: ManualClock) -> None:
    for key in ("b/2", "a/1", "b/1", "b", "c/%_", "b/3"):
        await kv.put(key, b"v")
    await kv.put("b/4", b"v", metadata={"x": 1}, expiration_ttl=120)
    page = await kv.list(prefix="b/")
    assert page["list_complete"] is True and "cursor" not in page
    assert page["keys"] == [
        {"name": "b/1"}, {"name": "b/2"}, {"name": "b/3"},
        {"name": "b/4", "expiration": int(clock.now() + 120), "metadata": {"x": 1}},
    ]
    # SQL wildcards in a prefix are literal characters
    assert [k["name"] for k in (await kv.list(prefix="c/%"))["keys"]] == ["c/%_"]
    assert (await kv.list(prefix="c/_"))["keys"] == []
    assert (await kv.list(prefix="zzz"))["keys"] == []


async def test_list_pages_with_cursor_and_limit(kv: SqliteKV) -> None:
    keys = [f"k{i:03d}" for i in range(25)]
    for key in reversed(keys):
        await kv.put(key, b"v")
    await kv.put("other", b"v")
    seen, cursor, pages = [], None, 0
    while True:
        page = await kv.list(prefix="k", limit=10, cursor=cursor)
        pages += 1
        seen += [k["name"] for k in page["keys"]]
        if page["list_complete"]:
            break
        cursor = page["cursor"]
        assert isinstance(cursor, str) and cursor
    assert seen == keys
    assert pages == 3


async def test_list_limit_default_and_bounds(kv: SqliteKV) -> None:
    for i in range(1001):
        await kv.put(f"k{i:04d}", b"")
    page = await kv.list()
    assert len(page["keys"]) == 1000 and page["list_complete"] is False
    rest = await kv.list(cursor=page["cursor"])
    assert [k["name"] for k in rest["keys"]] == ["k1000"] and rest["list_complete"] is True
    for limit in (0, 1001, -1):
        with pytest.raises(KVLimitError):
            await kv.list(limit=limit)


async def test_state_persists_across_reopen(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "state" / "kv.sqlite3"
    first = SqliteKV(path, clock=clock)
    await first.put("kept", b"v", metadata={"a": 1})
    await first.put("expiring", b"v", expiration_ttl=60)
    first.close()
    clock.advance(61)
    second = SqliteKV(path, clock=clock)
    try:
        assert await second.get("kept") == KVEntry(b"v", {"a": 1})
        assert await second.get("expiring") is None  # expiry is stored as a time, not a timer
    finally:
        second.close()


@pytest.mark.parametrize("operation", ["GET", "PUT", "DELETE"])
async def test_a_refused_key_names_the_operation(kv: SqliteKV, operation: str) -> None:
    calls = {"GET": lambda: kv.get("a" * 513), "PUT": lambda: kv.put("a" * 513, b"v"), "DELETE": lambda: kv.delete("a" * 513)}
    with pytest.raises(KVLimitError, match=f"^KV {operation} failed: 414 "):
        await calls[operation]()


# --- a read's cacheTtl -------------------------------------------------------------------------


async def test_a_read_with_cache_ttl_sees_its_own_namespaces_writes_at_once(kv: SqliteKV, clock: ManualClock) -> None:
    """KV's `cacheTtl` (>= 60) may answer from an earlier read, but never hides this namespace's
    own write or delete, nor an expired value."""
    with pytest.raises(KVLimitError, match="at least 60"):
        await kv.get("k", cache_ttl=30)
    await kv.put("k", b"v1", expiration_ttl=120)
    assert (await kv.get("k", cache_ttl=60)).value == b"v1"  # type: ignore[union-attr]
    clock.advance(1)
    await kv.put("k", b"v2", expiration_ttl=120)
    assert (await kv.get("k", cache_ttl=60)).value == b"v2"  # type: ignore[union-attr]
    clock.advance(119.5)  # within the read's 60 s? no: past them; and the value expires at 121
    assert (await kv.get("k", cache_ttl=60)).value == b"v2"  # type: ignore[union-attr]
    clock.advance(1)
    assert await kv.get("k", cache_ttl=60) is None  # expired, even though read 1 s ago
    await kv.put("d", b"x")
    assert (await kv.get("d", cache_ttl=60)).value == b"x"  # type: ignore[union-attr]
    await kv.delete("d")
    assert await kv.get("d", cache_ttl=60) is None


async def test_a_read_with_cache_ttl_may_miss_another_connections_write_for_that_long(tmp_path: Path, clock: ManualClock) -> None:
    """As a write from another location: another process writing the same file (a second
    connection) is seen once the read's cacheTtl has passed, at once by a read without it."""
    path = tmp_path / "kv.sqlite3"
    here, there = SqliteKV(path, clock=clock), SqliteKV(path, clock=clock)
    await here.put("k", b"old")
    assert (await here.get("k", cache_ttl=60)).value == b"old"  # type: ignore[union-attr]
    clock.advance(1)
    await there.put("k", b"new")
    assert (await here.get("k", cache_ttl=60)).value == b"old"  # type: ignore[union-attr]  # the cached read
    assert (await here.get("k")).value == b"new"  # type: ignore[union-attr]  # no cacheTtl: the file
    clock.advance(60)
    assert (await here.get("k", cache_ttl=60)).value == b"new"  # type: ignore[union-attr]
    big = b"x" * (64 * 1024)  # past what the read cache holds: always from the file
    await here.put("big", big)
    assert (await here.get("big", cache_ttl=60)).value == big  # type: ignore[union-attr]
    clock.advance(1)
    await there.put("big", b"small")
    assert (await here.get("big", cache_ttl=60)).value == b"small"  # type: ignore[union-attr]
    here.close(), there.close()
