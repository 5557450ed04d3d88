"""The isolate's metrics as Prometheus families, and the Prometheus text format written from them.

`families(deps)` reads every count once per scrape: the finished requests' (`Telemetry`), and what
the cache, admission, routing and the engine count themselves. Every sample carries the isolate's
name (`isolate="..."`, drawn once per isolate): on Cloudflare successive scrapes reach different
isolates, and without it Prometheus would read two isolates' counters as one counter that resets.
`render_text` writes them in the text exposition format (0.0.4) with no package, as the Worker
must; `GET /metrics` serves that text on both runtimes, and tests hold it equal to
`prometheus_client`'s rendering of the same families, on a real edge's metrics too.

Names follow vLLM's where the meaning is the same (`time_to_first_token_seconds`,
`e2e_request_latency_seconds`, `prompt_tokens`, `generation_tokens`, `num_requests_running`),
under the `edgellm_` prefix; counters are named without `_total`, which their samples carry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .metrics import Histogram, status_label

if TYPE_CHECKING:
    from ..deps import Deps

# What the text is: the 0.0.4 format (legacy names, no UTF-8 escaping), as prometheus_client says
# of the same text when a scraper does not ask for 1.0.0 (`CONTENT_TYPE_PLAIN_0_0_4`).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ISOLATE_LABEL = "isolate"
PREFIX = "edgellm_"


@dataclass
class Family:
    """One metric family: `samples` are (suffix, labels, value); a counter's suffix is `_total`,
    a histogram's `_bucket`, `_sum` and `_count`, a gauge's empty."""

    name: str
    type: str  # counter | gauge | histogram
    help: str
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)


def _counter(name: str, help: str, labels: tuple[str, ...], counts: dict[Any, int]) -> Family:
    family = Family(PREFIX + name, "counter", help)
    for key, value in sorted(counts.items()):
        family.samples.append(("_total", dict(zip(labels, key if isinstance(key, tuple) else (key,))), float(value)))
    return family


def _single(name: str, type: str, help: str, value: float, labels: dict[str, str] | None = None) -> Family:
    return Family(PREFIX + name, type, help, [("_total" if type == "counter" else "", labels or {}, float(value))])


def go_float(value: float) -> str:
    """A number as Prometheus (and `prometheus_client`) spell it: `+Inf`, `1.0`, `0.25`."""
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _histogram(name: str, help: str, labels: tuple[str, ...], series: dict[tuple[str, ...], Histogram]) -> Family:
    family = Family(PREFIX + name, "histogram", help)
    for key, histogram in sorted(series.items()):
        base = dict(zip(labels, key))
        for bound, count in zip((*histogram.bounds, math.inf), histogram.cumulative()):
            family.samples.append(("_bucket", {**base, "le": go_float(bound)}, float(count)))
        family.samples.append(("_count", base, float(histogram.count)))
        family.samples.append(("_sum", base, histogram.total))
    return family


def _by_status_class(requests: dict[tuple[str, str, str, int], int]) -> dict[tuple[str, ...], int]:
    out: dict[tuple[str, ...], int] = {}
    for (route, model, tenant, digit), n in requests.items():
        key = (route, model, tenant, status_label(digit))
        out[key] = out.get(key, 0) + n
    return out


def engine_load(deps: Deps) -> dict[str, Any] | None:
    """The engine's slots, when the AI binding says (the local edge's llama.cpp slot pool)."""
    try:
        described = deps.ai.describe(deps.config.model, live=True) or {}
    except Exception:  # a scrape never fails for an engine that cannot say
        return None
    slots = described.get("slots")
    return slots if isinstance(slots, dict) else None


def _semantic(deps: Deps) -> list[Family]:
    """The semantic cache: its error bound's evidence (every namespace of the isolate pooled, so
    the labels stay bounded; per namespace: /admin/cache/stats) and its lookups' costs."""
    semantic = deps.state.semantic
    calibration = semantic.calibration
    pooled = calibration.pooled()
    low, high = pooled.interval
    stopped = sum(1 for e in calibration.estimates.values() if deps.config.semantic_max_error is not None
                  and not e.serves(deps.config.semantic_max_error))
    return [
        Family(PREFIX + "cache_semantic_wrong_rate", "gauge", "Share of checked semantic hits that were wrong, and its Wilson 95% "
               "interval (this isolate's evidence, every namespace pooled).",
               [("", {"bound": "estimate"}, pooled.rate), ("", {"bound": "lower"}, low), ("", {"bound": "upper"}, high)]),
        _single("cache_semantic_max_error", "gauge", "The configured bound on wrong semantic hits (SEMANTIC_MAX_ERROR; 1 when off).",
                deps.config.semantic_max_error if deps.config.semantic_max_error is not None else 1.0),
        _counter("cache_semantic_verdicts", "Semantic hits checked against the real answer, by verdict.", ("verdict",),
                 {"right": calibration.right, "wrong": calibration.wrong}),
        _counter("cache_semantic_checks", "Checks of semantic hits: free (a would-be hit served as a miss), sampled (an extra "
                 "generation, the operator's), capped (not made: the minute's cap).", ("kind",),
                 {"free": calibration.free_checks, "sampled": calibration.sampled_checks, "capped": calibration.capped}),
        _single("cache_semantic_check_tokens", "counter", "Tokens of the sampled checks' generations (charged to the operator).",
                calibration.check_tokens),
        _single("cache_semantic_check_rate", "gauge", "Share of served semantic hits sampled for a check (SEMANTIC_CHECK_RATE).",
                deps.config.semantic_check_rate),
        _single("cache_semantic_stopped_namespaces", "gauge", "Namespaces whose semantic hits are stopped: their wrong-hit "
                "interval's upper bound is above the bound.", stopped),
        _single("cache_semantic_stopped_hits", "counter", "Would-be semantic hits served as misses, their namespace's bound not met.",
                calibration.stopped_hits),
        _counter("cache_semantic_embeddings", "The semantic lookups' embeddings, by outcome.", ("outcome",),
                 {"made": semantic.embeddings, "failed": semantic.embedding_failures, "skipped": semantic.skipped}),
        _single("cache_semantic_embedding_tokens", "counter", "Tokens of the semantic lookups' embeddings.", semantic.embedding_tokens),
        _counter("cache_semantic_verifications", "Candidates the verifier (SEMANTIC_VERIFIER) was asked about, by outcome.", ("outcome",),
                 {"accepted": semantic.verifications - semantic.verifier_refusals - semantic.verifier_failures,
                  "refused": semantic.verifier_refusals, "failed": semantic.verifier_failures}),
        _single("cache_semantic_verifier_seconds", "counter", "Time spent asking the verifier (its added latency, together).",
                semantic.verifier_seconds),
    ]


