"""The local Vectorize stand-in (`SqliteVectorIndex`) holds Vectorize's contract: namespaces and
metadata filters partition it, an upsert replaces in full, scores are cosines best first, and
the documented limits are refused as Vectorize refuses them; and it is a sqlite-vec index whose
answers are a brute-force cosine ranking's."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import numpy as np
import pytest

from edgellm.ports import VectorRecord
from edgellm_local.emulator import vector_index
from edgellm_local.emulator.vector_index import TABLE, SqliteVectorIndex, VectorizeLimitError, _connect


async def test_namespaces_filters_and_order(tmp_path: Path) -> None:
    index = SqliteVectorIndex(tmp_path / "v.sqlite3")
    await index.upsert([VectorRecord("a", (1.0, 0.0, 0.0), "n1", {"context": "x"}),
                        VectorRecord("b", (0.8, 0.6, 0.0), "n1", {"context": "x"}),
                        VectorRecord("c", (1.0, 0.0, 0.0), "n1", {"context": "y"}),
                        VectorRecord("d", (1.0, 0.0, 0.0), "n2", {"context": "x"})])
    matches = await index.query([1.0, 0.0, 0.0], top_k=5, namespace="n1", filter={"context": "x"})
    assert [m.id for m in matches] == ["a", "b"] and matches[0].score == pytest.approx(1.0) and matches[1].score == pytest.approx(0.8)
    await index.upsert([VectorRecord("a", (0.0, 1.0, 0.0), "n1", {"context": "x", "new": 1})])  # replaced in full
    matches = await index.query([1.0, 0.0, 0.0], top_k=1, namespace="n1", filter={"context": "x"})
    assert matches[0].id == "b"
    await index.delete_by_ids(["b"])
    assert [m.id for m in await index.query([1.0, 0.0, 0.0], top_k=5, namespace="n1", filter={"context": "x"})] == ["a"]
    reopened = SqliteVectorIndex(tmp_path / "v.sqlite3")  # the state directory keeps it
    assert reopened.dimensions == 3 and len(await reopened.query([0.0, 1.0, 0.0], top_k=5, namespace="n1")) == 2


@pytest.mark.parametrize("record", [
    VectorRecord("x" * 65, (1.0,), "n"),
    VectorRecord("a", (1.0,), "n" * 65),
    VectorRecord("a", (1.0,), "n", {"text": "x" * 11000}),
])
async def test_limits_are_refused(record: VectorRecord) -> None:
    with pytest.raises(VectorizeLimitError):
        await SqliteVectorIndex().upsert([record])


async def test_one_dimension_per_index_and_top_k_bound() -> None:
    index = SqliteVectorIndex()
    await index.upsert([VectorRecord("a", (1.0, 0.0), "n")])
    with pytest.raises(VectorizeLimitError):
        await index.upsert([VectorRecord("b", (1.0, 0.0, 0.0), "n")])
    with pytest.raises(VectorizeLimitError):
        await index.query([1.0, 0.0], top_k=21, namespace="n")


def _rows(path: Path) -> list[tuple[str, str]]:
    """What the file holds, read through a connection of its own (sqlite-vec loaded)."""
    db = _connect(str(path))
    try:
        return db.execute(f"SELECT id, namespace FROM {TABLE} ORDER BY id").fetchall()
    finally:
        db.close()


async def test_the_index_is_a_sqlite_vec_table(tmp_path: Path) -> None:
    index = SqliteVectorIndex(tmp_path / "v.sqlite3")
    await index.upsert([VectorRecord("a", (1.0, 0.0, 0.0), "n1", {"context": "x"})])
    assert index._db.execute("SELECT vec_version()").fetchone()[0].startswith("v")
    schema = index._db.execute("SELECT sql FROM sqlite_master WHERE name = ?", (TABLE,)).fetchone()[0]
    assert "USING vec0(" in schema and "float[3] distance_metric=cosine" in schema and "namespace text partition key" in schema
    assert _rows(tmp_path / "v.sqlite3") == [("a", "n1")]


async def test_a_namespace_never_sees_another_even_nearer() -> None:
    index = SqliteVectorIndex()
    await index.upsert([VectorRecord("far", (0.0, 1.0, 0.0), "n1", {"context": "x", "kind": "a"})]
                       + [VectorRecord(f"near{i}", (1.0, 0.01 * i, 0.0), "n2", {"context": "x", "kind": "a"}) for i in range(30)])
    for filter in (None, {"context": "x"}, {"kind": "a"}):  # the KNN, and the scan for a property with no column
        matches = await index.query([1.0, 0.0, 0.0], top_k=20, namespace="n1", filter=filter)
        assert [m.id for m in matches] == ["far"]
    await index.upsert([VectorRecord("far", (0.0, 1.0, 0.0), "n2", {"context": "x"})])  # ids are the index's: moved, not copied
    assert await index.query([0.0, 1.0, 0.0], top_k=20, namespace="n1") == []


@pytest.mark.parametrize("filter", [{"context": "x" * 64}, {"context": "x" * 64, "kind": "a"}], ids=["column", "scan"])
async def test_a_filter_excludes_a_nearer_vector(filter: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    if set(filter) == {"context"}:  # the edge's filter is applied inside the KNN, never by scanning the namespace
        monkeypatch.setattr(SqliteVectorIndex, "_nearest_scanning", lambda *args: pytest.fail("scanned the namespace"))
    index = SqliteVectorIndex()
    await index.upsert([VectorRecord("wanted", (0.0, 1.0, 0.0), "n", {"context": "x" * 64, "kind": "a"}),
                        VectorRecord("other-context", (1.0, 0.0, 0.0), "n", {"context": "y" * 64, "kind": "a"}),
                        VectorRecord("no-context", (1.0, 0.0, 0.0), "n", {"kind": "a"}),
                        VectorRecord("not-a-string", (1.0, 0.0, 0.0), "n", {"context": 1, "kind": "a"}),
                        VectorRecord("other-kind", (1.0, 0.0, 0.0), "n", {"context": "x" * 64, "kind": "b"} if "kind" in filter else {})])
    matches = await index.query([1.0, 0.0, 0.0], top_k=1, namespace="n", filter=filter)  # filtered in the search, not after it
    assert [(m.id, m.metadata) for m in matches] == [("wanted", {"context": "x" * 64, "kind": "a"})]
    assert matches[0].score == pytest.approx(0.0, abs=1e-6)
    assert await index.query([1.0, 0.0, 0.0], top_k=5, namespace="n", filter={"context": ""}) == []
    assert await index.query([1.0, 0.0, 0.0], top_k=5, namespace="n", filter={"context": "1"}) == []


async def test_a_hash_collision_on_the_filtered_property_still_answers_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vector_index, "_filtered_hash", lambda metadata: 0)  # every context shares the column's value
    index = SqliteVectorIndex()
    await index.upsert([VectorRecord("wanted", (0.0, 1.0, 0.0), "n", {"context": "x"}),
                        VectorRecord("nearer", (1.0, 0.0, 0.0), "n", {"context": "y"})])
    assert [m.id for m in await index.query([1.0, 0.0, 0.0], top_k=1, namespace="n", filter={"context": "x"})] == ["wanted"]


async def test_reopening_keeps_the_dimension_and_the_rows(tmp_path: Path) -> None:
    path = tmp_path / "state" / "vectors.sqlite3"
    assert SqliteVectorIndex(path).dimensions is None  # nothing upserted: no dimension yet
    index = SqliteVectorIndex(path)
    await index.upsert([VectorRecord("a", (0.6, 0.8), "n", {"context": "x", "n": 1}), VectorRecord("b", (1.0, 0.0), "n")])
    index.close()
    reopened = SqliteVectorIndex(path)
    assert reopened.dimensions == 2
    assert [(m.id, round(m.score, 5), m.metadata) for m in await reopened.query([0.0, 1.0], top_k=5, namespace="n")] == \
        [("a", 0.8, {"context": "x", "n": 1}), ("b", 0.0, {})]
    with pytest.raises(VectorizeLimitError, match="VECTOR_DIMENSION_MISMATCH"):
        await reopened.upsert([VectorRecord("c", (1.0, 0.0, 0.0), "n")])
    with pytest.raises(VectorizeLimitError, match="VECTOR_DIMENSION_MISMATCH"):
        SqliteVectorIndex(path, dimensions=3)


async def test_a_file_in_the_old_format_is_moved_into_the_index(tmp_path: Path) -> None:
    path = tmp_path / "vectors.sqlite3"
    old = sqlite3.connect(path)  # the plain table the index kept before sqlite-vec
    old.execute("CREATE TABLE vectors (id TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
                "dims INTEGER NOT NULL, vals BLOB NOT NULL, metadata TEXT NOT NULL)")
    old.execute("CREATE INDEX vectors_namespace ON vectors (namespace)")
    old.executemany("INSERT INTO vectors VALUES (?, ?, ?, ?, ?)", [
        ("a", "n1", 3, np.array([1, 0, 0], "<f4").tobytes(), '{"context":"x"}'),
        ("b", "n1", 3, np.array([0.8, 0.6, 0], "<f4").tobytes(), '{"context":"x","text":"b"}'),
        ("c", "n2", 3, np.array([1, 0, 0], "<f4").tobytes(), '{}'),
        ("odd", "n1", 2, np.array([1, 0], "<f4").tobytes(), '{}'),  # another dimension: never queryable, dropped
    ])
    old.commit()
    old.close()
    index = SqliteVectorIndex(path)
    assert index.dimensions == 3
    matches = await index.query([1.0, 0.0, 0.0], top_k=5, namespace="n1", filter={"context": "x"})
    assert [(m.id, round(m.score, 5), m.metadata) for m in matches] == [("a", 1.0, {"context": "x"}), ("b", 0.8, {"context": "x", "text": "b"})]
    assert _rows(path) == [("a", "n1"), ("b", "n1"), ("c", "n2")]
    index.close()
    reopened = SqliteVectorIndex(path)  # moved once: the old table is gone
    assert reopened._db.execute("SELECT name FROM sqlite_master WHERE name = 'vectors'").fetchone() is None
    assert [m.id for m in await reopened.query([1.0, 0.0, 0.0], top_k=5, namespace="n2")] == ["c"]


async def test_an_empty_file_in_the_old_format_opens_with_no_dimension(tmp_path: Path) -> None:
    path = tmp_path / "vectors.sqlite3"
    old = sqlite3.connect(path)  # the old index made its table on open, so most old files hold it empty
    old.execute("CREATE TABLE vectors (id TEXT PRIMARY KEY, namespace TEXT NOT NULL, "
                "dims INTEGER NOT NULL, vals BLOB NOT NULL, metadata TEXT NOT NULL)")
    old.close()
    index = SqliteVectorIndex(path)
    assert index.dimensions is None
    await index.upsert([VectorRecord("a", (1.0, 0.0), "n")])
    assert index.dimensions == 2 and _rows(path) == [("a", "n")]

@pytest.mark.parametrize("filter", [None, {"context": "x"}, {"context": "x", "kind": "a"}], ids=["none", "column", "scan"])
async def test_results_equal_a_brute_force_cosine_ranking(filter: dict[str, str] | None) -> None:
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((400, 384)).astype(np.float32)
    contexts = rng.choice(["x", "y"], 400)
    kinds = rng.choice(["a", "b"], 400)
    namespaces = np.where(np.arange(400) < 300, "n", "elsewhere")
    index = SqliteVectorIndex()
    await index.upsert([VectorRecord(f"v{i}", tuple(map(float, vectors[i])), str(namespaces[i]), {"context": str(contexts[i]), "kind": str(kinds[i])})
                        for i in range(400)])
    eligible = (namespaces == "n") & np.all([(contexts if name == "context" else kinds) == value for name, value in (filter or {}).items()] or [True], axis=0)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    for query in rng.standard_normal((10, 384)).astype(np.float32):
        scores = unit @ (query / np.linalg.norm(query))
        expected = [i for i in np.argsort(-scores) if eligible[i]][:5]
        matches = await index.query(list(map(float, query)), top_k=5, namespace="n", filter=filter)
        assert [m.id for m in matches] == [f"v{i}" for i in expected]
        assert [m.score for m in matches] == pytest.approx([float(scores[i]) for i in expected], abs=1e-5)


async def test_concurrent_callers_share_one_connection() -> None:
    index = SqliteVectorIndex()
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        async def run() -> None:
            for i in range(40):
                await index.upsert([VectorRecord(f"{n}-{i}", (1.0, float(i), float(n)), f"n{n}")])
                assert len(await index.query([1.0, 0.0, 0.0], top_k=20, namespace=f"n{n}")) == min(i + 1, 20)
        try:
            asyncio.run(run())
        except BaseException as exc:  # a thread's failure is the test's
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert index._db.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0] == 240


async def test_a_repeated_id_in_one_upsert_keeps_the_last() -> None:
    index = SqliteVectorIndex()
    await index.upsert([VectorRecord("a", (1.0, 0.0), "n", {"v": 1}), VectorRecord("a", (0.0, 1.0), "n", {"v": 2})])
    assert [(m.id, m.metadata) for m in await index.query([0.0, 1.0], top_k=5, namespace="n")] == [("a", {"v": 2})]
