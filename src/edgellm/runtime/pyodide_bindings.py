"""The Worker's composition root: the core's ports built over `env`'s bindings, one adapter module
per binding (`pyodide_ai`, `pyodide_kv`, `pyodide_r2`, ...). Every import is at the top: the
adapters import the toolbox, never this module, so building the bindings needs no import inside
a function to dodge a circle."""

from __future__ import annotations

import logging
from typing import Any

from ..access.analytics_sql import AnalyticsEngineSQL
from ..artifacts.cached_store import CachedBlobStore
from ..config import Config
from ..deps import Deps
from ..state import IsolateState
from ..telemetry.tracing import LogTracer, NoopTracer
from ..vars import binding_var_problem
from .pyodide_ai import WorkersAI
from .pyodide_conversations import conversation_namespace
from .pyodide_durable import WorkersDurableObjectNamespace
from .pyodide_env import EnvMapping, optional_binding
from .pyodide_fetch import WorkersFetch
from .pyodide_guard import WorkersAIGuard
from .pyodide_kv import WorkersKV
from .pyodide_r2 import WorkersEdgeCache, WorkersR2
from .pyodide_ratelimit import WorkersRateLimit
from .pyodide_toolbox import is_missing
from .pyodide_usage import AnalyticsEngineUsage
from .pyodide_vectorize import WorkersVectorize


def build_deps(env: Any, ctx: Any, state: IsolateState, wait_until: Any = None) -> Deps:
    """The core's ports over the bindings. `wait_until` replaces `ctx.waitUntil` where that one
    is not adapted for Python awaitables (a Durable Object's: `pyodide_flight.ObjectBackground`)."""
    wait_until = wait_until or ctx.waitUntil
    config = isolate_config(env, state)
    kv, r2 = getattr(env, "CACHE", None), getattr(env, "ARTIFACTS", None)
    return Deps(
        config=config,
        ai=WorkersAI(env.AI),
        kv=None if is_missing(kv) else WorkersKV(kv),
        r2=_r2(r2, wait_until),
        wait_until=wait_until,
        state=state,
        conversations=conversation_namespace(env),
        flights=_flights(getattr(env, "FLIGHTS", None)),
        routers=_flights(getattr(env, "ROUTER", None)) if state.config.routing.pools else None,  # a pool's view (routing.router)
        rate_limiter=_rate_limiter(env),
        usage=_usage(env),
        fetch=WorkersFetch() if config.routing.origins else None,
        # spans as log lines beside Workers' own traces ([observability]), when TRACE_LOGS asks
        tracer=LogTracer(ids=state.ids) if config.trace_logs else NoopTracer(),
        vectors=_vectors(env),
        # Llama Guard on the same AI binding (GUARD_MODEL): always there, so a policy that
        # moderates always has its guard; a failing one is GUARD_FAIL's to decide
        guard=WorkersAIGuard(env.AI, config.guard_model),
    )


class Misconfigured(Exception):
    """The Worker's `[vars]` were refused (the config's own line, naming the variable): every
    request of the isolate is answered `errors.misconfigured` (`pyodide.fetch`)."""


def isolate_config(env: Any, state: IsolateState) -> Config:
    """The isolate's Config, parsed from `[vars]` once (they do not change within an isolate). A
    refusal is kept too, and logged here, once per isolate: Cloudflare starts a Worker whatever its
    vars hold, and a line (with a traceback) per request buried the one that mattered."""
    if state.config is not None:
        return state.config
    if state.misconfigured is None:
        try:
            config = Config.from_env(EnvMapping(env))
            period = optional_binding(env, "RATE_LIMIT_PERIOD")
            if period is not None and (problem := binding_var_problem("RATE_LIMIT_PERIOD", period)) is not None:
                raise ValueError(problem)
            state.config = config
            return config
        except ValueError as exc:
            state.misconfigured = str(exc)
            logging.getLogger("edgellm").error("the Worker's configuration is refused, so every request is answered 503 "
                                               "worker_misconfigured until it is fixed and deployed again: %s", exc)
    raise Misconfigured(state.misconfigured)


def _rate_limiter(env: Any) -> WorkersRateLimit | None:
    binding = optional_binding(env, "RATE_LIMITER")
    if binding is None:
        return None
    return WorkersRateLimit(binding, int(str(optional_binding(env, "RATE_LIMIT_PERIOD") or "60").strip()))  # checked: isolate_config


def _usage(env: Any) -> AnalyticsEngineUsage | None:
    """The usage dataset, read back through the SQL API when the account and a token are set."""
    binding = optional_binding(env, "USAGE")
    if binding is None:
        return None
    account, token = optional_binding(env, "ANALYTICS_ACCOUNT_ID"), optional_binding(env, "ANALYTICS_API_TOKEN")
    if not account or not token:
        return AnalyticsEngineUsage(binding)
    dataset = optional_binding(env, "USAGE_DATASET") or "edgellm_usage"
    return AnalyticsEngineUsage(binding, AnalyticsEngineSQL(WorkersFetch(), str(account), str(token), str(dataset)))


def _vectors(env: Any) -> WorkersVectorize | None:
    """The semantic cache's Vectorize index; without it there is no semantic cache."""
    binding = optional_binding(env, "VECTORIZE")
    return None if binding is None or is_missing(binding) else WorkersVectorize(binding)


def _flights(binding: Any) -> WorkersDurableObjectNamespace | None:
    """The coalescing Durable Object binding; without it the Worker does not coalesce."""
    if binding is None or is_missing(binding):
        return None
    return WorkersDurableObjectNamespace(binding)


def _r2(binding: Any, wait_until: Any) -> CachedBlobStore | None:
    if binding is None or is_missing(binding):
        return None
    return CachedBlobStore(WorkersR2(binding), WorkersEdgeCache(), wait_until=wait_until)
