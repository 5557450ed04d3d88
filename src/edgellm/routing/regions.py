"""Region policy for the answer cache: a TTL override, and a resident region's own namespace.

A resident region's answers live under a namespace of their own (`<namespace>.res-<REGION>`),
which is part of the key, so an answer cached for a resident region is never served outside
it and it never reads answers cached elsewhere. `cache: false` turns the cache off for a
region (KV replicates globally, see docs/edge-and-origin.md on what residency cannot guarantee).
"""

from __future__ import annotations

from dataclasses import replace

from ..cache.key import CacheScope
from ..cache.policy import CachePolicy
from ..http import Request
from ..deps import Deps
from .plan import resolve_region


def regional_cache(deps: Deps, request: Request, policy: CachePolicy, scope: CacheScope) -> tuple[CachePolicy, CacheScope | None]:
    """(policy, scope) for this request's region; scope None means: do not cache."""
    region = resolve_region(deps.config.routing, request)
    if region is None:
        return policy, scope
    if not region.cache:
        return replace(policy, read=False, write=False, bypass_reason=f"region {region.name} is not cached"), None
    if region.cache_ttl is not None and request.header("cf-aig-cache-ttl") is None:
        policy = replace(policy, ttl=max(60, region.cache_ttl))
    if region.resident:
        scope = CacheScope(scope.tenant, f"{scope.namespace}.res-{region.name}"[:64], scope.generation)
    return policy, scope
