"""Vectorize (`env.VECTORIZE`) as the core's `VectorIndex`: the semantic cache's index.

The binding's calls, as Cloudflare documents them (developers.cloudflare.com/vectorize/reference/
client-api/): `query(vector, {topK, namespace, filter, returnMetadata: "all"})` resolves to
`{count, matches: [{id, score, metadata}]}`; `upsert([{id, values, namespace, metadata}])` and
`deleteByIds(ids)` resolve to `{mutationId}` once queued (applied seconds later). The vector goes
as a JS array of numbers, every options object through `Object.fromEntries`; a failure is a
`JsException`, a retryable `BindingError` here (the semantic cache fails open on it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pyodide.ffi import JsException, to_js  # type: ignore[import-not-found]

from ..ports import BindingError, VectorMatch, VectorRecord
from .pyodide_toolbox import js_message, js_options


class VectorizeError(BindingError):
    retryable = True


@dataclass
class WorkersVectorize:
    binding: Any

    async def query(self, vector: list[float], *, top_k: int, namespace: str,
                    filter: Mapping[str, str] | None = None) -> list[VectorMatch]:
        options: dict[str, Any] = {"topK": top_k, "namespace": namespace, "returnMetadata": "all"}
        if filter:
            options["filter"] = dict(filter)
        try:
            result = await self.binding.query(to_js(list(vector)), js_options(options))
        except JsException as exc:
            raise VectorizeError(f"Vectorize query failed: {js_message(exc)}") from exc
        matches = (result.to_py() if hasattr(result, "to_py") else result).get("matches") or []
        return [VectorMatch(str(m["id"]), float(m["score"]), dict(m.get("metadata") or {})) for m in matches]

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
