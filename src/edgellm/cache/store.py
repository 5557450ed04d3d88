"""Writing an answer to KV: the one writer, shared by the Worker, the flights object and preload.

A failed write never fails a request (fail open): it is logged and counted.
"""

from __future__ import annotations

from ..deps import Deps
from ..state import CacheCounters
from .entry import CachedAnswer


def counters_of(deps: Deps) -> CacheCounters:
    return deps.state.cache


async def store(deps: Deps, kv_key: str, answer: CachedAnswer, ttl: int) -> bool:
    assert deps.kv is not None
    try:
        await deps.kv.put(kv_key, answer.encode(), expiration_ttl=ttl,
                          metadata={"model": answer.model, "created": int(answer.created)})
        return True
    except Exception as exc:
        deps.log.error("cache write failed for %s: %s", kv_key, exc)
        counters_of(deps).write_errors += 1
        return False
