"""The `Deps` bundle: everything a handler may touch, built in one composition root per runtime
(`runtime/bindings.py` on Cloudflare, `edgellm_local.edge` locally; tests build their own).

Beside `ports.py` rather than in it: the bundle carries the parsed `Config` and the isolate's
`IsolateState`, which import the core (admission, routing, errors), while the ports must stay
a leaf that everything may import.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable

from .config import Config
from .durable import DurableObjectNamespace
from .ports import AIBinding, BlobStore, Clock, ContentGuard, FaultControl, HTTPFetch, KVStore, RateLimiter, Tracer, UsageSink, VectorIndex
from .state import IsolateState
from .telemetry.tracing import NoopTracer


@dataclass(frozen=True)
class SystemClock:
    """The `Clock` of every runtime: the wall clock (tests inject a fake one)."""

    def now(self) -> float:
        return time.time()


def _run_in_background(awaitable: Awaitable[Any]) -> None:
    asyncio.ensure_future(awaitable)


@dataclass(frozen=True)
class Deps:
    """Everything a handler may touch. Built once per runtime (a composition root) and
    specialised per request with `for_request` (the Worker's `ctx.waitUntil`)."""

    config: Config
    ai: AIBinding
    kv: KVStore | None = None
    r2: BlobStore | None = None
    clock: Clock = SystemClock()
    wait_until: Callable[[Awaitable[Any]], None] = _run_in_background
    log: logging.Logger = logging.getLogger("edgellm")
    state: IsolateState = field(default_factory=IsolateState)  # per isolate (counters, admission, routing), never module-global
    flights: DurableObjectNamespace | None = None  # the coalescing Durable Object (cache.coalescing); None: no coalescing
    conversations: DurableObjectNamespace | None = None  # one object per conversation (Responses API state)
    routers: DurableObjectNamespace | None = None  # one object per pool of origin replicas (routing.router); None: each isolate's own view
    rate_limiter: RateLimiter | None = None  # the Workers Rate Limiting binding; None: in-isolate windows only
    usage: UsageSink | None = None  # None: usage is not recorded
    fetch: HTTPFetch | None = None  # outbound HTTP to origins (routing); None: the edge only
    faults: FaultControl | None = None  # the AI binding's fault injector (local edge); None: /admin/faults is a 404
    tracer: Tracer = NoopTracer()  # where spans go (telemetry.tracing); by default nowhere
    vectors: VectorIndex | None = None  # the semantic cache's index (Vectorize; SQLite locally); None: no semantic cache
    guard: ContentGuard | None = None  # the moderation model (Llama Guard 3); None: a policy that moderates fails per GUARD_FAIL

    def for_request(self, wait_until: Callable[[Awaitable[Any]], None]) -> "Deps":
        return replace(self, wait_until=wait_until)
