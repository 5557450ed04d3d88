"""The cache in front of the AI binding: look up, coalesce, generate, write behind.

Failures of KV never fail a request (fail open): a read error is a miss, a write error is
logged, and both are counted in the stats. Identical misses share one generation only through
the flights Durable Object (`cache.coalescing`); without it every miss generates on its own.
"""

from __future__ import annotations

import json
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import AsyncIterator, Awaitable

from ..generation import Event, Finish, Generation, GenerationRequest
from ..context import RequestContext
from ..http import Request
from ..routing.failover import start_routed
from ..routing.regions import regional_cache
from ..deps import Deps
from ..guardrails.answer import AnswerCheck, checked_answer
from ..guardrails.policy import Policy, parse_policy, stricter_than
from ..guardrails.unmask import unmasked_answer
from ..stream import Stream
from ..telemetry import tracing
from ..telemetry.spans import step, traced_generation
from . import semantic
from .coalescing import FlightOrder, FlightPlan, flight_name, shared_generation
from .entry import CachedAnswer, CorruptEntry, record
from .key import CacheKey, CacheScope, build_cache_key, build_custom_key
from .policy import CachePolicy, cache_policy
from .store import counters_of, store

__all__ = ["cached_generation", "counters_of", "current_scope", "lookup", "store", "GENERATION_KEY"]

GENERATION_KEY = "cache-meta/{tenant}/{namespace}/generation"
GENERATION_REFRESH_SECONDS = 30.0
# KV's `cacheTtl` on an entry's read (its default, said out loud): an entry's key names its
# request and purge generation, and it is written once, so a HIT may be read from the location's
# cache of an earlier read; KV's floor is 60 s (the runtime notes).
ENTRY_READ_CACHE_SECONDS = 60


async def current_scope(deps: Deps, tenant: str | None = None) -> CacheScope:
    """The namespace's purge generation, remembered in the isolate for a few seconds: a
    namespace purge bumps it in KV, and KV itself takes up to 60 s to be seen everywhere."""
    config, generations = deps.config, deps.state.generations
    tenant = tenant or config.tenant
    memo_key = (tenant, config.cache_namespace)
    now = deps.clock.now()
    memo = generations.get(memo_key)
    if memo is not None and now - memo[1] < GENERATION_REFRESH_SECONDS:
        return memo[0]  # the scope itself: its names were checked when it was made
    if deps.kv is None:
        return CacheScope(tenant, config.cache_namespace, 0)
    try:
        entry = await deps.kv.get(GENERATION_KEY.format(tenant=tenant, namespace=config.cache_namespace))
        generation = int(entry.value) if entry is not None else 0
    except Exception as exc:
        # Fail open on the last generation this isolate knew (0 if none), and do not remember
        # the guess: the next request asks KV again rather than undoing a purge for 30 s.
        deps.log.warning("cache generation read failed: %s", exc)
        counters_of(deps).read_errors += 1
        return CacheScope(tenant, config.cache_namespace, memo[0].generation if memo else 0)
    scope = CacheScope(tenant, config.cache_namespace, generation)
    generations[memo_key] = (scope, now)
    return scope


async def lookup(deps: Deps, key: CacheKey) -> tuple[CachedAnswer | None, int]:
    """(answer, bytes read) or (None, 0) on a miss, a corrupt entry or a KV failure."""
    assert deps.kv is not None
    try:
        entry = await deps.kv.get(key.kv_key, cache_ttl=ENTRY_READ_CACHE_SECONDS)
    except Exception as exc:
        deps.log.warning("cache read failed for %s: %s", key.kv_key, exc)
        counters_of(deps).read_errors += 1
        return None, 0
    if entry is None:
        return None, 0
    try:
        value = bytes(entry.value)
        return decoded(deps, key.kv_key, value), len(value)
    except CorruptEntry as exc:
        deps.log.warning("corrupt cache entry %s treated as a miss: %s", key.kv_key, exc)
        return None, 0


# The largest entry the decode memo keeps: its memory is bounded in bytes, not only in count (a
# KV value may be 25 MiB; a Worker isolate has 128 MB). A few hundred tokens fit.
MEMO_MAX_ENTRY_BYTES = 8 * 1024


