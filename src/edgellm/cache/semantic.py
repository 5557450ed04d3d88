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
- A candidate must pass these checks: its cosine is at least `BASE_THRESHOLD`; at least its own
  threshold, learned when it was stored from its live neighbours (the best score any other entry
  of its context had against it, plus `MARGIN`: where two different questions already sit that
  close, a match must be closer than they are, as vCache learns a threshold per entry), raised
  further by a wrong verdict; the guard (`semantic_guard`: numbers, units, names, polarity,
  content words and their order agree); the verifier when one is configured (`verifier`); and
  the namespace's error bound (`calibration`): while its evidence does not show the wrong-hit
  rate under `SEMANTIC_MAX_ERROR`, a would-be hit is served as a miss and judged by its answer.
- The answer is the candidate's exact entry in KV (the vector only points at it), so its TTL
  and its purge hold for both; the vector carries the same expiry, is dropped from a query's
  matches after it, and deleted.
- The lookup's embedding is metered (the caller's key, a usage row, counters, a span) and has a
  deadline; an index that cannot be reached at all is found once per isolate.

A hit says `cf-aig-cache-status: HIT` and `x-edgellm-cache-match: semantic; score=0.97`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping

from ..access.ratelimit import charge_tokens
from ..deps import Deps
from ..capabilities import WORKERS_AI_MODELS
from ..context import RequestContext
from ..generation import Event, Finish, Generation, GenerationRequest, Token
from ..http import Request
from ..ports import UsageEvent, VectorMatch, VectorRecord
from ..stream import Stream
from ..telemetry.spans import step
from .calibration import same_answer
from .entry import CACHEABLE_FINISH, CachedAnswer
from .key import CacheKey, canonical_request
from .policy import CachePolicy
from .verifier import SemanticVerifier, verifier_for
from .semantic_guard import STRICT_COSINE, disagreement, readable

ExactRead = Callable[[Deps, CacheKey], Awaitable[tuple[CachedAnswer | None, int]]]
HEADER = "x-edgellm-semantic-cache"
MATCH_HEADER = "x-edgellm-cache-match"
# The lowest cosine a candidate may have. No real, human-labelled question pairs could be found in
# a registry to calibrate it on (docs/embeddings.md), so it is the conservative point measured
# elsewhere: on real held-out duplicate questions a bare cosine of 0.95 served 1.9% of the
# non-duplicates and answered 21.6% of the duplicates (0.80 served 15.3%). The error bound
# (cache.calibration) then keeps what is served under SEMANTIC_MAX_ERROR on live evidence.
BASE_THRESHOLD = 0.95
# How much closer than its nearest other entry a match must be to an entry.
MARGIN = 0.02
# Vectorize's most matches when values or metadata are returned (developers.cloudflare.com/vectorize/
# reference/client-api/#topk: "for a query operation with returnValues set to true or returnMetadata set
# to all, topK would be limited to a maximum value of 20"). All of them are asked for, so that expired
# vectors (dropped before ranking, and deleted) cannot crowd a live entry out of the few kept.
TOP_K = 20
# The most a lookup's embedding may take: past it the request is an ordinary miss (a cache never
# makes an answer later than generating it would).
EMBED_DEADLINE_SECONDS = 2.0
MAX_VERIFIED = 2  # candidates the verifier is asked about in one lookup
USAGE_ROUTE = "semantic-cache"  # the usage row of a lookup's embedding
UNREACHABLE = "run remotely"  # workerd's Vectorize binding without an upstream: "... needs to be run remotely"
_WORDISH = re.compile(r"\w+|[^\w\s]")
MAX_TEXT_CHARS = 2000  # the matched text kept in metadata (Vectorize: 10 KiB a vector)


@dataclass(frozen=True)
class Check:
    """A would-be hit to be judged against the real answer (cache.calibration)."""

    namespace: str
    entry: str  # the vector's id
    score: float
    cached: str  # the cached answer's text


