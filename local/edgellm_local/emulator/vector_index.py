"""Cloudflare Vectorize on SQLite: the semantic cache's index on the local edge, in the state
directory beside KV, with Vectorize's limits enforced so that code which passes here does not
fail there (developers.cloudflare.com/vectorize/platform/limits/: ids and namespaces at most
64 bytes, metadata at most 10 KiB, topK at most 20 when metadata is returned, one dimension
per index).

The search is exact (a cosine over the namespace's rows, numpy on float32 blobs), which is what
an approximate index aims at; sqlite-vec would do the same inside SQLite, but the interpreter's
`sqlite3` here is built without extension loading. Not emulated: Vectorize's asynchronous
mutations (an upsert is seen at once here, seconds later there); the core never relies on
read-after-write, and `tests/support/fake_vectorize.py` holds it to that.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from edgellm.ports import BindingError, VectorMatch, VectorRecord

MAX_ID_BYTES = 64
MAX_NAMESPACE_BYTES = 64
MAX_METADATA_BYTES = 10 * 1024
MAX_TOP_K_WITH_METADATA = 20


class VectorizeLimitError(BindingError):
    """A call broke one of Vectorize's documented limits."""


@dataclass
class SqliteVectorIndex:
    """A Vectorize index (cosine) in one SQLite file (or `:memory:`)."""

    path: str | Path = ":memory:"
    dimensions: int | None = None  # fixed at creation on Vectorize; here by the first upsert when None
    _db: sqlite3.Connection = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if str(self.path) != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS vectors (id TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
                         "dims INTEGER NOT NULL, vals BLOB NOT NULL, metadata TEXT NOT NULL)")
        self._db.execute("CREATE INDEX IF NOT EXISTS vectors_namespace ON vectors (namespace)")
        if self.dimensions is None:
            row = self._db.execute("SELECT dims FROM vectors LIMIT 1").fetchone()
            self.dimensions = int(row[0]) if row else None

    def close(self) -> None:
        self._db.close()

    def _check_dimensions(self, size: int) -> None:
        if self.dimensions is None:
            self.dimensions = size
        elif size != self.dimensions:
            raise VectorizeLimitError(f"VECTOR_DIMENSION_MISMATCH: the index has {self.dimensions} dimensions, the vector {size}")

    async def upsert(self, records: list[VectorRecord]) -> None:
        import numpy as np

        rows = []
        for record in records:
            if not record.id or len(record.id.encode()) > MAX_ID_BYTES:
                raise VectorizeLimitError(f"VECTOR_ID_TOO_LONG: ids are 1 to {MAX_ID_BYTES} bytes")
            if len(record.namespace.encode()) > MAX_NAMESPACE_BYTES:
                raise VectorizeLimitError(f"NAMESPACE_TOO_LONG: namespaces are at most {MAX_NAMESPACE_BYTES} bytes")
            metadata = json.dumps(dict(record.metadata), separators=(",", ":"), ensure_ascii=False)
            if len(metadata.encode()) > MAX_METADATA_BYTES:
                raise VectorizeLimitError(f"METADATA_TOO_LARGE: at most {MAX_METADATA_BYTES} bytes of metadata a vector")
            self._check_dimensions(len(record.values))
            rows.append((record.id, record.namespace, len(record.values), np.asarray(record.values, dtype="<f4").tobytes(), metadata))
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO vectors (id, namespace, dims, vals, metadata) VALUES (?, ?, ?, ?, ?)", rows)

    async def delete_by_ids(self, ids: list[str]) -> None:
        with self._lock:
            self._db.executemany("DELETE FROM vectors WHERE id = ?", [(i,) for i in ids])

    async def query(self, vector: list[float], *, top_k: int, namespace: str,
                    filter: Mapping[str, str] | None = None) -> list[VectorMatch]:
        import numpy as np

        if not 1 <= top_k <= MAX_TOP_K_WITH_METADATA:
            raise VectorizeLimitError(f"topK must be 1 to {MAX_TOP_K_WITH_METADATA} when metadata is returned")
        if self.dimensions is not None and len(vector) != self.dimensions:
            raise VectorizeLimitError(f"VECTOR_DIMENSION_MISMATCH: the index has {self.dimensions} dimensions, the query {len(vector)}")
        sql, args = "SELECT id, vals, metadata FROM vectors WHERE namespace = ?", [namespace]
        for name, value in (filter or {}).items():  # an indexed string property, `$eq`
            sql += " AND json_extract(metadata, ?) = ?"
            args += [f"$.{name}", value]
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        if not rows:
            return []
        matrix = np.frombuffer(b"".join(r[1] for r in rows), dtype="<f4").reshape(len(rows), -1)
        query = np.asarray(vector, dtype=np.float32)
        norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(query) or 1.0)
        scores = (matrix @ query) / np.where(norms == 0, 1.0, norms)
        best = np.argsort(-scores)[:top_k]
        return [VectorMatch(rows[i][0], float(scores[i]), _metadata(rows[i][2])) for i in best]


def _metadata(raw: str) -> dict[str, Any]:
    return json.loads(raw)
