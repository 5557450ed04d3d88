"""`GET /admin/usage` on Cloudflare: the usage rows read back through Analytics Engine's SQL API
(core code over the Worker's `fetch`), with a fetch double that answers as the API does."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Mapping

import pytest

from edgellm.access.analytics_sql import AnalyticsEngineSQL, UsageQueryError, usage_rows, usage_sql
from edgellm.app import handle
from edgellm.config import Config
from edgellm.http import Request
from edgellm.ports import FetchResponse, UsageNotQueryable
from edgellm.deps import Deps
from edgellm_local.doubles.scripted import ScriptedAI

ADMIN = "admin-secret"


async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


@dataclass
class SqlApiDouble:
    """Answers `POST .../analytics_engine/sql` with `rows` (numbers as strings, as the API sends
    64-bit ones), or with `status`; remembers what it was sent."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    status: int = 200
    sent: list[tuple[str, str, Mapping[str, str]]] = field(default_factory=list)

    async def post(self, url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> FetchResponse:
        self.sent.append((url, body.decode(), headers))
        payload = {"meta": [], "data": self.rows, "rows": len(self.rows)} if self.status == 200 else {"errors": ["nope"]}
        return FetchResponse(self.status, {"content-type": "application/json"}, chunks(json.dumps(payload).encode()))


def test_the_query_weights_by_the_sample_interval_and_quotes_the_tenant() -> None:
    sql = usage_sql("edgellm_usage", 1000.9, 2000, ("tenant", "day"), "o'brien")
    assert sql.startswith("SELECT blob1 AS tenant, formatDateTime(timestamp, '%Y-%m-%d') AS day, blob6 AS guardrails, "
                          "SUM(_sample_interval) AS requests")
    assert "sumIf(_sample_interval * double1, blob5 != 'HIT') AS prompt_tokens" in sql
    assert "FROM edgellm_usage WHERE timestamp >= toDateTime(1000) AND timestamp < toDateTime(2000) AND blob1 = 'o\\'brien'" in sql
    assert sql.endswith("GROUP BY tenant, day, guardrails ORDER BY tenant, day FORMAT JSON")
    assert usage_sql("d", 0, 1, ()).endswith("GROUP BY guardrails FORMAT JSON")


def test_rows_come_back_in_the_local_sinks_shape() -> None:
    rows = usage_rows({"data": [{"model": "@cf/m", "requests": "3", "prompt_tokens": "30", "completion_tokens": "12.0", "hits": "1"},
                                {"model": "@cf/x", "requests": "0"}]}, ("model",))
    assert rows == [{"model": "@cf/m", "requests": 3, "prompt_tokens": 30, "completion_tokens": 12, "saved_prompt_tokens": 0,
                     "saved_completion_tokens": 0, "hits": 1, "misses": 0, "errors": 0, "latency_ms_total": 0, "guardrails": {}}]
    with pytest.raises(UsageQueryError):
        usage_rows({"errors": []}, ())


class ReadOnlySink:
    """The Worker's usage sink as `build_deps` makes it: records go to the dataset (unused here),
    queries to the SQL API."""

    def __init__(self, reader: AnalyticsEngineSQL) -> None:
        self.reader = reader

    async def record(self, event: Any) -> None:
        pass

    def record_now(self, event: Any) -> None:
        pass

    async def query(self, *args: Any) -> list[dict[str, Any]]:
        return await self.reader.query(*args)

    async def tokens_spent(self, key_id: str) -> int:
        return 0


def usage_request(query: str) -> Request:
    return Request("GET", f"http://edge.test/admin/usage?{query}", {"authorization": f"Bearer {ADMIN}"}, b"")


async def test_admin_usage_is_answered_from_the_sql_api() -> None:
    api = SqlApiDouble([{"tenant": "acme", "model": "@cf/meta/llama-2-7b-chat-int8", "requests": "4", "prompt_tokens": "1000000",
                         "completion_tokens": "0", "saved_prompt_tokens": "1000000", "hits": "2", "misses": "2"}])
    reader = AnalyticsEngineSQL(api, "acc123", "tok", "edgellm_usage")
    deps = Deps(config=Config(admin_token=ADMIN), ai=ScriptedAI(), log=logging.getLogger("edgellm.test"), usage=ReadOnlySink(reader))
    response = await handle(usage_request("from=2026-12-01&to=2026-12-02&group_by=tenant"), deps)
    assert response.status == 200, response.body
    report = json.loads(response.body)
    assert report["totals"]["requests"] == 4 and report["totals"]["hit_rate"] == 0.5
    assert report["totals"]["cost_usd"] > 0 and report["totals"]["cost_usd"] == report["totals"]["saved_usd"]
    assert report["data"][0]["tenant"] == "acme"
    url, sql, headers = api.sent[0]
    assert url == "https://api.cloudflare.com/client/v4/accounts/acc123/analytics_engine/sql"
    assert headers["authorization"] == "Bearer tok" and "GROUP BY tenant, model" in sql


async def test_a_failing_sql_api_is_a_503_with_retry_after_not_a_500() -> None:
    reader = AnalyticsEngineSQL(SqlApiDouble(status=500), "acc", "tok")
    deps = Deps(config=Config(admin_token=ADMIN), ai=ScriptedAI(), log=logging.getLogger("edgellm.test"), usage=ReadOnlySink(reader))
    response = await handle(usage_request(""), deps)
    assert response.status in (502, 503) and "retry-after" in response.headers, (response.status, response.body)
    assert json.loads(response.body)["error"]["code"].startswith("usage")


async def test_a_sink_that_cannot_be_read_back_is_a_clear_404_saying_what_to_set() -> None:
    class WriteOnlySink(ReadOnlySink):
        async def query(self, *args: Any) -> list[dict[str, Any]]:
            raise UsageNotQueryable("no account or token")

    deps = Deps(config=Config(admin_token=ADMIN), ai=ScriptedAI(), log=logging.getLogger("edgellm.test"),
                usage=WriteOnlySink(AnalyticsEngineSQL(SqlApiDouble(), "acc", "tok")))
    response = await handle(usage_request(""), deps)
    error = json.loads(response.body)["error"]
    assert response.status == 404 and error["code"] == "usage_not_queryable", (response.status, response.body)
    assert "ANALYTICS_API_TOKEN" in error["message"]


@pytest.mark.parametrize("field", ["from", "to"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400"])
async def test_a_non_finite_time_is_a_400_naming_its_field_never_a_500(field: str, value: str) -> None:
    """`float` reads these; the SQL API's query needs whole seconds (`int(nan)` raised: a 500)."""
    api = SqlApiDouble()
    deps = Deps(config=Config(admin_token=ADMIN), ai=ScriptedAI(), log=logging.getLogger("edgellm.test"),
                usage=ReadOnlySink(AnalyticsEngineSQL(api, "acc", "tok")))
    response = await handle(usage_request(f"{field}={value}"), deps)
    assert response.status == 400, (response.status, response.body)
    error = json.loads(response.body)["error"]
    assert set(error) == {"message", "type", "param", "code", "request_id"}
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", field, "invalid_value")
    assert api.sent == []  # refused before any query


# --- the dashboard's panels over the usage dataset -------------------------------------------------

class QuantileWeighted:
    """ClickHouse's `quantileExactWeighted` (Cloudflare's `quantileWeighted(level, x, weight)`):
    the smallest value whose weights, summed in order, reach `level` of the total."""

    def __init__(self) -> None:
        self.points: list[tuple[float, float]] = []
        self.level = 0.5

    def step(self, level: float, value: float, weight: float) -> None:
        self.level = level
        self.points.append((value, weight))

    def finalize(self) -> float | None:
        total, running = sum(w for _, w in self.points), 0.0
        for value, weight in sorted(self.points):
            running += weight
            if running >= self.level * total:
                return value
        return None


class SumIf:
    def __init__(self) -> None:
        self.total = 0.0

    def step(self, value: float, condition: int) -> None:
        if condition:
            self.total += value

    def finalize(self) -> float:
        return self.total


def analytics_engine(rows: list[dict[str, Any]]) -> Any:
    """The dataset as Analytics Engine's SQL API reads it (blob1.., double1.., timestamp,
    `_sample_interval`; developers.cloudflare.com/analytics/analytics-engine/sql-api), in SQLite
    with the few functions the panels use."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE edgellm_usage (timestamp INTEGER, _sample_interval INTEGER, blob1, blob2, blob3, blob4, blob5, "
               "blob6, double1 REAL, double2 REAL, double3 REAL, double4 REAL)")
    db.executemany("INSERT INTO edgellm_usage VALUES (:timestamp, :_sample_interval, :blob1, :blob2, :blob3, :blob4, :blob5, "
                   ":blob6, :double1, :double2, :double3, :double4)", rows)
    db.create_function("toStartOfMinute", 1, lambda t: t - t % 60)
    db.create_function("toDateTime", 1, lambda t: t)
    db.create_aggregate("sumIf", 2, SumIf)
    db.create_aggregate("quantileWeighted", 3, QuantileWeighted)
    db.row_factory = sqlite3.Row
    return db


def written_rows(events: list[tuple[Any, int]]) -> list[dict[str, Any]]:
    """The rows the Worker's own writer makes of `events` (each with its sample interval)."""
    from tests.support import fake_pyodide as fp

    class Dataset:
        def __init__(self) -> None:
            self.points: list[dict[str, Any]] = []

        def writeDataPoint(self, point: Any) -> None:  # noqa: N802 - the binding's own name
            self.points.append(fp.require_js_object(point))

    rows = []
    with fp.installed():
        from edgellm.runtime.pyodide_usage import AnalyticsEngineUsage

        for event, interval in events:
            dataset = Dataset()
            AnalyticsEngineUsage(dataset).record_now(event)
            (point,) = dataset.points
            row = {"timestamp": int(event.time), "_sample_interval": interval}
            row.update({f"blob{i}": v for i, v in enumerate(point["blobs"], 1)})
            row.update({f"double{i}": v for i, v in enumerate(point["doubles"], 1)})
            rows.append(row)
    return rows


def test_every_panel_query_reads_the_columns_the_worker_writes() -> None:
    """Each panel's SQL run over rows written by the Worker's own `AnalyticsEngineUsage`, against
    the same figures counted from the events by name: a query naming the wrong blob or double,
    or a writer that moved one, gives other numbers."""
    from edgellm.access.analytics_sql import GROUP_COLUMNS
    from edgellm.ports import UsageEvent
    from edgellm.telemetry.analytics_panels import COLUMNS, PANELS, panel_sql

    assert {k: v for k, v in COLUMNS.items() if k in GROUP_COLUMNS} == {k: v for k, v in GROUP_COLUMNS.items() if k in COLUMNS}
    minute = 1_800_000_000 - 1_800_000_000 % 60
    m = "@cf/meta/llama-2-7b-chat-int8"
    events = [  # (event, sample interval): a row standing for 10 points weighs 10
        (UsageEvent(minute + 1, "acme", "k1", m, "/v1/chat/completions", "MISS", 11, 7, 400.0, 200), 1),
        (UsageEvent(minute + 2, "acme", "k1", m, "/v1/chat/completions", "HIT", 11, 7, 2.0, 200), 10),
        (UsageEvent(minute + 3, "zeta", "k2", m, "/v1/completions", "BYPASS", 5, 3, 900.0, 200), 1),
        (UsageEvent(minute + 4, "zeta", "k2", "", "/v1/chat/completions", "", 0, 0, 1.0, 400), 2),
        (UsageEvent(minute + 5, "acme", "k1", m, "/v1/chat/completions", "MISS", 9, 0, 30000.0, 503), 1),
        (UsageEvent(minute + 61, "acme", "k1", m, "/v1/chat/completions", "MISS", 4, 4, 100.0, 502), 3),
    ]
    db = analytics_engine(written_rows(events))

    def run(title: str) -> list[dict[str, Any]]:
        sql = panel_sql(title, start=f"toDateTime({minute})", end=f"toDateTime({minute + 120})")
        assert sql.endswith(" FORMAT JSON")
        return [dict(r) for r in db.execute(sql.removesuffix(" FORMAT JSON"))]

    by_status = run("Requests per minute by status")
    assert [(r["minute"], r["status_2xx"], r["status_3xx"], r["status_4xx"], r["status_5xx"]) for r in by_status] == [
        (minute, 12, 0, 2, 1), (minute + 60, 0, 0, 0, 3)]
    assert [(r["status_4xx"], r["status_5xx"]) for r in run("Errors per minute (4xx, 5xx)")] == [(2, 1), (0, 3)]
    assert [(r["hits"], r["misses"]) for r in run("Cache hit ratio")] == [(10, 2), (0, 3)]
    tokens = {(r["minute"], r["tenant"]): (r["prompt_tokens"], r["generated_tokens"]) for r in run("Tokens per minute by tenant")}
    assert tokens == {(minute, "acme"): (20, 7), (minute, "zeta"): (5, 3), (minute + 60, "acme"): (12, 12)}  # HITs count none
    latency = {(r["minute"], r["cache_status"]): (r["p50_ms"], r["p99_ms"]) for r in run("Request latency p50 / p99")}
    assert latency == {(minute, "HIT"): (2.0, 2.0), (minute, "MISS"): (400.0, 30000.0), (minute, "BYPASS"): (900.0, 900.0),
                       (minute + 60, "MISS"): (100.0, 100.0)}  # the 400 (no model served) is no generation
    assert [(r["status_503"], r["status_502"]) for r in run("Refusals and failures per minute")] == [(1, 0), (0, 3)]
    dashboard = json.loads((Path(__file__).resolve().parents[2] / "grafana" / "edgellm-dashboard.json").read_text())
    assert set(PANELS) <= {panel["title"] for panel in dashboard["panels"]}  # each names a panel it stands for


def test_the_docs_give_each_panels_query_as_the_code_makes_it() -> None:
    from edgellm.telemetry.analytics_panels import PANELS, panel_sql

    docs = " ".join((Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text().split())
    for title in PANELS:
        assert " ".join(panel_sql(title).split()) in docs, title


def test_the_usage_query_counts_the_guardrails_verdicts_the_worker_writes_per_group() -> None:
    """`usage_sql` run over rows the Worker's own writer made: each group's requests per verdict,
    weighted by the sample interval, with the rows split by blob6 folded back into one group."""
    from edgellm.ports import UsageEvent

    m = "@cf/meta/llama-2-7b-chat-int8"
    events = [
        (UsageEvent(1001, "acme", "k1", m, "/v1/chat/completions", "", 9, 0, 3.0, 400, "prompt:S1:block"), 2),
        (UsageEvent(1002, "acme", "k1", m, "/v1/chat/completions", "MISS", 9, 4, 3.0, 200, "answer:email:mask,prompt:email:mask"), 1),
        (UsageEvent(1003, "acme", "k1", m, "/v1/chat/completions", "MISS", 9, 4, 3.0, 200), 1),
        (UsageEvent(1004, "zeta", "k2", m, "/v1/chat/completions", "MISS", 9, 4, 3.0, 200, "prompt:email:mask"), 1),
    ]
    db = analytics_engine(written_rows(events))
    sql = usage_sql("edgellm_usage", 1000, 2000, ("tenant",)).removesuffix(" FORMAT JSON")
    rows = {row["tenant"]: row for row in usage_rows({"data": [dict(r) for r in db.execute(sql)]}, ("tenant",))}
    assert rows["acme"]["requests"] == 4 and rows["acme"]["errors"] == 2
    assert rows["acme"]["guardrails"] == {"prompt:S1:block": 2, "answer:email:mask": 1, "prompt:email:mask": 1}
    assert rows["zeta"]["guardrails"] == {"prompt:email:mask": 1}
