"""Cloudflare Vectorize on SQLite: the semantic cache's index on the local edge, in the state
directory beside KV, with Vectorize's limits enforced so that code which passes here does not
fail there (developers.cloudflare.com/vectorize/platform/limits/: ids and namespaces at most
64 bytes, metadata at most 10 KiB, topK at most 20 when metadata is returned, one dimension
per index).

The index is sqlite-vec's `vec0` virtual table, so that the search runs inside SQLite, over the
same file the edge keeps, rather than in Python over every row of a namespace. Its shape follows
Vectorize's, so that a query costs what it costs there: the namespace is a partition key (a
query never reads another namespace), the property the edge filters on (`context`) is a
metadata column applied inside the KNN, and the whole metadata rides along as an auxiliary
column. The search is exact, which is what Vectorize's approximate index aims at.

The stdlib `sqlite3` may be built without extension loading (it is here), so the connection
comes from `pysqlite3` when it is installed.

Not emulated: Vectorize's asynchronous mutations (an upsert is seen at once here, seconds later
there); the core never relies on read-after-write, and `tests/support/fake_vectorize.py` holds
it to that.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import sqlite_vec

from edgellm.ports import BindingError, VectorMatch, VectorRecord

try:
    from pysqlite3 import dbapi2 as sqlite3
except ImportError:  # no wheel for this platform: the stdlib one, if it can load extensions
    import sqlite3  # type: ignore[no-redef]

MAX_ID_BYTES = 64
MAX_NAMESPACE_BYTES = 64
MAX_METADATA_BYTES = 10 * 1024
MAX_TOP_K_WITH_METADATA = 20

TABLE = "vectorize"
LEGACY_TABLE = "vectors"  # the plain table (float32 blobs) this file held before it was a vec0 index
FILTERED_PROPERTY = "context"  # the one property the edge filters on (its Vectorize metadata index)
# Vectors a vec0 chunk holds. sqlite-vec allocates a whole chunk per partition (namespace) at its
# first vector: its default, 1024, is 1.5 MiB at 384 dimensions for a namespace that may hold a
# handful of entries; 128 is 200 KiB, and measured within 5% of it on a query over 10,000 vectors.
CHUNK_SIZE = 128

_log = logging.getLogger("edgellm")


class VectorizeLimitError(BindingError):
    """A call broke one of Vectorize's documented limits."""