@dataclass(frozen=True)
class Plan:
    """A semantic miss: what to remember once the exact entry is written."""

    namespace: str
    context: str
    text: str
    vector: tuple[float, ...]
    neighbour: float  # the best score another entry of this context had against this text (0: none)
    check: Check | None = None  # a would-be hit served as a miss (its namespace's bound not met): judged by this answer


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
    return bool(getattr(_caller_record(ctx), "semantic_cache", False))


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
               learned: bool = True, guard: bool = True, raised: Mapping[str, float] | None = None) -> list[VectorMatch]:
    """The matches (best first) that may answer `text`, in order (module docstring: the three
    checks; `base`, `learned` and `guard` vary them for bench.bench_semantic). A candidate under
    its threshold ends the search: where a closer entry could not answer, no farther one may (a
    farther entry with a lower learned threshold would otherwise answer for a query its nearer,
    stricter neighbour refused). One the guard refuses is skipped: another name or number, and a
    farther entry may name the same ones."""
    found = []
    if guard and not readable(text):  # nothing the guard can compare: only a near-identical vector may answer
        base = max(base, STRICT_COSINE)
    for match in matches:
        meta = match.metadata
        try:
            expires, own = float(meta.get("expires", 0)), float(meta.get("threshold", base))
        except (TypeError, ValueError):
            continue
        if raised:
            own = max(own, raised.get(match.id, 0.0))  # a wrong verdict made this entry stricter
        other = meta.get("text")
        if expires <= now or not isinstance(other, str) or not isinstance(meta.get("digest"), str):
            continue
        if match.score < (max(base, own) if learned else base):
            break
        if guard and (disagreement(text, other) is not None or (not readable(other) and match.score < STRICT_COSINE)):
            continue
        found.append(match)
    return found


def learned_threshold(neighbour: float, base: float = BASE_THRESHOLD) -> float:
    return min(0.995, max(base, neighbour + MARGIN))


def live(matches: list[VectorMatch], now: float) -> tuple[list[VectorMatch], list[str]]:
    """(the matches whose entry has not expired, best first; the ids of those that have). An
    expired vector is never a candidate, never a neighbour, and is deleted by the caller."""
    kept, expired = [], []
    for match in matches:
        try:
            expires = float(match.metadata.get("expires", 0))
        except (TypeError, ValueError):
            expires = 0.0
        (kept if expires > now else expired).append(match)
    kept.sort(key=lambda m: -m.score)
    return kept, [m.id for m in expired]


def neighbour_score(matches: list[VectorMatch], digest: str) -> float:
    """The best score another live entry of this context has against the text (0: none)."""
    return max((m.score for m in matches if m.metadata.get("digest") != digest), default=0.0)


def embedding_dimensions(model: str) -> int | None:
    facts = WORKERS_AI_MODELS.get(model)
    return facts.dimensions if facts is not None and facts.kind == "embedding" else None


def estimated_tokens(text: str) -> int:
    """A lower bound on the embedding model's tokens, as `embeddings.estimated_tokens` counts them
    (words and punctuation, plus two specials), for an answer that carries no count."""
    return len(_WORDISH.findall(text)) + 2


def caller(ctx: RequestContext) -> Any:
    """The request's caller (its `Principal`, None before authentication ran)."""
    return ctx.principal


def caller_tenant(ctx: RequestContext, deps: Deps) -> str:
    """The tenant whose vectors the caller may see."""
    return ctx.tenant_scope.tenant or deps.config.tenant


def _caller_record(ctx: RequestContext) -> Any:
    principal = caller(ctx)
    return principal.record if principal is not None else None


def _unreachable(deps: Deps, exc: BaseException) -> bool:
    """Whether the index said it cannot answer at all in this isolate; remembered if so."""
    if UNREACHABLE in str(exc):
        if not deps.state.semantic.unavailable:
            deps.log.warning("semantic cache: the vector index cannot be reached here (%s): lookups skipped in this isolate", exc)
        deps.state.semantic.unavailable = True
        return True
    return False


async def _reachable(deps: Deps, model: str) -> bool:
    """Once per isolate, before the first embedding is paid for: one query of a unit vector in an
    empty namespace, which answers nothing, or throws where the index has no upstream."""
    semantic = deps.state.semantic
    if not semantic.probed and deps.vectors is not None:
        semantic.probed = True
        width = embedding_dimensions(model)
        if width:
            try:
                await deps.vectors.query([1.0] + [0.0] * (width - 1), top_k=1, namespace="sc-probe")
            except Exception as exc:
                _unreachable(deps, exc)
    return not semantic.unavailable


async def _embed(deps: Deps, ctx: RequestContext, text: str) -> tuple[float, ...] | None:
    """The text's vector, metered as any embedding is (a span, a usage row, the key's tokens and
    the isolate's counters) and bounded by `EMBED_DEADLINE_SECONDS`; None when it failed."""
    model = deps.config.embedding_models[0]
    counters = deps.state.semantic
    span = step(deps, "cache.semantic.embed", {"gen_ai.request.model": model})
    started = deps.clock.now()
    try:
        result = await asyncio.wait_for(deps.ai.embed(model, [text]), EMBED_DEADLINE_SECONDS)
        vector = tuple(float(x) for x in result["data"][0])
    except Exception as exc:  # fail open: without a vector the request is an ordinary miss
        counters.embedding_failures += 1
        deps.log.warning("semantic cache: embedding failed: %s", exc or type(exc).__name__)
        if span is not None:
            span.end(type(exc).__name__)
        return None
    usage = result.get("usage") or {}
    tokens = int(usage.get("prompt_tokens") or estimated_tokens(text))
    counters.embeddings += 1
    counters.embedding_tokens += tokens
    if span is not None:
        span.set("gen_ai.usage.input_tokens", tokens)
        span.end()
    _charge(deps, ctx, model, tokens, started)
    return vector


