"""The semantic cache's lookup and upsert path (`cache.semantic.lookup`, `_upsert`) over the local
Vectorize index (sqlite-vec), with scripted vectors at the AI binding's seam: the learned
thresholds hold through both paths, expired vectors are never neighbours nor candidates, never
crowd a live entry out and are deleted, the namespace names the caller's tenant, a missing index
is found once and costs no embedding, and the lookup's embedding is metered and bounded. The
error bound is off here (`semantic_max_error=None`) unless a test is about it."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field
from typing import Any, Awaitable

import pytest

from edgellm.cache import semantic
from edgellm.cache.key import CacheKey, CacheScope
from edgellm.cache.policy import CachePolicy
from edgellm.caller import Principal
from edgellm.app import ROUTES
from edgellm.config import Config
from edgellm.context import RequestContext
from edgellm.deps import Deps
from edgellm.generation import GenerationRequest
from edgellm.http import Request
from edgellm.ports import UsageEvent
from edgellm_local.emulator.vector_index import SqliteVectorIndex
from tests.conftest import ManualClock

MODEL = "@cf/test/embedder"  # not in the catalog: no reachability probe (its width is unknown)
BGE = "@cf/baai/bge-small-en-v1.5"
POLICY = CachePolicy(read=True, write=True, ttl=3600)
BASE = semantic.BASE_THRESHOLD


def unit(angle: float) -> tuple[float, ...]:
    """A unit vector in a plane: the cosine of two is the cosine of their angles' difference."""
    return (math.cos(angle), math.sin(angle), 0.0, 0.0)


def angle(cosine: float) -> float:
    return math.acos(cosine)


class Embedder:
    """The AI binding's `embed`, answering the vector scripted for each text."""

    def __init__(self, vectors: dict[str, tuple[float, ...]], hang: bool = False) -> None:
        self.vectors, self.hang, self.calls = vectors, hang, 0

    async def embed(self, model: str, texts: list[str]) -> dict[str, Any]:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        return {"data": [list(self.vectors[t]) for t in texts], "usage": {"prompt_tokens": 7}}


class Deferred:
    """`waitUntil`: the work after the response, run only when the test says (`settle`)."""

    def __init__(self) -> None:
        self.pending: list[Awaitable[Any]] = []

    def __call__(self, awaitable: Awaitable[Any]) -> None:
        self.pending.append(awaitable)

    async def settle(self) -> None:
        while self.pending:
            await self.pending.pop(0)


@dataclass
class Answer:
    """An exact entry as `service.lookup` reads it (`CachedAnswer`'s fields the lookup reads)."""

    model: str = "@cf/m"
    created: float = 0.0
    text: str = "four"
    tool_calls: tuple[Any, ...] = ()

    def replay(self) -> Any:
        return iter(())


@dataclass
class Usage:
    rows: list[UsageEvent] = field(default_factory=list)

    def record_now(self, event: UsageEvent) -> None:
        self.rows.append(event)


