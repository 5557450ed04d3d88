"""Workers KV on SQLite, with the real service's limits enforced, so that code which passes
here does not fail on Cloudflare (a 30 s TTL, a 600-byte key, 2 KB of metadata, a second write
to the same key within a second all fail there).

Not emulated: KV's eventual consistency (a write is visible at once here, up to 60 s later
elsewhere); code must never rely on read-after-write, and the core does not. Emulated: a read's
`cacheTtl` (`get(key, cache_ttl=N)`), as the location's cache of reads answers it: a value read
with it is answered from memory for N seconds (its expiration still holds), so a write through
another connection to the file (another process) may be unseen that long, as a write from
another location would be; this namespace's own writes and deletes are seen at once.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.ports import BindingError, Clock, KVEntry, KVLimitError, KVRateLimited

from edgellm.deps import SystemClock

MAX_KEY_BYTES = 512
MAX_VALUE_BYTES = 25 * 1024 * 1024
MAX_METADATA_BYTES = 1024
MIN_TTL_SECONDS = 60
MAX_LIST_LIMIT = 1000
MIN_SECONDS_BETWEEN_WRITES = 1.0  # KV allows one write per second to the same key
MIN_CACHE_TTL = 60  # a read's cacheTtl floor (workers-runtime.md)
READ_CACHE_ENTRIES = 1024  # values the read cache holds at most, the oldest dropped first
READ_CACHE_MAX_VALUE = 16 * 1024  # larger values are read from the file every time (the cache stays under 16 MiB)


class KVUnavailable(BindingError):
    """The state directory cannot be written now (read-only, full): KV is down, a 503 to retry."""

    retryable = True


def check_key(key: str, operation: str = "PUT") -> None:
    """KV's key rules; the message names the refused `operation` as KV's own errors do."""
    size = len(key.encode())
    if size == 0:
        raise KVLimitError(f"KV {operation} failed: 400 Key names must not be empty.")
    if key in (".", ".."):
        raise KVLimitError(f"KV {operation} failed: 400 Illegal key name {key!r}.")
    if size > MAX_KEY_BYTES:
        raise KVLimitError(f"KV {operation} failed: 414 UTF-8 encoded length of {size} exceeds key length limit of {MAX_KEY_BYTES}.")


@dataclass
class SqliteKV:
    """A KV namespace in one SQLite file (or `:memory:`)."""

    path: str | Path = ":memory:"
    clock: Clock = field(default_factory=SystemClock)
    _db: sqlite3.Connection = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _last_write: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _reads: dict[str, tuple[KVEntry, float | None, float]] = field(default_factory=dict, init=False, repr=False)  # key -> (entry, expiration, read at)

    def __post_init__(self) -> None:
        if str(self.path) != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value BLOB NOT NULL, metadata TEXT, expiration REAL)"
        )

    def close(self) -> None:
        self._db.close()

    async def get(self, key: str, *, cache_ttl: int | None = None) -> KVEntry | None:
        check_key(key, "GET")
        if cache_ttl is not None:
            if isinstance(cache_ttl, bool) or int(cache_ttl) < MIN_CACHE_TTL:
                raise KVLimitError(f"KV GET failed: 400 Invalid cache_ttl of {cache_ttl}. Cache TTL must be at least {MIN_CACHE_TTL}.")
            now = self.clock.now()
            kept = self._reads.get(key)
            if kept is not None and now - kept[2] < cache_ttl and (kept[1] is None or kept[1] > now):
                return kept[0]
        with self._lock:
            row = self._db.execute("SELECT value, metadata, expiration FROM kv WHERE key = ?", (key,)).fetchone()
            if row is None:
                return None
            value, metadata, expiration = row
            if expiration is not None and expiration <= self.clock.now():
                self._db.execute("DELETE FROM kv WHERE key = ? AND expiration = ?", (key, expiration))
                self._reads.pop(key, None)
                return None
            entry = KVEntry(bytes(value), json.loads(metadata) if metadata else None)
            if cache_ttl is not None and len(entry.value) <= READ_CACHE_MAX_VALUE:
                self._keep_read(key, entry, expiration)  # under the lock: a write cannot land between the read and this
        return entry

    def _keep_read(self, key: str, entry: KVEntry, expiration: float | None) -> None:
        reads = self._reads
        reads.pop(key, None)
        if len(reads) >= READ_CACHE_ENTRIES:
            del reads[next(iter(reads))]
        reads[key] = (entry, expiration, self.clock.now())

    async def put(
        self, key: str, value: bytes, *, expiration_ttl: int | None = None, metadata: dict[str, Any] | None = None,
        expiration: float | None = None,
    ) -> None:
        check_key(key)
        if isinstance(value, str):
            value = value.encode()
        if len(value) > MAX_VALUE_BYTES:
            raise KVLimitError(f"KV PUT failed: 413 Value length of {len(value)} exceeds limit of {MAX_VALUE_BYTES}.")
        meta = None if metadata is None else json.dumps(metadata, separators=(",", ":"))
        if meta is not None and len(meta.encode()) > MAX_METADATA_BYTES:
            raise KVLimitError(f"KV PUT failed: 413 Metadata length of {len(meta.encode())} exceeds limit of {MAX_METADATA_BYTES}.")
        now = self.clock.now()
        expires_at = None
        if expiration_ttl is not None:
            if isinstance(expiration_ttl, bool) or int(expiration_ttl) < MIN_TTL_SECONDS:
                raise KVLimitError(
                    f"KV PUT failed: 400 Invalid expiration_ttl of {expiration_ttl}. Expiration TTL must be at least {MIN_TTL_SECONDS}."
                )
            expires_at = now + int(expiration_ttl)
        elif expiration is not None:
            if expiration < now + MIN_TTL_SECONDS:
                raise KVLimitError(
                    f"KV PUT failed: 400 Invalid expiration of {int(expiration)}. Expiration times must be at least {MIN_TTL_SECONDS} seconds in the future."
                )
            expires_at = float(expiration)
        with self._lock:
            last = self._last_write.get(key)
            if last is not None and now - last < MIN_SECONDS_BETWEEN_WRITES:
                raise KVRateLimited("KV PUT failed: 429 Too Many Requests (one write per second to the same key)")
            if len(self._last_write) > 4096:  # only the last second matters: forget older writes
                self._last_write = {k: t for k, t in self._last_write.items() if now - t < MIN_SECONDS_BETWEEN_WRITES}
            try:
                self._db.execute(
                    "INSERT OR REPLACE INTO kv (key, value, metadata, expiration) VALUES (?, ?, ?, ?)",
                    (key, sqlite3.Binary(value), meta, expires_at),
                )
            except sqlite3.Error as exc:  # a read-only or full state directory: KV is down, not a bug
                raise KVUnavailable(f"KV PUT failed: 503 {exc}") from exc
            finally:
                self._reads.pop(key, None)  # this namespace's own write is seen at once
            self._last_write[key] = now

    async def delete(self, key: str) -> None:
        check_key(key, "DELETE")
        with self._lock:
            self._reads.pop(key, None)
            try:
                self._db.execute("DELETE FROM kv WHERE key = ?", (key,))
            except sqlite3.Error as exc:
                raise KVUnavailable(f"KV DELETE failed: 503 {exc}") from exc

    async def list(self, prefix: str = "", limit: int = MAX_LIST_LIMIT, cursor: str | None = None) -> dict[str, Any]:
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise KVLimitError(f"KV LIST failed: 400 Invalid limit {limit}; it must be between 1 and {MAX_LIST_LIMIT}.")
        after = cursor or ""
        now = self.clock.now()
        with self._lock:
            rows = self._db.execute(
                "SELECT key, metadata, expiration FROM kv WHERE key > ? AND substr(key, 1, ?) = ? "
                "AND (expiration IS NULL OR expiration > ?) ORDER BY key LIMIT ?",
                (after, len(prefix), prefix, now, limit + 1),
            ).fetchall()
        page, more = rows[:limit], len(rows) > limit
        keys = []
        for name, metadata, expiration in page:
            item: dict[str, Any] = {"name": name}
            if expiration is not None:
                item["expiration"] = int(expiration)
            if metadata:
                item["metadata"] = json.loads(metadata)
            keys.append(item)
        result: dict[str, Any] = {"keys": keys, "list_complete": not more}
        if more:
            result["cursor"] = page[-1][0]
        return result