def _charge(deps: Deps, ctx: RequestContext, model: str, tokens: int, started: float) -> None:
    """The lookup's embedding on the caller's key (its budget and its minute's tokens) and in a
    usage row of its own, so that the semantic cache's cost is seen, not hidden in the chat's."""
    principal = caller(ctx)
    record = _caller_record(ctx)
    now = deps.clock.now()
    if principal is None:
        return
    if record is not None:
        charge_tokens(deps.state.access, principal.key_id, record.tokens_per_minute, tokens, now)
        spent = deps.state.access.spent
        spent[principal.key_id] = spent.get(principal.key_id, 0) + tokens
    if deps.usage is None:
        return
    try:
        deps.usage.record_now(UsageEvent(time=now, tenant=principal.scope.usage_tenant, key_id=principal.key_id, model=model,
                                         route=USAGE_ROUTE, cache_status="", prompt_tokens=tokens, completion_tokens=0,
                                         latency_ms=round(max(0.0, now - started) * 1000, 3), status=200))
    except Exception as exc:  # usage never fails a request
        deps.log.warning("usage record failed: %s", exc)


def _forget(deps: Deps, ids: list[str]) -> None:
    """Expired vectors, deleted after the response (Vectorize `deleteByIds`; a DELETE locally)."""
    if not ids or deps.vectors is None:
        return
    vectors = deps.vectors

    async def delete() -> None:
        try:
            await vectors.delete_by_ids(ids)
            deps.state.semantic.expired_deleted += len(ids)
        except Exception as exc:
            deps.log.warning("semantic cache: deleting %d expired vectors failed: %s", len(ids), exc)

    deps.wait_until(delete())


async def lookup(deps: Deps, request: Request, ctx: RequestContext, gen_request: GenerationRequest, key: CacheKey,
                 policy: CachePolicy, read: ExactRead, generate: Callable[[], Awaitable[Generation]] | None = None) -> Hit | Plan | None:
    """After the exact cache missed: a `Hit`, or the `Plan` that remembers this request's answer,
    or None (not asked for, not applicable, or a dependency failed: the request is a plain miss).
    `read` is the exact cache's own read of an entry (`service.lookup`), passed in by it;
    `generate` makes the real answer on the operator's account, for a sampled check of a hit."""
    if deps.vectors is None or not deps.config.embedding_models or policy.custom_key or not requested(request, ctx):
        return None
    text = last_user_text(gen_request)
    if text is None:
        return None
    if not await _reachable(deps, deps.config.embedding_models[0]):
        deps.state.semantic.skipped += 1
        return None
    vector = await _embed(deps, ctx, text)
    if vector is None:
        return None
    namespace, context = index_namespace(caller_tenant(ctx, deps), key), context_digest(gen_request)
    try:
        found = await deps.vectors.query(list(vector), top_k=TOP_K, namespace=namespace, filter={"context": context})
    except Exception as exc:
        _unreachable(deps, exc)
        deps.log.warning("semantic cache: vector query failed: %s", exc)
        return None
    now = deps.clock.now()
    matches, expired = live(found, now)
    _forget(deps, expired)
    calibration = deps.state.semantic.calibration
    verifier, refused = verifier_for(deps.ai, deps.config.semantic_verifier), 0
    if policy.read:
        for match in candidates(text, matches, now, raised=calibration.raised):
            answer, _ = await read(deps, CacheKey(key.scope, str(match.metadata["digest"])))
            if answer is None or answer.tool_calls:  # gone (the next may do), or a tool call: no text to check it by
                continue
            if verifier is not None:
                verdict = await _verified(deps, verifier, text, str(match.metadata["text"]))
                if verdict is None:
                    break  # the verifier failed: no hit
                if not verdict:
                    refused += 1
                    if refused >= MAX_VERIFIED:
                        break
                    continue  # a second candidate, only after the verifier refused the first
            check = Check(namespace, match.id, match.score, answer.text)
            bound = max_error(deps, ctx)
            if bound is not None and not calibration.estimate(namespace).serves(bound):
                calibration.stopped_hits += 1  # served as a miss, whose own answer judges this match
                return Plan(namespace, context, text[:MAX_TEXT_CHARS], vector, neighbour_score(matches, key.digest), check)
            generation = Generation(answer.model, answer.replay(), cache_status="HIT",
                                    age=max(0, int(now - answer.created)), cache_key=str(match.metadata["digest"]))
            generation.cache_match = match_header(match.score)
            if bound is not None and generate is not None and _sampled(deps) and \
                    calibration.may_check(now, deps.config.semantic_checks_per_minute):  # no bound: nothing to keep, no cost
                deps.wait_until(_check_later(deps, check, generate))
            return Hit(generation)
    return Plan(namespace, context, text[:MAX_TEXT_CHARS], vector, neighbour_score(matches, key.digest))


