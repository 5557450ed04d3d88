"""A second opinion on a semantic candidate, before it is served: a cross-encoder reads the new
question and the cached one together, where the embedding compared them apart (GPTCache's
second-stage check by a model).

`SemanticVerifier` is the port; `RerankerVerifier` the Cloudflare one: Workers AI's
`@cf/baai/bge-reranker-base` through the AI binding's `run`, whose contract (docs/runtime-contracts.md)
is input `{query, contexts: [{text}]}`, output `{response: [{id, score}]}`, `id` the index of a
context, best first. `SEMANTIC_VERIFIER` names the model (off by default); a candidate is
accepted when its score reaches `SEMANTIC_VERIFIER_THRESHOLD`. A verifier that fails or answers
outside its contract accepts nothing: the request is an ordinary miss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

from ..ports import AIBinding

RERANKER = "@cf/baai/bge-reranker-base"


class VerifierError(Exception):
    """The verifier answered outside its contract."""


class SemanticVerifier(Protocol):
    async def score(self, query: str, candidate: str) -> float:
        """How surely `candidate` asks what `query` asks (the verifier's own scale)."""
        ...


@dataclass(frozen=True)
class RerankerVerifier:
    ai: AIBinding
    model: str = RERANKER

    async def score(self, query: str, candidate: str) -> float:
        result = await self.ai.run(self.model, {"query": query, "contexts": [{"text": candidate}]})
        return reranker_score(result)


def reranker_score(result: Any) -> float:
    """The one context's score from a bge-reranker answer, or `VerifierError`."""
    rows = result.get("response") if isinstance(result, dict) else None
    if not isinstance(rows, list):
        raise VerifierError(f"the reranker answered no 'response' list: {str(result)[:200]}")
    for row in rows:
        if isinstance(row, dict) and row.get("id", 0) == 0:
            score = row.get("score")
            if isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score):
                return float(score)
    raise VerifierError(f"the reranker scored no context 0: {str(rows)[:200]}")


def verifier_for(ai: AIBinding, model: str | None) -> SemanticVerifier | None:
    return RerankerVerifier(ai, model) if model else None