def decoded(deps: Deps, kv_key: str, value: bytes) -> CachedAnswer:
    """`CachedAnswer.decode`, remembered for the entries HIT most (`IsolateState.answers`; a pure
    function of the bytes, so a HIT reads the entry it would have decoded). The tenant's own KV
    key is part of the memo's key, so one tenant's HIT never finds another's decode warm (no
    timing tells it what another tenant asked); a corrupt entry raises, so it is never kept."""
    memo = deps.state.answers
    answer = memo.get((kv_key, value))
    if answer is None:
        answer = CachedAnswer.decode(value)
        if len(value) <= MEMO_MAX_ENTRY_BYTES:
            memo.put((kv_key, value), answer)
    return answer


@dataclass(frozen=True)
class CacheDecision:
    policy: CachePolicy
    key: CacheKey | None


async def decide(deps: Deps, request: Request, ctx: RequestContext, gen_request: GenerationRequest) -> CacheDecision:
    policy = cache_policy(request, gen_request, deps.config)
    if policy.bypass or deps.kv is None:
        return CacheDecision(policy, None)
    tenancy = ctx.tenant_scope  # custom keys: the caller's own tenant; derived keys: maybe the shared pool
    scope = await current_scope(deps, tenancy.custom_key_tenant if policy.custom_key else tenancy.cache_tenant)
    policy, scope = regional_cache(deps, request, policy, scope)  # region TTL; a resident region's own namespace
    if scope is None:
        return CacheDecision(policy, None)
    key = build_custom_key(policy.custom_key, scope) if policy.custom_key else build_cache_key(gen_request, scope)
    return CacheDecision(policy, key)


def own_generation(deps: Deps, request: Request, ctx: RequestContext, gen_request: GenerationRequest) -> Awaitable[Generation]:
    """This request's own generation (on the routing plan), if the isolate admits it."""
    return deps.state.admission.admitted(
        deps.config.max_waiting_generations,
        lambda: traced_generation(deps, gen_request, lambda: start_routed(deps, request, gen_request)), ctx.tenant_scope.admission_tenant)


def check_generation(deps: Deps, request: Request, gen_request: GenerationRequest) -> Awaitable[Generation]:
    """A semantic hit's check (cache.calibration): the real answer, after the response, in the
    operator's share of the isolate's places (no tenant's), never written to the cache."""
    return deps.state.admission.admitted(
        deps.config.max_waiting_generations,
        lambda: traced_generation(deps, gen_request, lambda: start_routed(deps, request, gen_request)), None)


def answer_check(ctx: RequestContext) -> AnswerCheck | None:
    """The caller's answer guardrails (set by the guardrails layer), when they check anything."""
    check = ctx.guardrails.answer if ctx.guardrails is not None else None
    return check if check is not None and check.active else None


def checked(deps: Deps, generation: Generation, check: AnswerCheck | None, gen_request: GenerationRequest) -> Generation:
    """`generation` with its answer checked (`guardrails.answer`) before anything reads it: the
    renderer, and the cache writer put after this step. A whole answer is one window."""
    if check is None:
        return generation
    window = check if gen_request.stream else replace(check, window=0)
    generation.events = checked_answer(generation.events, deps, window, gen_request.stream)
    generation.rendered = None  # a kept rendering would skip the events, and so the check
    return generation


def restored(generation: Generation, check: AnswerCheck) -> Generation:
    """`generation` with this caller's masked values put back (`unmask_answer`): the last step,
    after the answer's check and the cache writer, so both see only placeholders. A HIT's kept
    renderings are the entry's (masked): this answer is rendered from its events, and not kept."""
    generation.events = unmasked_answer(generation.events, check.placeholders)
    generation.rendered = None
    return generation


def _answer_part(policy: Policy) -> Policy:
    return Policy(answer=policy.answer, dlp=policy.dlp)


def rechecked(stored: str, check: AnswerCheck | None) -> bool:
    """Whether a HIT stored under the policy `stored` must be checked again for this caller:
    its policy asks more of answers than the stored one did."""
    if check is None:
        return False
    try:
        under = parse_policy(stored) if stored else Policy()
    except ValueError:  # an entry's policy the parser refuses now: checked again
        return True
    return stricter_than(_answer_part(check.policy), under)


