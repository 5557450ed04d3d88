"""`ScriptedReranker`: the semantic cache's verifier seam (`edgellm.cache.verifier`) with scripted
verdicts, shipped as library code beside `ScriptedAI`.

An AI binding that answers the reranker model (`@cf/baai/bge-reranker-base` unless told) as
Workers AI does (input `{query, contexts: [{text}]}`, output `{response: [{id, score}]}`: the
contract in docs/runtime-contracts.md), from a script, and passes every other call to `inner`
(the local edge's llama.cpp binding, or a test's). The local stand-in models are too small to
verify (a 135M chat model as a yes/no judge separated real duplicates from non-duplicates at
AUC 0.58), so locally the verdicts are scripted: by (query, candidate), else `default`. It
records what it was asked (`asked`) and can fail (`fail`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from edgellm.cache.verifier import RERANKER
from edgellm.ports import BindingError


@dataclass
class ScriptedReranker:
    inner: Any
    scores: Mapping[tuple[str, str], float] = field(default_factory=dict)
    default: float = 0.0
    model: str = RERANKER
    fail: bool = False
    asked: list[tuple[str, str]] = field(default_factory=list)

    async def run(self, model: str, inputs: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
        if model != self.model:
            return await self.inner.run(model, inputs, **kwargs)
        query, contexts = inputs["query"], inputs["contexts"]
        if not isinstance(query, str) or not isinstance(contexts, list) or not all(isinstance(c.get("text"), str) for c in contexts):
            raise BindingError("AiError: 5006: the reranker takes {query: string, contexts: [{text: string}]}")
        if self.fail:
            raise BindingError("InferenceUpstreamError: the reranker failed")
        rows = []
        for i, context in enumerate(contexts):
            self.asked.append((query, context["text"]))
            rows.append({"id": i, "score": self.scores.get((query, context["text"]), self.default)})
        return {"response": sorted(rows, key=lambda r: -r["score"])}

    def __getattr__(self, name: str) -> Any:  # everything else (embed, stream, describe) is the inner binding's
        return getattr(self.inner, name)