async def _verified(deps: Deps, verifier: SemanticVerifier, text: str, other: str) -> bool | None:
    """The verifier's verdict on a candidate (None: it failed), timed, counted and traced."""
    state = deps.state.semantic
    span = step(deps, "cache.semantic.verify", {"gen_ai.request.model": deps.config.semantic_verifier})
    started = time.perf_counter()
    state.verifications += 1
    try:
        score = await asyncio.wait_for(verifier.score(text, other), EMBED_DEADLINE_SECONDS)
    except Exception as exc:
        state.verifier_failures += 1
        deps.log.warning("semantic cache: the verifier failed: %s", exc or type(exc).__name__)
        if span is not None:
            span.end(type(exc).__name__)
        return None
    finally:
        state.verifier_seconds += time.perf_counter() - started
    accepted = score >= deps.config.semantic_verifier_threshold
    state.verifier_refusals += not accepted
    if span is not None:
        span.set("edgellm.verifier.score", score)
        span.end()
    return accepted


def max_error(deps: Deps, ctx: RequestContext) -> float | None:
    """The caller's key's bound on wrong semantic hits, else SEMANTIC_MAX_ERROR (None: off)."""
    own = getattr(_caller_record(ctx), "semantic_max_error", None)
    return float(own) if own is not None else deps.config.semantic_max_error


def _sampled(deps: Deps) -> bool:
    rate = deps.config.semantic_check_rate
    return rate > 0 and int(deps.state.ids.hex(4), 16) / 2 ** 32 < rate


def judge(deps: Deps, check: Check, fresh: str) -> bool:
    """A verdict on a would-be hit: recorded in the namespace's estimate (and the entry's threshold)."""
    right = same_answer(check.cached, fresh)
    deps.state.semantic.calibration.record(check.namespace, check.entry, check.score, right, MARGIN)
    return right


async def _check_later(deps: Deps, check: Check, generate: Callable[[], Awaitable[Generation]]) -> None:
    """After the response: the real answer to a served hit's question, made on the operator's
    account (counted in the calibration's tokens, in no tenant's usage), judged against the hit."""
    calibration = deps.state.semantic.calibration
    try:
        generation = await generate()
        parts: list[str] = []
        async for event in Stream(generation.events):
            if isinstance(event, Token):
                parts.append(event.text)
            elif isinstance(event, Finish):
                calibration.sampled_checks += 1
                calibration.check_tokens += event.usage.total_tokens
                if event.finish_reason in CACHEABLE_FINISH and event.cacheable:
                    judge(deps, check, "".join(parts))
    except Exception as exc:  # a check never fails anything: no verdict
        deps.log.warning("semantic cache: a sampled check failed: %s", exc)


def forget_entry(deps: Deps, tenant: str, key: CacheKey) -> None:
    """An exact entry purged by its key: its vector goes too (after the response), so that it is
    no longer a neighbour that raises the thresholds learned beside it."""
    namespace = index_namespace(tenant, key)
    _forget(deps, [vector_id(namespace, key.digest)])


def remembered_afterwards(deps: Deps, plan: Plan, key: CacheKey, ttl: int, events: AsyncIterator[Event]) -> Stream[Event]:
    """The answer's events, and once it has finished as a cacheable answer (the exact entry is
    written then), its vector upserted in the background, pointing at the exact entry."""

    parts: list[str] = []

    def keep(event: Event) -> None:
        if isinstance(event, Token) and plan.check is not None:
            parts.append(event.text)
        if isinstance(event, Finish) and event.finish_reason in CACHEABLE_FINISH and event.cacheable:
            if plan.check is not None:  # a would-be hit, served as this miss: its answer is the verdict, at no cost
                deps.state.semantic.calibration.free_checks += 1
                judge(deps, plan.check, "".join(parts))
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
        _unreachable(deps, exc)
        deps.log.error("semantic cache: vector upsert failed: %s", exc)

