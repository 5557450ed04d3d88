"""Reading usage back from Workers Analytics Engine, through its SQL API.

A Worker can write data points to its dataset binding but not read them: reading is the SQL
API's (`POST /accounts/{id}/analytics_engine/sql` with an API token that may read Account
Analytics). With `ANALYTICS_ACCOUNT_ID` and the `ANALYTICS_API_TOKEN` secret set, `GET
/admin/usage` on Cloudflare asks it over the Worker's `fetch`; without them that route says it
cannot be queried here (and the dashboard or the SQL API itself answer).

The columns are those `AnalyticsEngineUsage` writes: blob1 tenant, blob2 key id, blob3 model,
blob4 route, blob5 cache status, blob6 the guardrails' verdicts (`prompt:S1:block,...`, names
only); double1 prompt tokens, double2 completion tokens, double3
latency ms, double4 status. Analytics Engine samples busy datasets, each stored row standing
for `_sample_interval` data points, so every count and sum is weighted by it. The rows come
back in the shape the local SQLite sink gives, so `report.merge` prices both the same way: the
query also groups by blob6, and its rows are folded back into the asked groups here, each
group's `guardrails` counting its requests per verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..ports import FetchError, HTTPFetch
from ..stream import close_source

SQL_API = "https://api.cloudflare.com/client/v4/accounts/{account_id}/analytics_engine/sql"
GROUP_COLUMNS = {
    "tenant": "blob1", "key_id": "blob2", "model": "blob3", "route": "blob4", "cache_status": "blob5",
    "day": "formatDateTime(timestamp, '%Y-%m-%d')", "hour": "formatDateTime(timestamp, '%Y-%m-%dT%H')",
}
GUARDRAILS_COLUMN = "blob6"  # the guardrails' verdicts, last of the blobs
_WEIGHT = "_sample_interval"
_SUMS = {
    "requests": f"SUM({_WEIGHT})",
    "prompt_tokens": f"sumIf({_WEIGHT} * double1, blob5 != 'HIT')",
    "completion_tokens": f"sumIf({_WEIGHT} * double2, blob5 != 'HIT')",
    "saved_prompt_tokens": f"sumIf({_WEIGHT} * double1, blob5 = 'HIT')",
    "saved_completion_tokens": f"sumIf({_WEIGHT} * double2, blob5 = 'HIT')",
    "hits": f"sumIf({_WEIGHT}, blob5 = 'HIT')",
    "misses": f"sumIf({_WEIGHT}, blob5 = 'MISS')",
    "errors": f"sumIf({_WEIGHT}, double4 >= 400)",
    "latency_ms_total": f"SUM({_WEIGHT} * double3)",
}
TIMEOUT_SECONDS = 15.0
MAX_RESPONSE_BYTES = 8 * 1024 * 1024


class UsageQueryError(FetchError):
    """The SQL API refused or failed the query (a failing dependency: the route answers 502/503)."""


def _literal(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def usage_sql(dataset: str, start: float, end: float, group_by: tuple[str, ...], tenant: str | None = None) -> str:
    """The query for `UsageSink.query`'s rows. Group names come from a fixed table and the tenant
    is quoted, so nothing a caller sends reaches the SQL unescaped."""
    select = ([f"{GROUP_COLUMNS[g]} AS {g}" for g in group_by] + [f"{GUARDRAILS_COLUMN} AS guardrails"]
              + [f"{expr} AS {name}" for name, expr in _SUMS.items()])
    where = [f"timestamp >= toDateTime({int(start)})", f"timestamp < toDateTime({int(end)})"]
    if tenant:
        where.append(f"blob1 = {_literal(tenant)}")
    sql = f"SELECT {', '.join(select)} FROM {dataset} WHERE {' AND '.join(where)}"
    sql += f" GROUP BY {', '.join([*group_by, 'guardrails'])}"
    if group_by:
        sql += f" ORDER BY {', '.join(group_by)}"
    return sql + " FORMAT JSON"


def usage_rows(payload: Any, group_by: tuple[str, ...]) -> list[dict[str, Any]]:
    """The SQL API's JSON (`{"data": [...]}`, 64-bit numbers as strings) as the sink's rows."""
    rows = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(rows, list):
        raise UsageQueryError("the Analytics Engine SQL API answered without a 'data' list")
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        counts = {name: int(float(row.get(name) or 0)) for name in _SUMS}
        if not counts["requests"]:
            continue
        key = tuple(row.get(g) for g in group_by)
        group = out.get(key)
        if group is None:
            group = out[key] = {**{g: row.get(g) for g in group_by}, **{name: 0 for name in _SUMS}, "guardrails": {}}
        for name, value in counts.items():
            group[name] += value
        verdicts = row.get("guardrails") or ""
        for verdict in verdicts.split(",") if verdicts else ():
            group["guardrails"][verdict] = group["guardrails"].get(verdict, 0) + counts["requests"]
    return list(out.values())


@dataclass(frozen=True)
class AnalyticsEngineSQL:
    """`UsageSink.query` over the SQL API, through the Worker's outbound `fetch`."""

    fetch: HTTPFetch
    account_id: str
    api_token: str
    dataset: str = "edgellm_usage"

    async def query(self, start: float, end: float, group_by: tuple[str, ...], tenant: str | None = None) -> list[dict[str, Any]]:
        sql = usage_sql(self.dataset, start, end, group_by, tenant)
        response = await self.fetch.post(SQL_API.format(account_id=self.account_id), sql.encode(),
                                         {"authorization": f"Bearer {self.api_token}", "content-type": "text/plain"}, TIMEOUT_SECONDS)
        body = bytearray()
        try:
            async for chunk in response.body:
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise UsageQueryError(f"the Analytics Engine SQL API answered more than {MAX_RESPONSE_BYTES} bytes")
        finally:
            await close_source(response.body)
        if response.status != 200:
            raise UsageQueryError(f"the Analytics Engine SQL API answered {response.status}: {bytes(body[:200]).decode(errors='replace')}")
        try:
            payload = json.loads(bytes(body))
        except ValueError as exc:
            raise UsageQueryError(f"the Analytics Engine SQL API answered no JSON: {exc}") from exc
        return usage_rows(payload, group_by)