def families(deps: Deps) -> list[Family]:
    state = deps.state
    t, cache, admission, routing = state.telemetry, state.cache, state.admission, state.routing
    out = [
        _counter("requests", "Requests answered, by route template, model served, tenant and status class.",
                 ("route", "model", "tenant", "status"), _by_status_class(t.requests)),
        _single("cache_hits", "counter", "Answers served from the KV cache.", cache.hits),
        _single("cache_misses", "counter", "Cacheable requests not in the KV cache (generated, then stored).", cache.misses),
        _single("cache_bypasses", "counter", "Requests that skipped the cache (asked to, uncacheable, or no KV).", cache.bypasses),
        _single("cache_coalesced", "counter", "Misses that joined an identical generation already running (no generation of their own).",
                cache.coalesced),
        _single("cache_semantic_hits", "counter", "Of the cache hits, those answered by meaning (the semantic cache).", cache.semantic_hits),
        _single("cache_served_bytes", "counter", "Bytes of cache entries served.", cache.bytes_served),
        *_semantic(deps),
        _counter("prompt_tokens", "Prompt tokens processed, by model and tenant (cache HITs count none).", ("model", "tenant"), t.prompt_tokens),
        _counter("generation_tokens", "Tokens generated, by model and tenant (cache HITs count none).", ("model", "tenant"),
                 t.generation_tokens),
        _histogram("time_to_first_token_seconds", "Seconds from the request's arrival to its first token, by model and where it was "
                   "served (cache, edge, origin, fallback).", ("model", "served_by"), t.ttft),
        _histogram("e2e_request_latency_seconds", "Seconds from a generation request's arrival to its answer's end, by model and "
                   "where it was served.", ("model", "served_by"), t.latency),
        _single("num_requests_running", "gauge", "Generations in progress in this isolate (admitted).", admission.active),
        _single("admission_refusals", "counter", "Generations refused with 503 because every place was taken.", admission.refused),
        _single("origin_failures", "counter", "Origin calls that failed (unreachable, refused, cut).", routing.counters.origin_errors),
        _counter("routed", "Answers generated for this isolate's requests (not cache HITs), by where they ran: the edge or "
                 "an origin (a fallback ran at both).", ("to",), t.routed),
        _counter("failovers", "Edge generations moved to an origin, by when.", ("when",),
                 {"before_first_token": routing.counters.failovers_before_first_token,
                  "mid_stream": routing.counters.failovers_mid_stream}),
        _counter("kv_errors", "KV calls that failed (the cache fails open).", ("operation",),
                 {"read": cache.read_errors, "write": cache.write_errors}),
        _single("r2_errors", "counter", "R2 calls that failed.", t.r2_errors),
        _counter("guardrails_verdicts", "Guardrails verdicts, by stage (prompt, answer), what was found (a Llama Guard category "
                 "S1..S14, a DLP detector, or guard_error) and the action taken (block, mask, flag; a guard error: closed, open).",
                 ("stage", "label", "action"), t.guardrails),
        _single("isolate_start_time_seconds", "gauge", "Unix time this isolate (on the local edge: this process) began counting; "
                "another value means another isolate, or a new one, whose counters start from zero.", t.started_at),
    ]
    out.extend(_replica_families(deps))
    breaker = routing.breaker  # None until routing first asks it: a breaker not yet made is closed
    now_state = breaker.state if breaker is not None else "closed"
    out.append(Family(PREFIX + "breaker_state", "gauge", "The edge's circuit breaker: 1 for its current state.",
                      [("", {"state": s}, float(now_state == s)) for s in ("closed", "half_open", "open")]))
    out.append(_single("breaker_opened", "counter", "Times the edge's breaker opened.", breaker.opened_count if breaker is not None else 0))
    slots = engine_load(deps)
    if slots is not None:
        out.append(_single("num_requests_waiting", "gauge", "Generations waiting for an engine slot.", float(slots.get("waiting", 0))))
        out.append(_single("slots_busy", "gauge", "Engine slots generating now.", float(slots.get("busy", 0))))
        out.append(_single("slots", "gauge", "Engine slots that generate at once.", float(slots.get("generating_at_once", 0))))
    isolate = t.isolate
    for family in out:
        family.samples = [(suffix, {**labels, ISOLATE_LABEL: isolate}, value) for suffix, labels, value in family.samples]
    return out


