"""What one isolate knows about its semantic cache: whether the index can be reached at all, and
what the lookups' embeddings cost, and the evidence its error bound is kept on. Plain data, kept in `IsolateState.semantic` (never a module
global); a leaf module: it imports nothing of the core but `calibration`, itself a leaf."""

from __future__ import annotations

from dataclasses import dataclass, field

from .calibration import Calibration


@dataclass
class SemanticState:
    # The index answered "needs to be run remotely" (a Vectorize binding without an upstream:
    # `wrangler dev` offline, an index never created): every lookup of this isolate is skipped
    # from then on, before it pays for an embedding.
    unavailable: bool = False
    probed: bool = False  # the index was asked once, before the first embedding, whether it can answer
    embeddings: int = 0  # lookups' embeddings made
    embedding_tokens: int = 0  # their tokens (the model's count, else an estimate)
    embedding_failures: int = 0  # failed or past their deadline (the request went on as a plain miss)
    skipped: int = 0  # lookups skipped because the index is unavailable
    expired_deleted: int = 0  # expired vectors seen by a query and deleted
    verifications: int = 0  # candidates the verifier was asked about
    verifier_refusals: int = 0
    verifier_failures: int = 0  # failed, past the deadline or outside the contract: no hit
    verifier_seconds: float = 0.0  # their time, together (the verifier's added latency)
    calibration: Calibration = field(default_factory=Calibration)  # the error bound's evidence (cache.calibration)

    def to_json(self) -> dict[str, object]:
        return {**{k: v for k, v in self.__dict__.items() if k != "calibration"}, "calibration": self.calibration.to_json()}
