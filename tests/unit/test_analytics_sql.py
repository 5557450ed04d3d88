"""`GET /admin/usage` on Cloudflare: the usage rows read back through Analytics Engine's SQL API
(core code over the Worker's `fetch`), with a fetch double that answers as the API does."""

from __future__ import annotations

import json
import logging
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
    assert sql.startswith("SELECT blob1 AS tenant, formatDateTime(timestamp, '%Y-%m-%d') AS day, SUM(_sample_interval) AS requests")
    assert "sumIf(_sample_interval * double1, blob5 != 'HIT') AS prompt_tokens" in sql
    assert "FROM edgellm_usage WHERE timestamp >= toDateTime(1000) AND timestamp < toDateTime(2000) AND blob1 = 'o\\'brien'" in sql
    assert sql.endswith("GROUP BY tenant, day ORDER BY tenant, day FORMAT JSON")
    assert "GROUP BY" not in usage_sql("d", 0, 1, ())


def test_rows_come_back_in_the_local_sinks_shape() -> None:
    rows = usage_rows({"data": [{"model": "@cf/m", "requests": "3", "prompt_tokens": "30", "completion_tokens": "12.0", "hits": "1"},
                                {"model": "@cf/x", "requests": "0"}]}, ("model",))
    assert rows == [{"model": "@cf/m", "requests": 3, "prompt_tokens": 30, "completion_tokens": 12, "saved_prompt_tokens": 0,
                     "saved_completion_tokens": 0, "hits": 1, "misses": 0, "errors": 0, "latency_ms_total": 0}]
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
