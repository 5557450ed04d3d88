"""`GET /admin/usage`: totals over a time range, grouped, with an estimated cost.

Cost is tokens times the configured per-model price (Workers AI's published USD per million
input and output tokens, `MODEL_PRICES`); "saved" is what the HITs would have cost as misses.
The admin token sees every tenant; a tenant's key sees its own rows only. `guardrails` counts
the requests per guardrails verdict (`prompt:S1:block`, `answer:email:mask`: stage, category or
detector, action; names from the fixed taxonomy only).
"""

from __future__ import annotations

import math
import re
from datetime import datetime, timezone
from typing import Any

from ..errors import ErrorKind, GatewayError, admin_routes_off, binding_error, invalid
from ..context import RequestContext
from ..http import Request, Response, json_response
from ..ports import BindingError, UsageNotQueryable
from ..deps import Deps
from .guard import unauthenticated

GROUPS = ("tenant", "model", "day", "hour", "route", "cache_status", "key_id")
SUMMED = ("requests", "prompt_tokens", "completion_tokens", "saved_prompt_tokens", "saved_completion_tokens",
          "hits", "misses", "errors", "latency_ms_total")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T[\d:.]+(Z|[+-]\d{2}:\d{2})?)?$")


def parse_time(value: str, name: str) -> float:
    """Epoch seconds or an ISO date/time (UTC unless it says otherwise). `float` also reads
    "nan", "inf" and "1e400" (infinite): refused here, as the 400 they are, since no store can
    search a range with no number at its end (the SQL API's query would fail as a 500)."""
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        if not math.isfinite(seconds):
            raise invalid(f"'{name}' must be a finite number of epoch seconds or an ISO date, not {value!r}.", name)
        return seconds
    if not _DATE.match(value):
        raise invalid(f"'{name}' must be epoch seconds or an ISO date such as 2026-12-01.", name)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise invalid(f"'{name}' is not a valid date: {value!r}.", name) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def cost(deps: Deps, model: str, prompt: int, completion: int) -> float:
    price_in, price_out = deps.config.model_prices.get(model, (0.0, 0.0))
    return (prompt * price_in + completion * price_out) / 1_000_000


def merge(rows: list[dict[str, Any]], group_by: tuple[str, ...], deps: Deps) -> list[dict[str, Any]]:
    """Add cost to rows grouped with `model`, then fold them into the asked grouping."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row.get(g) for g in group_by)
        out = merged.setdefault(key, {**{g: row.get(g) for g in group_by}, **{s: 0 for s in SUMMED}, "cost_usd": 0.0, "saved_usd": 0.0,
                                      "guardrails": {}})
        for name in SUMMED:
            out[name] += row.get(name, 0)
        for verdict, count in (row.get("guardrails") or {}).items():  # "stage:label:action": requests
            out["guardrails"][verdict] = out["guardrails"].get(verdict, 0) + count
        out["cost_usd"] += cost(deps, row.get("model") or "", row["prompt_tokens"], row["completion_tokens"])
        out["saved_usd"] += cost(deps, row.get("model") or "", row["saved_prompt_tokens"], row["saved_completion_tokens"])
    result = []
    for out in merged.values():
        out["cost_usd"], out["saved_usd"] = round(out["cost_usd"], 8), round(out["saved_usd"], 8)
        out["hit_rate"] = round(out["hits"] / (out["hits"] + out["misses"]), 4) if out["hits"] + out["misses"] else 0.0
        result.append(out)
    return result


async def get_usage(request: Request, deps: Deps, ctx: RequestContext) -> Response:
    principal = ctx.principal
    if principal is None:
        if not deps.config.admin_token:
            raise admin_routes_off(request.method, request.path)
        raise unauthenticated("The admin token or an API key is required.")
    tenant = None if principal.admin else principal.tenant
    query = request.query
    now = deps.clock.now()
    end = parse_time(query["to"], "to") if query.get("to") else now + 1
    start = parse_time(query["from"], "from") if query.get("from") else end - 30 * 86400
    if end <= start:
        raise invalid("'to' must be after 'from'.", "to")
    group_by = tuple(g.strip() for g in (query.get("group_by") or "").split(",") if g.strip())
    unknown = [g for g in group_by if g not in GROUPS]
    if unknown or len(set(group_by)) != len(group_by):
        raise invalid(f"'group_by' takes distinct names from {', '.join(GROUPS)}; got {query.get('group_by')!r}.", "group_by")
    if deps.usage is None:
        raise GatewayError(ErrorKind.NOT_FOUND, "No usage store is bound on this edge.", code="usage_not_queryable")
    try:
        rows = await deps.usage.query(start, end, tuple(dict.fromkeys((*group_by, "model"))), tenant)
    except UsageNotQueryable:
        raise GatewayError(ErrorKind.NOT_FOUND, "This edge's usage store cannot be queried from the Worker: set ANALYTICS_ACCOUNT_ID and "
                           "the ANALYTICS_API_TOKEN secret, or use the Analytics Engine SQL API.", code="usage_not_queryable") from None
    except BindingError as exc:  # the SQL API refused or failed: a failing dependency
        raise binding_error(exc, "The usage store", "usage") from exc
    groups = merge(rows, group_by, deps)
    totals = merge(rows, (), deps)
    empty = {**{name: 0 for name in SUMMED}, "cost_usd": 0.0, "saved_usd": 0.0, "hit_rate": 0.0, "guardrails": {}}
    return json_response({"object": "usage", "from": start, "to": end, "group_by": list(group_by), "tenant": tenant,
                          "totals": totals[0] if totals else empty, "data": groups})
