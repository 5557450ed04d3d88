"""Workers Analytics Engine (`env.USAGE`) as the core's `UsageSink`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..ports import UsageEvent, UsageNotQueryable
from .pyodide_toolbox import js_options


@dataclass
class AnalyticsEngineUsage:
    """Usage as Workers Analytics Engine data points (`[[analytics_engine_datasets]]`): blobs
    tenant, key id, model, route, cache status, then the guardrails' verdicts (`UsageEvent.guardrails`,
    names only; last, so the columns before it keep their places); doubles prompt and completion tokens, latency
    ms, status; indexed by tenant. The binding cannot read them back: `query` asks the SQL API
    (`reader`, core code over the Worker's `fetch`) when the account and a token are configured,
    and is not supported otherwise."""

    binding: Any
    reader: Any = None  # access.analytics_sql.AnalyticsEngineSQL

    async def record(self, event: UsageEvent) -> None:
        self.record_now(event)

    def record_now(self, event: UsageEvent) -> None:
        """`writeDataPoint` returns nothing to await: the runtime sends the point itself."""
        self.binding.writeDataPoint(js_options({
            "blobs": [event.tenant, event.key_id, event.model, event.route, event.cache_status, event.guardrails],
            "doubles": [event.prompt_tokens, event.completion_tokens, event.latency_ms, event.status],
            "indexes": [event.tenant],
        }))

    async def query(self, start: float, end: float, group_by: tuple[str, ...], tenant: str | None = None) -> list[dict[str, Any]]:
        if self.reader is None:
            raise UsageNotQueryable("set ANALYTICS_ACCOUNT_ID and the ANALYTICS_API_TOKEN secret, or query the Analytics Engine SQL API")
        return await self.reader.query(start, end, group_by, tenant)

    async def tokens_spent(self, key_id: str) -> int:
        return 0  # budgets on Cloudflare count this isolate's charges (IsolateState.access.spent)
