"""A stand-in for the Vectorize binding (`env.VECTORIZE`) under the Pyodide adapter, written to
its documented contract (developers.cloudflare.com/vectorize/reference/client-api/ and
/platform/limits/), as tests/support/fake_pyodide.py is to the runtime notes:

- `query(vector, options)`: `vector` a JS array of numbers (a list here), `options` a JS object
  (`Object.fromEntries`) with `topK` (at most 20 with `returnMetadata: "all"`, 100 without),
  `namespace`, `filter` (metadata equality), `returnValues` and `returnMetadata`; resolves to a JS
  object `{count, matches: [{id, score, values?, metadata?}]}`, best cosine first. topK is at
  most 20 when values or all metadata are returned (/reference/client-api/#topk). Without
  `returnValues` the scores are approximate ("returned scores will be an approximation of the
  real distance/similarity": /best-practices/query-vectors/): here the cosine is quantised to
  steps of `APPROXIMATION` (0.05), enough to move a candidate across a threshold.
- `upsert(vectors)` / `deleteByIds(ids)`: resolve to `{mutationId}` at once, but are applied
  asynchronously ("typically a few seconds"): here only when the test calls `process()`, so
  code that read its own writes at once would fail. An upsert replaces a vector in full.
- ids and namespaces at most 64 bytes; metadata at most 10 KiB; one dimension per index.
- failures are `JsException`s.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tests.support import fake_pyodide as fp


APPROXIMATION = 0.05


class FakeVectorize:
    def __init__(self, dimensions: int, error: str | None = None) -> None:
        self.dimensions, self.error = dimensions, error
        self.vectors: dict[str, dict[str, Any]] = {}
        self.pending: list[tuple[str, Any]] = []
        self.queries: list[dict[str, Any]] = []

    def _fail(self) -> None:
        if self.error:
            raise fp.JsException(self.error)

    async def query(self, vector: Any, options: Any) -> Any:
        self._fail()
        opts = fp.to_plain(options) if isinstance(options, fp.JsObject) else None
        if opts is None:
            raise TypeError("query options must be a JS object")
        if not isinstance(vector, list) or len(vector) != self.dimensions:
            raise fp.JsException(f"VECTOR_DIMENSION_MISMATCH: expected {self.dimensions}")
        top_k = int(opts.get("topK", 5))
        if top_k > (20 if opts.get("returnMetadata") == "all" or opts.get("returnValues") else 100):
            raise fp.JsException("VECTOR_QUERY_ERROR: topK too large")
        self.queries.append(opts)
        wanted = opts.get("filter") or {}
        rows = [v for v in self.vectors.values() if v.get("namespace") == opts.get("namespace")
                and all((v.get("metadata") or {}).get(k) == want for k, want in wanted.items())]
        scored = sorted(((_cosine(vector, r["values"]), r) for r in rows), key=lambda pair: -pair[0])[:top_k]
        exact = bool(opts.get("returnValues"))
        matches = [{"id": r["id"], "score": s if exact else round(s / APPROXIMATION) * APPROXIMATION,
                    **({"values": list(r["values"])} if exact else {}),
                    **({"metadata": r.get("metadata") or {}} if opts.get("returnMetadata") == "all" else {})}
                   for s, r in scored]
        return fp.JsDict({"count": len(matches), "matches": matches})

    async def upsert(self, vectors: Any) -> Any:
        self._fail()
        if not isinstance(vectors, list) or not all(isinstance(v, fp.JsObject) for v in vectors):
            raise TypeError("upsert takes a JS array of JS objects (to_js with Object.fromEntries)")
        rows = [fp.to_plain(v) for v in vectors]
        for row in rows:
            if not isinstance(row, dict) or len(row["id"].encode()) > 64 or len((row.get("namespace") or "").encode()) > 64:
                raise fp.JsException("VECTOR_INVALID: id and namespace are at most 64 bytes")
            if len(json.dumps(row.get("metadata") or {}).encode()) > 10 * 1024:
                raise fp.JsException("VECTOR_INVALID: metadata over 10 KiB")
            if len(row["values"]) != self.dimensions:
                raise fp.JsException(f"VECTOR_DIMENSION_MISMATCH: expected {self.dimensions}")
        self.pending.append(("upsert", rows))
        return fp.JsDict({"mutationId": f"m{len(self.pending)}"})

    async def deleteByIds(self, ids: Any) -> Any:  # noqa: N802 (JS name)
        self._fail()
        self.pending.append(("delete", list(ids)))
        return fp.JsDict({"mutationId": f"m{len(self.pending)}"})

    def process(self) -> None:
        """Vectorize applying the queued mutations, seconds after they were accepted."""
        for kind, items in self.pending:
            for item in items:
                if kind == "upsert":
                    self.vectors[item["id"]] = item
                else:
                    self.vectors.pop(item, None)
        self.pending.clear()


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    return dot / ((math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))) or 1.0)
