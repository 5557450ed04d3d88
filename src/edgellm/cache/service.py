"""The cache in front of the AI binding: look up, coalesce, generate, write behind.

Failures of KV never fail a request (fail open): a read error is a miss, a write error is
logged, and both are counted in the stats.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..generation import Generation, GenerationRequest
from ..http import Request
from ..routing.policy import start_routed
from ..routing.regions import regional_cache
from ..ports import Deps
from ..state import CacheCounters
from .entry import CachedAnswer, CorruptEntry, record
from .flight import Flight
from .key import CacheKey, CacheScope, build_cache_key, build_custom_key
from .policy import CachePolicy, cache_policy

GENERATION_KEY = "cache-meta/{tenant}/{namespace}/generation"
GENERATION_REFRESH_SECONDS = 30.0


def counters_of(deps: Deps) -> CacheCounters:
    return deps.state.cache


async def current_scope(deps: Deps, tenant: str | None = None) -> CacheScope:
    """The namespace's purge generation, remembered in the isolate for a few seconds: a
    namespace purge bumps it in KV, and KV itself takes up to 60 s to be seen everywhere."""
    config, generations = deps.config, deps.state.generations
    tenant = tenant or config.tenant
    memo_key = (tenant, config.cache_namespace)
    now = deps.clock.now()
    memo = generations.get(memo_key)
    if memo is not None and now - memo[1] < GENERATION_REFRESH_SECONDS:
        return CacheScope(tenant, config.cache_namespace, memo[0])
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
        return CacheScope(tenant, config.cache_namespace, memo[0] if memo else 0)
    generations[memo_key] = (generation, now)
    return CacheScope(tenant, config.cache_namespace, generation)


async def lookup(deps: Deps, key: CacheKey) -> tuple[CachedAnswer | None, int]:
    """(answer, bytes read) or (None, 0) on a miss, a corrupt entry or a KV failure."""
    assert deps.kv is not None
    try:
        entry = await deps.kv.get(key.kv_key)
    except Exception as exc:
        deps.log.warning("cache read failed for %s: %s", key.kv_key, exc)
        counters_of(deps).read_errors += 1
        return None, 0
    if entry is None:
        return None, 0
    try:
        return CachedAnswer.decode(entry.value), len(entry.value)
    except CorruptEntry as exc:
        deps.log.warning("corrupt cache entry %s treated as a miss: %s", key.kv_key, exc)
        return None, 0


async def store(deps: Deps, key: CacheKey, answer: CachedAnswer, ttl: int) -> bool:
    assert deps.kv is not None
    try:
        await deps.kv.put(key.kv_key, answer.encode(), expiration_ttl=ttl,
                          metadata={"model": answer.model, "created": int(answer.created)})
        return True
    except Exception as exc:
        deps.log.error("cache write failed for %s: %s", key.kv_key, exc)
        counters_of(deps).write_errors += 1
        return False


def scope_tenant(request: Request) -> str | None:
    """The tenant part of the request's cache keys (custom keys included): the caller's own,
    or the shared pool if its key shares (access.guard.Principal); None: the configured tenant."""
    principal = request.principal
    return principal.cache_tenant if principal is not None else None


@dataclass(frozen=True)
class CacheDecision:
    policy: CachePolicy
    key: CacheKey | None


async def decide(deps: Deps, request: Request, gen_request: GenerationRequest) -> CacheDecision:
    policy = cache_policy(request, gen_request, deps.config)
    if policy.bypass or deps.kv is None:
        return CacheDecision(policy, None)
    scope = await current_scope(deps, scope_tenant(request))
    policy, scope = regional_cache(deps, request, policy, scope)  # region TTL; a resident region's own namespace
    if scope is None:
        return CacheDecision(policy, None)
    key = build_custom_key(policy.custom_key, scope) if policy.custom_key else build_cache_key(gen_request, scope)
    return CacheDecision(policy, key)


async def cached_generation(deps: Deps, request: Request, gen_request: GenerationRequest) -> Generation:
    """Answer from KV, join an identical in-flight generation, or start one and cache it."""
    decision = await decide(deps, request, gen_request)
    counters = counters_of(deps)
    if decision.key is None:
        counters.bypasses += 1
        generation = await start_routed(deps, request, gen_request)
        generation.cache_status = "BYPASS"
        return generation
    key, policy = decision.key, decision.policy
    if policy.read:
        answer, size = await lookup(deps, key)
        if answer is not None:
            counters.hits += 1
            counters.bytes_served += size
            age = max(0, int(deps.clock.now() - answer.created))
            return Generation(answer.model, answer.replay(), cache_status="HIT", age=age, cache_key=key.digest)
    counters.misses += 1
    flight = join_or_start(deps, key, policy, gen_request, request)
    events = flight.join()
    model = await asyncio.shield(flight.started)
    return Generation(model, events, cache_status="MISS", cache_key=key.digest, route=flight.route)


def join_or_start(deps: Deps, key: CacheKey, policy: CachePolicy, gen_request: GenerationRequest, request: Request) -> Flight:
    """Requests share a flight only if they would store its answer the same way (write or
    not, for how long): a `no-store` or short-TTL request never decides for another."""
    inflight = deps.state.inflight
    flight_key = f"{key.kv_key}|{'w' if policy.write else 'n'}|{policy.ttl}"
    flight = inflight.get(flight_key)
    if flight is not None:
        counters_of(deps).coalesced += 1
        return flight
    flight = Flight()
    inflight[flight_key] = flight

    def on_done(done: Flight) -> None:
        if inflight.get(flight_key) is done:
            del inflight[flight_key]
        answer = record(done.model, done.events, deps.clock.now()) if done.error is None else None
        if answer is not None and policy.write:
            deps.wait_until(store(deps, key, answer, policy.ttl))

    flight.producer = asyncio.ensure_future(flight.run(lambda: start_routed(deps, request, gen_request), on_done))
    deps.wait_until(flight.producer)  # on the Worker, keeps the isolate alive until the answer is complete
    return flight
