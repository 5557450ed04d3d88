"""The semantic cache: a deterministic chat request whose exact key missed may be answered by an
entry whose last user message means the same, and nothing else may differ.

Safe by construction, in this order:

- Opt-in: `x-edgellm-semantic-cache: on` on the request, or the caller's key's `semantic_cache`
  setting (a request's `off` wins); only requests the exact cache would read (deterministic,
  not bypassed), only after it missed.
- Only the last user message is matched by meaning. Everything else (model, system prompt,
  earlier turns, tools, sampling, response_format, stop) is hashed into the entry's `context`,
  a Vectorize metadata filter that must match exactly; the index namespace names the caller's
  own tenant and the exact cache's scope (tenant, namespace, purge generation), so an entry never
  answers another tenant, even between tenants that share exact entries, and a purge of the
  namespace leaves its vectors unreachable at once.
- A candidate must pass three checks: its cosine is at least `BASE_THRESHOLD`; at least its own
  threshold, learned when it was stored from its neighbours (the best score any other entry of
  its context had against it, plus `MARGIN`: where two different questions already sit that
  close, a match must be closer than they are, as vCache learns a threshold per entry); and the
  numbers, named entities and negation of both texts agree (`semantic_guard`).
- The answer is the candidate's exact entry in KV (the vector only points at it), so its TTL
  and its purge hold for both; the vector carries the same expiry and is ignored after it.

A hit says `cf-aig-cache-status: HIT` and `x-edgellm-cache-match: semantic; score=0.97`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

from ..deps import Deps
from ..generation import Event, Finish, Generation, GenerationRequest
from ..context import RequestContext
from ..http import Request
from ..ports import VectorMatch, VectorRecord
from ..stream import Stream
from .entry import CACHEABLE_FINISH, CachedAnswer
from .key import CacheKey, canonical_request
from .policy import CachePolicy
from .semantic_guard import disagreement

ExactRead = Callable[[Deps, CacheKey], Awaitable[tuple[CachedAnswer | None, int]]]
HEADER = "x-edgellm-semantic-cache"
MATCH_HEADER = "x-edgellm-cache-match"
# The lowest cosine a candidate may have (all-MiniLM-L6-v2 / bge-small): bench.bench_semantic
# measured the hit and false-hit rates of each value on its labelled pairs (docs/embeddings.md).
BASE_THRESHOLD = 0.80
# How much closer than its nearest other entry a match must be to an entry.
MARGIN = 0.02
TOP_K = 5  # Vectorize returns at most 20 matches with metadata
MAX_TEXT_CHARS = 2000  # the matched text kept in metadata (Vectorize: 10 KiB a vector)


@dataclass(frozen=True)
class Plan:
    """A semantic miss: what to remember once the exact entry is written."""

    namespace: str
    context: str
    text: str
    vector: tuple[float, ...]
    neighbour: float  # the best score another entry of this context had against this text (0: none)


@dataclass(frozen=True)
class Hit:
    generation: Generation


def requested(request: Request, ctx: RequestContext) -> bool:
    """The request's header, else its key's setting; off by default."""
    said = (request.header(HEADER) or "").strip().lower()
    if said in ("on", "true", "1"):
        return True
    if said in ("off", "false", "0"):
        return False
    principal = ctx.principal
    return bool(principal is not None and principal.record is not None and getattr(principal.record, "semantic_cache", False))


def last_user_text(gen_request: GenerationRequest) -> str | None:
    messages = gen_request.inputs.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    last = messages[-1]
    if last.get("role") != "user" or not isinstance(last.get("content"), str) or not last["content"].strip():
        return None
    return last["content"]


def context_digest(gen_request: GenerationRequest) -> str:
    """Everything but the last user message's text, hashed: the part that must match exactly."""
    body = canonical_request(gen_request)
    body["messages"] = [*body["messages"][:-1], [body["messages"][-1][0], None]]
    encoded = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(encoded.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def index_namespace(tenant: str, key: CacheKey) -> str:
    """Vectorize's namespace (at most 64 bytes): the caller's own tenant and the exact entry's
    scope with its purge generation."""
    scope = key.scope
    raw = f"{tenant}|{scope.tenant}|{scope.namespace}|{scope.generation}"
    return "sc-" + hashlib.sha256(raw.encode()).hexdigest()[:40]


def vector_id(namespace: str, digest: str) -> str:
    """Vectorize ids are unique per index, not per namespace: the namespace is part of the id."""
    return hashlib.sha256(f"{namespace}|{digest}".encode()).hexdigest()


def match_header(score: float) -> str:
    return f"semantic; score={score:.2f}"


def candidates(text: str, matches: list[VectorMatch], now: float, *, base: float = BASE_THRESHOLD,
               learned: bool = True, guard: bool = True) -> list[VectorMatch]:
    """The matches (best first) that may answer `text`, in order (module docstring: the three
    checks; `base`, `learned` and `guard` vary them for bench.bench_semantic). A candidate under
    its threshold ends the search: where a closer entry could not answer, no farther one may (a
    farther entry with a lower learned threshold would otherwise answer for a query its nearer,
    stricter neighbour refused). One the guard refuses is skipped: another name or number, and a
    farther entry may name the same ones."""
    found = []
    for match in matches:
        meta = match.metadata
        try:
            expires, own = float(meta.get("expires", 0)), float(meta.get("threshold", base))
        except (TypeError, ValueError):
            continue
        other = meta.get("text")
        if expires <= now or not isinstance(other, str) or not isinstance(meta.get("digest"), str):
            continue
        if match.score < (max(base, own) if learned else base):
            break
        if guard and disagreement(text, other) is not None:
            continue
        found.append(match)
    return found


def learned_threshold(neighbour: float, base: float = BASE_THRESHOLD) -> float:
    return min(0.995, max(base, neighbour + MARGIN))


async def _embed(deps: Deps, text: str) -> tuple[float, ...] | None:
    model = deps.config.embedding_models[0]
    try:
        result = await deps.ai.embed(model, [text])
        return tuple(float(x) for x in result["data"][0])
    except Exception as exc:  # fail open: without a vector the request is an ordinary miss
        deps.log.warning("semantic cache: embedding failed: %s", exc)
        return None


async def lookup(deps: Deps, request: Request, ctx: RequestContext, gen_request: GenerationRequest, key: CacheKey,
                 policy: CachePolicy, read: ExactRead) -> Hit | Plan | None:
    """After the exact cache missed: a `Hit`, or the `Plan` that remembers this request's answer,
    or None (not asked for, not applicable, or a dependency failed: the request is a plain miss).
    `read` is the exact cache's own read of an entry (`service.lookup`), passed in by it."""
    if deps.vectors is None or not deps.config.embedding_models or policy.custom_key or not requested(request, ctx):
        return None
    text = last_user_text(gen_request)
    if text is None:
        return None
    vector = await _embed(deps, text)
    if vector is None:
        return None
    tenant = ctx.tenant_scope.tenant or deps.config.tenant
    namespace, context = index_namespace(tenant, key), context_digest(gen_request)
    try:
        matches = await deps.vectors.query(list(vector), top_k=TOP_K, namespace=namespace, filter={"context": context})
    except Exception as exc:
        deps.log.warning("semantic cache: vector query failed: %s", exc)
        return None
    now = deps.clock.now()
    if policy.read:
        for match in candidates(text, sorted(matches, key=lambda m: -m.score), now):
            answer, _ = await read(deps, CacheKey(key.scope, str(match.metadata["digest"])))
            if answer is None:  # expired, purged or not yet written: the next candidate may still do
                continue
            generation = Generation(answer.model, answer.replay(), cache_status="HIT",
                                    age=max(0, int(now - answer.created)), cache_key=str(match.metadata["digest"]))
            generation.cache_match = match_header(match.score)
            return Hit(generation)
    neighbour = max((m.score for m in matches if m.metadata.get("digest") != key.digest), default=0.0)
    return Plan(namespace, context, text[:MAX_TEXT_CHARS], vector, neighbour)


def remembered_afterwards(deps: Deps, plan: Plan, key: CacheKey, ttl: int, events: AsyncIterator[Event]) -> Stream[Event]:
    """The answer's events, and once it has finished as a cacheable answer (the exact entry is
    written then), its vector upserted in the background, pointing at the exact entry."""

    def keep(event: Event) -> None:
        if isinstance(event, Finish) and event.finish_reason in CACHEABLE_FINISH and event.cacheable:
            deps.wait_until(_upsert(deps, plan, key, ttl))

    return Stream(events).tap(keep)


async def _upsert(deps: Deps, plan: Plan, key: CacheKey, ttl: int) -> None:
    assert deps.vectors is not None
    metadata: Mapping[str, Any] = {"context": plan.context, "digest": key.digest, "text": plan.text,
                                   "threshold": round(learned_threshold(plan.neighbour), 4),
                                   "expires": int(deps.clock.now() + ttl)}
    try:
        await deps.vectors.upsert([VectorRecord(vector_id(plan.namespace, key.digest), plan.vector, plan.namespace, metadata)])
    except Exception as exc:  # fail open: the exact entry is there; only its paraphrases miss
        deps.log.error("semantic cache: vector upsert failed: %s", exc)

