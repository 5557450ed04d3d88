"""Writing an answer to KV: the one writer, shared by the Worker, the flights object and preload.

A failed write never fails a request (fail open): it is logged and counted.
"""

from __future__ import annotations

from ..deps import Deps
from ..state import CacheCounters
from ..telemetry.spans import step
from .entry import CachedAnswer


def counters_of(deps: Deps) -> CacheCounters:
    return deps.state.cache


async def store(deps: Deps, kv_key: str, answer: CachedAnswer, ttl: int) -> bool:
    assert deps.kv is not None
    span = step(deps, "cache.write", {"edgellm.cache.ttl": ttl})
    try:
        await deps.kv.put(kv_key, answer.encode(), expiration_ttl=ttl,
                          metadata={"model": answer.model, "created": int(answer.created)})
        if span is not None:
            span.end()
        return True
    except Exception as exc:
        deps.log.error("cache write failed for %s: %s", kv_key, exc)
        counters_of(deps).write_errors += 1
        if span is not None:
            span.end(f"{type(exc).__name__}")
        return False
