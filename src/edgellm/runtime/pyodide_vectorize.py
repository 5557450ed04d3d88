"""Vectorize (`env.VECTORIZE`) as the core's `VectorIndex`: the semantic cache's index.

The binding's calls, as Cloudflare documents them (developers.cloudflare.com/vectorize/reference/
client-api/): `query(vector, {topK, namespace, filter, returnValues: true, returnMetadata: "all"})`
resolves to `{count, matches: [{id, score, values, metadata}]}` (topK at most 20 with either);
a query's default scores are approximate, and `returnValues: true` is how "high-precision scoring"
is asked for ("tells Vectorize to use the original vector values for your matches, allowing the
computation of exact match scores": developers.cloudflare.com/vectorize/best-practices/
query-vectors/). The score the core sees is the cosine computed here from the returned values,
so it is exact whatever the index did (the index's own score only when no values came back).
`upsert([{id, values, namespace, metadata}])` and `deleteByIds(ids)` resolve to `{mutationId}` once queued (applied seconds later). The vector goes
as a JS array of numbers, every options object through `Object.fromEntries`; a failure is a
`JsException`, a retryable `BindingError` here (the semantic cache fails open on it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

from ..ports import BindingError, VectorMatch, VectorRecord
from .pyodide_toolbox import js_message, js_options


def exact_score(query: list[float], values: Any, approximate: float) -> float:
    """The cosine of the query and a match's returned values; the index's score without values."""
    if not values:
        return approximate
    values = [float(v) for v in values]
    if len(values) != len(query):
        return approximate
    dot = sum(a * b for a, b in zip(query, values))
    norm = math.sqrt(sum(a * a for a in query)) * math.sqrt(sum(b * b for b in values))
    return dot / norm if norm else 0.0


class VectorizeError(BindingError):
    retryable = True


@dataclass
class WorkersVectorize:
    binding: Any

    async def query(self, vector: list[float], *, top_k: int, namespace: str,
                    filter: Mapping[str, str] | None = None) -> list[VectorMatch]:
        options: dict[str, Any] = {"topK": top_k, "namespace": namespace, "returnValues": True, "returnMetadata": "all"}
        if filter:
            options["filter"] = dict(filter)
        try:
            result = await self.binding.query(to_js(list(vector)), js_options(options))
        except JsException as exc:
            raise VectorizeError(f"Vectorize query failed: {js_message(exc)}") from exc
        matches = (result.to_py() if hasattr(result, "to_py") else result).get("matches") or []
        return [VectorMatch(str(m["id"]), exact_score(vector, m.get("values"), float(m["score"])), dict(m.get("metadata") or {}))
                for m in matches]

    async def upsert(self, records: list[VectorRecord]) -> None:
        rows = [js_options({"id": r.id, "values": list(r.values), "namespace": r.namespace, "metadata": dict(r.metadata)}) for r in records]
        try:
            await self.binding.upsert(to_js(rows))
        except JsException as exc:
            raise VectorizeError(f"Vectorize upsert failed: {js_message(exc)}") from exc

    async def delete_by_ids(self, ids: list[str]) -> None:
        try:
            await self.binding.deleteByIds(to_js(list(ids)))
        except JsException as exc:
            raise VectorizeError(f"Vectorize deleteByIds failed: {js_message(exc)}") from exc
