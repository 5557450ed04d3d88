"""The isolate's metrics: plain counters and histograms, kept in `IsolateState.telemetry`.

A request adds to them once, when it ends (`record_request`): a few dict increments, and for a
generation two histogram observations. What other modules already count (the cache's hits and
misses, the breaker, admission) is read from their own counters when `/metrics` is scraped, never
counted twice.

Every label is bounded: routes are the routing table's templates, models the ones the gateway
served, status a class (`2xx`), where a generation ran one of a few words (`served_by`). Tenants
come from key records, which an operator makes; still, past `MAX_SERIES` label sets a new one is
folded into `other`, so no traffic can grow the exposition without end.
"""

from __future__ import annotations

import secrets
import time
from bisect import bisect_left
from dataclasses import dataclass, field

# Seconds. vLLM's and llama.cpp's latency buckets span a millisecond to a minute: a cache HIT is
# answered in well under 5 ms, a CPU model's long answer in tens of seconds.
TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
MAX_SERIES = 512  # label sets per family; past it, new tenants are counted as "other"
OTHER = "other"
ISOLATE_BYTES = 4  # the isolate label: 8 hex digits, one value per isolate
STATUS_CLASSES = ("1xx", "2xx", "3xx", "4xx", "5xx")


def status_class(status: int) -> str:
    return status_label(status // 100)


def status_label(digit: int) -> str:
    """`2xx` for 2: the class of a status as `Telemetry.requests` keeps it (its hundreds digit)."""
    return STATUS_CLASSES[min(4, max(0, digit - 1))]


def served_by(route: str | None, cache_status: str) -> str:
    """Where a generation ran, from its `x-edgellm-route` value: `cache` (a HIT), `edge`, `origin`,
    or `fallback` (begun at the edge, finished on an origin). Never the route's reasons or names."""
    if cache_status == "HIT":
        return "cache"
    if not route:
        return "edge"
    where = route.split(";", 1)[0].strip()
    return "fallback" if "," in where else ("origin" if where == "origin" else "edge")


@dataclass
class Histogram:
    """Bucketed observations (per bucket, not cumulative: the exposition sums them)."""

    bounds: tuple[float, ...] = TIME_BUCKETS
    buckets: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        if not self.buckets:
            self.buckets = [0] * (len(self.bounds) + 1)  # the last one is +Inf

    def observe(self, value: float) -> None:
        self.buckets[bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[int]:
        running, out = 0, []
        for n in self.buckets:
            running += n
            out.append(running)
        return out

    def quantile(self, q: float) -> float | None:
        """An estimate as Prometheus' `histogram_quantile` makes it (linear within the bucket);
        None when nothing was observed. The usage page's p50/p99."""
        if self.count == 0:
            return None
        rank, running, lower = q * self.count, 0, 0.0
        for i, n in enumerate(self.buckets):
            upper = self.bounds[i] if i < len(self.bounds) else self.bounds[-1]
            if n and running + n >= rank:
                return lower + (upper - lower) * ((rank - running) / n)
            running += n
            lower = upper
        return self.bounds[-1]


@dataclass
class Telemetry:
    """Per-isolate counts of finished requests (labels in the order their family names them)."""

    requests: dict[tuple[str, str, str, int], int] = field(default_factory=dict)  # (route, model, tenant, status // 100)
    prompt_tokens: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, tenant)
    generation_tokens: dict[tuple[str, str], int] = field(default_factory=dict)  # (model, tenant)
    ttft: dict[tuple[str, str], Histogram] = field(default_factory=dict)  # (model, served_by)
    latency: dict[tuple[str, str], Histogram] = field(default_factory=dict)  # (model, served_by)
    r2_errors: int = 0
    # guardrails verdicts: (stage, label, action); labels are the fixed taxonomy's codes, the DLP
    # detectors' names and `guard_error` only, so the series stay few whatever arrives
    guardrails: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # answers generated for this isolate's requests, by where they ran (`served_by`: a fallback ran
    # at both): counted where the answer ends, so a generation a Durable Object ran (a coalesced
    # miss, in an isolate of its own on Cloudflare) counts in the isolate that answered it
    routed: dict[str, int] = field(default_factory=lambda: {"edge": 0, "origin": 0})
    # when this isolate began counting (the first request made its state): a scrape that finds
    # another value reached another isolate, or a new one, whose counters start again from zero
    started_at: float = field(default_factory=time.time)
    # the isolate's name on every series (`isolate="..."`): drawn once, so two isolates' counters
    # are two series and a scrape that alternates between them never reads as a counter reset
    isolate: str = field(default_factory=lambda: secrets.token_hex(ISOLATE_BYTES))
    tenants: set[str] = field(default_factory=set)  # the tenants labels were made for (bounded by MAX_SERIES)
    # (model, served_by) -> its (latency, ttft) histograms, the pair `latency` and `ttft` hold: one
    # lookup per generation's observations, not one per family (a tuple key is hashed per lookup)
    _times: dict[tuple[str, str], tuple[Histogram, Histogram]] = field(default_factory=dict, repr=False, compare=False)

    def tenant_label(self, tenant: str | None) -> str:
        if not tenant:
            return ""
        if tenant in self.tenants:
            return tenant
        if len(self.tenants) >= MAX_SERIES:
            return OTHER
        self.tenants.add(tenant)
        return tenant

    def count_guardrail(self, stage: str, label: str, action: str) -> None:
        key = (stage, label, action)
        self.guardrails[key] = self.guardrails.get(key, 0) + 1

    def count_request(self, route: str, model: str, tenant: str, status: int) -> None:
        """One finished request. Its status is kept as its class's digit (2 for 2xx), spelled out
        when scraped (`status_label`): a HIT pays for one tuple and one dict update here."""
        key = (route, model, tenant, status // 100)
        requests = self.requests
        count = requests.get(key)  # a tuple key is hashed per lookup: one for a series seen before, and its store
        if count is not None:
            requests[key] = count + 1
        else:  # past MAX_SERIES: routes are templates and classes five, so only model and tenant fold
            key = key if len(requests) < MAX_SERIES else (route, OTHER, OTHER, key[3])
            requests[key] = requests.get(key, 0) + 1

    def count_tokens(self, model: str, tenant: str, prompt: int, generated: int) -> None:
        key = (model, tenant)
        if key not in self.prompt_tokens and len(self.prompt_tokens) >= MAX_SERIES:
            key = (OTHER, OTHER)
        self.prompt_tokens[key] = self.prompt_tokens.get(key, 0) + prompt
        self.generation_tokens[key] = self.generation_tokens.get(key, 0) + generated

    def count_routed(self, where: str) -> None:
        """One generated answer, by `served_by`: `fallback` began at the edge and ended on an origin."""
        routed = self.routed
        if where in ("edge", "fallback"):
            routed["edge"] += 1
        if where in ("origin", "fallback"):
            routed["origin"] += 1

    def observe_times(self, model: str, where: str, ttft: float | None, latency: float) -> None:
        pair = self._times.get((model, where))
        if pair is None:
            pair = self._series_times(model, where)
        # `Histogram.observe`, inline: a HIT makes these two observations, and a call each cost it more than they do
        histogram = pair[0]
        at = bisect_left(histogram.bounds, latency)
        histogram.buckets[at] += 1
        histogram.total += latency
        histogram.count += 1
        if ttft is not None:
            first = pair[1]
            # a replayed answer's first token came with it (its ttft is its latency): the same bucket
            first.buckets[at if ttft == latency and first.bounds is histogram.bounds else bisect_left(first.bounds, ttft)] += 1
            first.total += ttft
            first.count += 1

    def _series_times(self, model: str, where: str) -> tuple[Histogram, Histogram]:
        """The histograms `(model, where)`'s observations go to, made when new; past MAX_SERIES a
        new model's are `other`'s (remembered under `other` only, so the index stays as small as
        the families)."""
        key = (model, where)
        histogram = self.latency.get(key)
        if histogram is None:
            if len(self.latency) >= MAX_SERIES:
                key = (OTHER, where)
                histogram = self.latency.get(key)
            if histogram is None:
                histogram = self.latency[key] = Histogram()
                self.ttft[key] = Histogram()
        pair = self._times[key] = (histogram, self.ttft[key])
        return pair
