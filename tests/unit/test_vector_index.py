"""The local Vectorize stand-in (`SqliteVectorIndex`) holds Vectorize's contract: namespaces and
metadata filters partition it, an upsert replaces in full, scores are cosines best first, and
the documented limits are refused as Vectorize refuses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgellm.ports import VectorRecord
from edgellm_local.emulator.vector_index import SqliteVectorIndex, VectorizeLimitError


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