@dataclass
class SqliteVectorIndex:
    """A Vectorize index (cosine) in one SQLite file (or `:memory:`)."""

    path: str | Path = ":memory:"
    dimensions: int | None = None  # fixed at creation on Vectorize; here by the first upsert when None
    _db: sqlite3.Connection = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _table_seen: bool = field(default=False, init=False, repr=False)  # the vec0 table exists (it is never dropped)

    def __post_init__(self) -> None:
        if str(self.path) != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = _connect(str(self.path))
        self._db.execute("PRAGMA journal_mode=WAL")
        if _has_legacy_table(self._db):
            self._migrate_legacy()
        stored = _table_dimensions(self._db)
        if stored is not None:
            if self.dimensions not in (None, stored):
                raise VectorizeLimitError(f"VECTOR_DIMENSION_MISMATCH: the index has {stored} dimensions, not {self.dimensions}")
            self.dimensions = stored
        elif self.dimensions is not None:
            with _transaction(self._db):
                self._create_table(self.dimensions)

    def close(self) -> None:
        self._db.close()

    def _check_dimensions(self, size: int) -> None:
        if self.dimensions is None:
            self.dimensions = size
        elif size != self.dimensions:
            raise VectorizeLimitError(f"VECTOR_DIMENSION_MISMATCH: the index has {self.dimensions} dimensions, the vector {size}")

    async def upsert(self, records: list[VectorRecord]) -> None:
        rows: dict[str, _Row] = {}  # by id: a repeated id in one call, the last wins
        for record in records:
            if not record.id or len(record.id.encode()) > MAX_ID_BYTES:
                raise VectorizeLimitError(f"VECTOR_ID_TOO_LONG: ids are 1 to {MAX_ID_BYTES} bytes")
            if len(record.namespace.encode()) > MAX_NAMESPACE_BYTES:
                raise VectorizeLimitError(f"NAMESPACE_TOO_LONG: namespaces are at most {MAX_NAMESPACE_BYTES} bytes")
            metadata = json.dumps(dict(record.metadata), separators=(",", ":"), ensure_ascii=False)
            if len(metadata.encode()) > MAX_METADATA_BYTES:
                raise VectorizeLimitError(f"METADATA_TOO_LARGE: at most {MAX_METADATA_BYTES} bytes of metadata a vector")
            self._check_dimensions(len(record.values))
            rows[record.id] = (record.id, record.namespace, _float32(record.values), _filtered_hash(record.metadata), metadata)
        if rows:
            with self._lock, _transaction(self._db):
                self._create_table(self.dimensions)  # type: ignore[arg-type]  # set by the first record
                self._write(rows.values())

    def _has_table(self) -> bool:
        """Whether the vec0 table exists yet (another process may have made it): asked of the
        schema only until it does, not on every query."""
        if not self._table_seen:
            self._table_seen = _table_dimensions(self._db) is not None
        return self._table_seen

    async def delete_by_ids(self, ids: list[str]) -> None:
        with self._lock, _transaction(self._db):
            if self._has_table():
                self._db.executemany(f"DELETE FROM {TABLE} WHERE id = ?", [(i,) for i in ids])

    async def query(self, vector: list[float], *, top_k: int, namespace: str,
                    filter: Mapping[str, str] | None = None) -> list[VectorMatch]:
        if not 1 <= top_k <= MAX_TOP_K_WITH_METADATA:
            raise VectorizeLimitError(f"topK must be 1 to {MAX_TOP_K_WITH_METADATA} when metadata is returned")
        if self.dimensions is not None and len(vector) != self.dimensions:
            raise VectorizeLimitError(f"VECTOR_DIMENSION_MISMATCH: the index has {self.dimensions} dimensions, the query {len(vector)}")
        wanted = dict(filter or {})
        with self._lock:
            if not self._has_table():
                return []
            if set(wanted) <= {FILTERED_PROPERTY}:
                rows = self._nearest(_float32(vector), top_k, namespace, wanted)
            else:
                rows = self._nearest_scanning(_float32(vector), top_k, namespace, wanted)
        return [VectorMatch(id, _score(distance), metadata) for id, distance, metadata in rows]

    def _nearest(self, vector: bytes, top_k: int, namespace: str, wanted: Mapping[str, str]) -> list[_Match]:
        """The KNN inside vec0: the partition and the metadata column narrow it before ranking. Two
        values whose hashes collide (one in 2**64) would share the column; the metadata settles it."""
        sql = f"SELECT id, distance, metadata FROM {TABLE} WHERE embedding MATCH ? AND k = ? AND namespace = ?"
        args: list[Any] = [vector, top_k, namespace]
        if FILTERED_PROPERTY in wanted:
            sql += " AND context_hash = ?"
            args.append(_filtered_hash(wanted))
        rows = [(id, distance, json.loads(metadata)) for id, distance, metadata in self._db.execute(sql + " ORDER BY distance", args)]
        if all(_passes(metadata, wanted) for _, _, metadata in rows):
            return rows
        return self._nearest_scanning(vector, top_k, namespace, wanted)

    def _nearest_scanning(self, vector: bytes, top_k: int, namespace: str, wanted: Mapping[str, str]) -> list[_Match]:
        """A filter on a property with no column: every vector of the namespace ranked in SQLite,
        the stored metadata checked in that order until `top_k` pass. Slower, never approximate;
        the edge does not take this path."""
        cursor = self._db.execute(
            f"SELECT id, vec_distance_cosine(embedding, ?) AS distance, metadata FROM {TABLE} "
            "WHERE namespace = ? ORDER BY distance IS NULL, distance", (vector, namespace))
        found: list[_Match] = []
        for id, distance, metadata in cursor:
            stored = json.loads(metadata)
            if _passes(stored, wanted):
                found.append((id, distance, stored))
                if len(found) == top_k:
                    break
        cursor.close()
        return found

    def _create_table(self, dimensions: int) -> None:
        # The filtered property is held as a 64-bit hash: vec0 compares an integer column in place,
        # whereas a text one longer than 12 characters (a context is a 64-character digest) costs a
        # lookup per candidate: half a query's time over 10,000 vectors, measured.
        self._db.execute(f"CREATE VIRTUAL TABLE IF NOT EXISTS {TABLE} USING vec0(id text primary key, "
                         f"namespace text partition key, embedding float[{int(dimensions)}] distance_metric=cosine, "
                         f"context_hash integer, +metadata text, chunk_size={CHUNK_SIZE})")

    def _write(self, rows: Iterable[_Row]) -> None:
        """vec0 has no INSERT OR REPLACE: a full replace is a delete, then an insert (the caller's transaction)."""
        rows = list(rows)
        self._db.executemany(f"DELETE FROM {TABLE} WHERE id = ?", [(row[0],) for row in rows])
        self._db.executemany(f"INSERT INTO {TABLE} (id, namespace, embedding, context_hash, metadata) VALUES (?, ?, ?, ?, ?)", rows)

    def _migrate_legacy(self) -> None:
        """Moves a file's rows from the plain table into the vec0 one, once, in one transaction.
        Rows of another dimension than the index's could never be queried; they are dropped."""
        with self._lock, _transaction(self._db):
            if not _has_legacy_table(self._db):
                return  # another process opening the same file moved them first
            first = self._db.execute(f"SELECT dims FROM {LEGACY_TABLE} LIMIT 1").fetchone()
            dimensions = _table_dimensions(self._db) or self.dimensions or (int(first[0]) if first else None)
            if dimensions is not None:
                rows = [(id, namespace, vals, _filtered_hash(json.loads(metadata)), metadata)
                        for id, namespace, vals, metadata in self._db.execute(
                            f"SELECT id, namespace, vals, metadata FROM {LEGACY_TABLE} WHERE dims = ?", (dimensions,))]
                dropped = self._db.execute(f"SELECT count(*) FROM {LEGACY_TABLE} WHERE dims != ?", (dimensions,)).fetchone()[0]
                self._create_table(dimensions)
                self._write(rows)
                if dropped:
                    _log.warning("vector index %s: %d vectors of another dimension than %d dropped in the move to sqlite-vec",
                                 self.path, dropped, dimensions)
            self._db.execute(f"DROP TABLE {LEGACY_TABLE}")