def _replica_families(deps: Deps) -> list[Family]:
    """Per replica of each pool, labelled with the configured names only (never a request's)."""
    routing, views = deps.config.routing, deps.state.routing.pools
    if not routing.pools:
        return []
    routed = Family(PREFIX + "routed_replica", "counter", "Generations this isolate sent to each replica of a pool.")
    flight = Family(PREFIX + "replica_in_flight", "gauge", "Generations this isolate has in flight on each replica of a pool.")
    for pool in routing.pools.values():
        view = views.get(pool.name)
        for name in pool.replicas:
            replica = view.replicas.get(name) if view is not None else None
            labels = {"pool": pool.name, "replica": name}
            routed.samples.append(("_total", labels, float(replica.sent if replica else 0)))
            flight.samples.append(("", labels, float(replica.in_flight if replica else 0)))
    return [routed, flight]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_text(all_families: list[Family]) -> str:
    lines: list[str] = []
    for family in all_families:
        # the 0.0.4 text format names a counter by its sample (`_total`), as prometheus_client writes it
        # and its parser needs (it folds `x_total` into family `x` only when the TYPE line says `x_total`)
        named = family.name + "_total" if family.type == "counter" else family.name
        lines.append(f"# HELP {named} {family.help.replace(chr(92), chr(92) * 2).replace(chr(10), chr(92) + 'n')}")
        lines.append(f"# TYPE {named} {family.type}")
        for suffix, labels, value in family.samples:
            labelled = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
            lines.append(f"{family.name}{suffix}{{{labelled}}} {go_float(value)}" if labelled else f"{family.name}{suffix} {go_float(value)}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TextExposition:
    """The Worker's `/metrics` writer: the text format, from the core's own families."""

    def render(self, all_families: list[Family]) -> tuple[bytes, str]:
        return render_text(all_families).encode(), CONTENT_TYPE