async def cached_generation(deps: Deps, request: Request, ctx: RequestContext, gen_request: GenerationRequest) -> Generation:
    """Answer from KV, or generate (through the flights object when there is one) and cache it."""
    decision = await decide(deps, request, ctx, gen_request)
    counters = counters_of(deps)
    check = answer_check(ctx)
    if decision.key is None:
        counters.bypasses += 1
        generation = checked(deps, await own_generation(deps, request, ctx, gen_request), check, gen_request)
        generation.cache_status = "BYPASS"
        return restored(generation, check) if check is not None and check.placeholders else generation
    key, policy = decision.key, decision.policy
    if policy.read:
        span = step(deps, "cache.lookup", {"edgellm.cache.namespace": deps.config.cache_namespace})
        answer, size = await lookup(deps, key)
        if span is not None:
            span.set("edgellm.cache_status", "HIT" if answer is not None else "MISS")
            span.end()
        if answer is not None:
            counters.hits += 1
            counters.bytes_served += size
            age = max(0, int(deps.clock.now() - answer.created))
            kept = answer.derived if size <= MEMO_MAX_ENTRY_BYTES else None  # an entry the isolate keeps decoded keeps its renderings
            hit = Generation(answer.model, answer.replay(), cache_status="HIT", age=age, cache_key=key.digest, rendered=kept)
            if check is None:
                return hit
            if rechecked(answer.guardrails, check):
                hit = checked(deps, hit, check, gen_request)
            return restored(hit, check) if check.placeholders else hit  # unmasked with this caller's own map
    plan = await semantic.lookup(deps, request, ctx, gen_request, key, policy, lookup, lambda: check_generation(deps, request, gen_request))
    if isinstance(plan, semantic.Hit):
        counters.hits += 1
        counters.semantic_hits += 1
        hit = checked(deps, plan.generation, check, gen_request)  # another question's answer: always checked
        return restored(hit, check) if check is not None and check.placeholders else hit
    counters.misses += 1
    # an answer under check is never coalesced: a flight writes its entry in the Durable Object,
    # before this isolate's check could stop it
    if deps.flights is not None and check is None:
        order = FlightOrder(gen_request, key.kv_key, policy.write, policy.ttl, await FlightPlan.decide(deps, request, gen_request),
                            ctx.tenant_scope.admission_tenant)
        span = step(deps, "cache.flight")
        try:
            with tracing.using(span) if span is not None else nullcontext():
                generation, joined = await deps.state.admission.admitted_flight(
                    flight_name(order.kv_key, order.write, order.ttl), deps.config.max_waiting_generations,
                    lambda: shared_generation(deps, order), ctx.tenant_scope.admission_tenant)
        except BaseException as exc:
            if span is not None:
                span.end(type(exc).__name__)
            raise
        if span is not None:
            span.set("edgellm.flight", "joined" if joined else "started")
            span.end()
        counters.coalesced += joined
    else:
        generation = checked(deps, await own_generation(deps, request, ctx, gen_request), check, gen_request)
        if policy.write:
            under = json.dumps(_answer_part(check.policy).to_json(), sort_keys=True, separators=(",", ":")) if check is not None else ""
            generation.events = stored_afterwards(deps, key.kv_key, policy.ttl, generation.model, generation.events, under)
    if plan is not None and policy.write:  # once the exact entry is written, its vector points at it
        generation.events = semantic.remembered_afterwards(deps, plan, key, policy.ttl, generation.events)
    generation.cache_status, generation.cache_key = "MISS", key.digest
    return restored(generation, check) if check is not None and check.placeholders else generation


def stored_afterwards(deps: Deps, kv_key: str, ttl: int, model: str, events: AsyncIterator[Event], guardrails: str = "") -> Stream[Event]:
    """A miss without the flights object: this request's own generation, written to KV once it
    has run to its Finish (never a partial one). A `Stream`, so closing it unread closes the
    generation too. `guardrails`: the policy the answer was checked under, kept in the entry."""
    seen: list[Event] = []

    def keep(event: Event) -> None:
        seen.append(event)
        if isinstance(event, Finish):
            answer = record(model, seen, deps.clock.now())
            if answer is not None:
                if guardrails:
                    answer = replace(answer, guardrails=guardrails)
                deps.wait_until(store(deps, kv_key, answer, ttl))

    return Stream(events).tap(keep)