class Unreachable:
    """A Vectorize binding without an upstream, as workerd answers it (the runtime notes)."""

    def __init__(self) -> None:
        self.calls = 0

    async def query(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        raise RuntimeError("Error: Binding VECTORIZE needs to be run remotely")

    async def upsert(self, records: Any) -> None:
        raise RuntimeError("Error: Binding VECTORIZE needs to be run remotely")

    async def delete_by_ids(self, ids: Any) -> None:
        raise RuntimeError("Error: Binding VECTORIZE needs to be run remotely")


def make(vectors: dict[str, tuple[float, ...]], index: Any = None, model: str = MODEL, bound: float | None = None, **kw: Any) -> tuple[Deps, Deferred, Embedder]:
    background, embedder = Deferred(), Embedder(vectors, **kw)
    deps = Deps(config=Config(open_access=True, embedding_models=(model,), semantic_max_error=bound), ai=embedder,  # type: ignore[arg-type]
                vectors=index if index is not None else SqliteVectorIndex(), clock=ManualClock(), wait_until=background,
                usage=Usage())  # type: ignore[arg-type]
    return deps, background, embedder


def ask(text: str, tenant: str = "acme") -> tuple[Request, RequestContext, GenerationRequest]:
    request = Request("POST", "http://edge.test/v1/chat/completions", {"x-edgellm-semantic-cache": "on"})
    ctx = RequestContext(router=ROUTES, principal=Principal(tenant, f"key-{tenant}"))
    return request, ctx, GenerationRequest("@cf/m", {"messages": [{"role": "user", "content": text}], "temperature": 0})


SCOPE = CacheScope("shared", "default", 0)
STORED: dict[str, Answer] = {}


def key_of(text: str) -> CacheKey:
    return CacheKey(SCOPE, f"{abs(hash(text)):064d}"[-64:])


async def read(deps: Deps, key: CacheKey) -> tuple[Any, int]:
    return Answer(), 1


async def look(deps: Deps, text: str, tenant: str = "acme", policy: CachePolicy = POLICY) -> semantic.Hit | semantic.Plan | None:
    request, ctx, gen_request = ask(text, tenant)
    return await semantic.lookup(deps, request, ctx, gen_request, key_of(text), policy, read)


async def remember(deps: Deps, text: str, ttl: int = 3600, tenant: str = "acme") -> semantic.Plan:
    """A request that writes and does not read (`cf-aig-cache-ttl` style refresh): its vector is
    upserted with the threshold it learned from the entries already there."""
    plan = await look(deps, text, tenant, CachePolicy(read=False, write=True, ttl=ttl))
    assert isinstance(plan, semantic.Plan), plan
    await semantic._upsert(deps, plan, key_of(text), ttl)
    return plan


# Three questions that read alike (the guard agrees), placed by their vectors: B sits close to A,
# Q closer to B than B's threshold allows only if A is counted as B's neighbour.
A, B, Q = "How do I reset my router?", "how do I reset my router", "How do I reset my router!"


def placed() -> dict[str, tuple[float, ...]]:
    b = angle(min(0.999, BASE + 0.03))
    return {A: unit(0.0), B: unit(b), Q: unit(b + angle(min(0.999, BASE + 0.04)))}


async def test_an_entry_learns_its_threshold_from_its_neighbour_and_keeps_it_through_lookup() -> None:
    deps, _, _ = make(placed())
    await remember(deps, A)
    plan = await remember(deps, B)
    assert plan.neighbour == pytest.approx(min(0.999, BASE + 0.03), abs=1e-4)  # A, as B's nearest other entry
    stored = await deps.vectors.query(list(placed()[B]), top_k=1, namespace=plan.namespace)  # type: ignore[union-attr]
    assert stored[0].metadata["threshold"] > BASE + 0.04
    assert not isinstance(await look(deps, Q), semantic.Hit)  # closer to B than the base, not than A is


async def test_without_a_neighbour_the_same_query_hits() -> None:
    deps, _, _ = make(placed())
    await remember(deps, B)
    hit = await look(deps, Q)
    assert isinstance(hit, semantic.Hit)


async def test_an_expired_vector_is_no_neighbour_no_candidate_and_is_deleted() -> None:
    deps, background, _ = make(placed())
    old = await remember(deps, A, ttl=10)
    deps.clock.advance(11)  # type: ignore[attr-defined]
    plan = await remember(deps, B)
    assert plan.neighbour == 0.0  # A expired: B's threshold is the base
    assert isinstance(await look(deps, Q), semantic.Hit)
    again = await look(deps, A)
    assert isinstance(again, semantic.Hit) and again.generation.cache_key == key_of(B).digest  # never A's own expired entry
    await background.settle()
    left = await deps.vectors.query(list(placed()[A]), top_k=20, namespace=old.namespace)  # type: ignore[union-attr]
    assert [m.metadata["text"] for m in left] == [B]  # A's vector deleted
    assert deps.state.semantic.expired_deleted >= 1


async def test_expired_vectors_never_crowd_out_a_live_entry() -> None:
    texts = [f"How do I reset my router{'?' * i}" for i in range(1, 8)]  # seven entries, all nearer than the live one
    live = "how do I reset my router, please"
    query = "how do I reset my router, please?"
    vectors = {t: unit(0.0) for t in texts} | {live: unit(angle(BASE + 0.01)), query: unit(0.0)}
    deps, background, _ = make(vectors)
    for text in texts:
        await remember(deps, text, ttl=10)
    deps.clock.advance(11)  # type: ignore[attr-defined]
    await remember(deps, live)
    assert len(background.pending) > 0  # the deletions are queued, not yet applied (Vectorize: seconds later)
    hit = await look(deps, query)
    assert isinstance(hit, semantic.Hit) and hit.generation.cache_key == key_of(live).digest
    await background.settle()
    left = await deps.vectors.query(list(vectors[query]), top_k=20, namespace=semantic.index_namespace("acme", key_of(live)))  # type: ignore[union-attr]
    assert [m.metadata["text"] for m in left] == [live]


async def test_the_namespace_names_the_callers_own_tenant_even_over_a_shared_scope() -> None:
    key = key_of(A)
    assert semantic.index_namespace("alpha", key) != semantic.index_namespace("beta", key)
    deps, _, _ = make({A: unit(0.0), B: unit(0.0)})
    await remember(deps, A, tenant="alpha")
    assert not isinstance(await look(deps, B, tenant="beta"), semantic.Hit)  # same scope, another tenant
    assert isinstance(await look(deps, B, tenant="alpha"), semantic.Hit)


async def test_a_missing_index_is_found_once_and_no_embedding_is_paid() -> None:
    index = Unreachable()
    deps, _, embedder = make({A: unit(0.0)}, index=index, model=BGE)
    for _ in range(3):
        assert await look(deps, A) is None
    assert embedder.calls == 0 and index.calls == 1  # one probe, then every lookup skipped
    assert deps.state.semantic.unavailable and deps.state.semantic.skipped == 3


async def test_an_index_that_fails_after_the_probe_is_also_found() -> None:
    class Late(Unreachable):
        async def query(self, vector: Any, *, top_k: int, namespace: str, filter: Any = None) -> Any:
            if namespace == "sc-probe":
                return []
            return await super().query()

    deps, _, embedder = make({A: unit(0.0)}, index=Late(), model=BGE)
    assert await look(deps, A) is None and embedder.calls == 1
    assert await look(deps, A) is None and embedder.calls == 1  # found at the first real query: no second embedding


async def test_the_lookups_embedding_is_metered() -> None:
    deps, _, _ = make({A: unit(0.0)})
    await look(deps, A)
    assert deps.state.semantic.embeddings == 1 and deps.state.semantic.embedding_tokens == 7
    rows = deps.usage.rows  # type: ignore[union-attr]
    assert [(r.route, r.model, r.prompt_tokens, r.tenant) for r in rows] == [(semantic.USAGE_ROUTE, MODEL, 7, "acme")]


async def test_the_lookups_embedding_has_a_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(semantic, "EMBED_DEADLINE_SECONDS", 0.01)
    deps, _, embedder = make({A: unit(0.0)}, hang=True)
    assert await look(deps, A) is None and embedder.calls == 1
    assert deps.state.semantic.embedding_failures == 1 and deps.state.semantic.embeddings == 0


async def test_an_entry_purged_by_its_key_loses_its_vector() -> None:
    deps, background, _ = make(placed())
    plan = await remember(deps, A)
    semantic.forget_entry(deps, "acme", key_of(A))
    await background.settle()
    assert await deps.vectors.query(list(placed()[A]), top_k=20, namespace=plan.namespace) == []  # type: ignore[union-attr]