_ABSENT = object()
_Row = tuple[str, str, bytes, int, str]  # id, namespace, vector, the filtered property's hash, metadata JSON
_Match = tuple[str, float | None, dict[str, Any]]  # id, cosine distance, metadata


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One transaction on an autocommit connection: a replace is never seen half done."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    if not hasattr(db, "enable_load_extension"):
        db.close()
        raise BindingError("the vector index needs sqlite-vec, and this sqlite3 cannot load extensions: "
                           "pip install pysqlite3-binary (Linux x86_64), or use a Python built with loadable SQLite extensions")
    db.enable_load_extension(True)
    try:
        sqlite_vec.load(db)
    finally:
        db.enable_load_extension(False)  # only sqlite-vec: nothing the file holds can load another
    return db


def _table_dimensions(db: sqlite3.Connection) -> int | None:
    """The index's dimension, as its vec0 table was created (None before the first vector)."""
    row = db.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    match = re.search(r"float\[(\d+)\]", row[0]) if row else None
    return int(match.group(1)) if match else None


def _has_legacy_table(db: sqlite3.Connection) -> bool:
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (LEGACY_TABLE,)).fetchone() is not None


def _float32(values: Iterable[float]) -> bytes:
    """sqlite-vec's vector format: little-endian float32."""
    values = tuple(values)
    return struct.pack(f"<{len(values)}f", *values)


def _passes(metadata: Mapping[str, Any], wanted: Mapping[str, str]) -> bool:
    """Vectorize's `$eq`: the property is there and equals the value (a string is never a number)."""
    return all(metadata.get(name, _ABSENT) == value for name, value in wanted.items())


def _filtered_hash(metadata: Mapping[str, Any]) -> int:
    """The filtered property as a signed 64-bit integer. It is hashed JSON-encoded, so that a string
    and a number that print alike differ; an absent property is hashed as the empty string, which
    no JSON value encodes to."""
    value = metadata.get(FILTERED_PROPERTY, _ABSENT)
    encoded = "" if value is _ABSENT else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return int.from_bytes(hashlib.blake2b(encoded.encode(), digest_size=8).digest(), "big", signed=True)


def _score(distance: float | None) -> float:
    # cosine distance is 1 - similarity; sqlite-vec has none for a zero vector, whose cosine is taken as 0
    return 0.0 if distance is None else 1.0 - float(distance)
