"""The dashboard's panels as Workers Analytics Engine SQL: the fleet's totals on Cloudflare.

A Prometheus scrape of the Worker reaches one isolate, so `/metrics` is a sample of the fleet,
never its sum (docs/observability.md). Every request with a caller writes one data point to the
usage dataset (`runtime.pyodide_usage.AnalyticsEngineUsage`), whatever isolate answered it; these
queries read the fleet's traffic back from it through the SQL API, one per panel of
grafana/edgellm-dashboard.json that the dataset can answer.

The columns are the ones `AnalyticsEngineUsage` writes (`COLUMNS`; the `GROUP_COLUMNS` of
`access.analytics_sql` name the same blobs). Analytics Engine samples busy datasets, each row
standing for `_sample_interval` data points, so every count, sum and quantile is weighted by it.
Only functions Cloudflare's SQL reference lists are used (`sumIf`, `quantileWeighted`,
`toStartOfMinute`, `toDateTime`).

What the dataset does not hold has no query here: time to first token, where a generation ran
(edge or origin), the semantic share of the hits, the engine's slots, origin, KV and R2 failures
and the breaker. Those are per-isolate figures of `/metrics` (and of the log lines, which carry
`ttft_ms`), each a sample of the fleet.
"""

from __future__ import annotations

COLUMNS = {
    "tenant": "blob1", "key_id": "blob2", "model": "blob3", "route": "blob4", "cache_status": "blob5",
    "prompt_tokens": "double1", "completion_tokens": "double2", "latency_ms": "double3", "status": "double4",
}
_W = "_sample_interval"
_C = COLUMNS


def _status(low: int, high: int) -> str:
    return f"sumIf({_W}, {_C['status']} >= {low} AND {_C['status']} < {high})"


# panel title (as the Grafana dashboard names it) -> (SELECT list after the minute, GROUP BY extra, WHERE extra)
PANELS: dict[str, tuple[str, str, str]] = {
    "Requests per minute by status": (
        f"{_status(200, 300)} AS status_2xx, {_status(300, 400)} AS status_3xx, "
        f"{_status(400, 500)} AS status_4xx, {_status(500, 600)} AS status_5xx", "", ""),
    "Errors per minute (4xx, 5xx)": (f"{_status(400, 500)} AS status_4xx, {_status(500, 600)} AS status_5xx", "", ""),
    "Cache hit ratio": (  # the ratio is hits / (hits + misses), for a minute with either
        f"sumIf({_W}, {_C['cache_status']} = 'HIT') AS hits, sumIf({_W}, {_C['cache_status']} = 'MISS') AS misses", "", ""),
    "Tokens per minute by tenant": (
        f"{_C['tenant']} AS tenant, sumIf({_W} * {_C['prompt_tokens']}, {_C['cache_status']} != 'HIT') AS prompt_tokens, "
        f"sumIf({_W} * {_C['completion_tokens']}, {_C['cache_status']} != 'HIT') AS generated_tokens", "tenant", ""),
    "Request latency p50 / p99": (  # generation requests (a model served), HITs apart from the rest
        f"{_C['cache_status']} AS cache_status, quantileWeighted(0.5, {_C['latency_ms']}, {_W}) AS p50_ms, "
        f"quantileWeighted(0.99, {_C['latency_ms']}, {_W}) AS p99_ms", "cache_status", f"{_C['model']} != ''"),
    "Refusals and failures per minute": (  # 503: refused (overloaded, a dependency down); 502: an upstream failed
        f"sumIf({_W}, {_C['status']} = 503) AS status_503, sumIf({_W}, {_C['status']} = 502) AS status_502", "", ""),
}


def panel_sql(title: str, dataset: str = "edgellm_usage", start: str = "NOW() - INTERVAL '1' HOUR", end: str = "NOW()") -> str:
    """One panel's query over [start, end), by minute. `start` and `end` are SQL expressions: the
    defaults read the last hour; `toDateTime(<unix seconds>)` reads a given window."""
    select, group, where = PANELS[title]
    conditions = [f"timestamp >= {start}", f"timestamp < {end}"] + ([where] if where else [])
    groups = ", ".join(["minute"] + ([group] if group else []))
    return (f"SELECT toStartOfMinute(timestamp) AS minute, {select} FROM {dataset} WHERE {' AND '.join(conditions)} "
            f"GROUP BY {groups} ORDER BY {groups} FORMAT JSON")
