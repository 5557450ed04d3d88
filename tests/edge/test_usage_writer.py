"""Usage recording off the request's path: rows are committed in batches by a writer
thread, a HIT never waits for the database, a clean stop writes every row, a read sees them all."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import httpx

from edgellm.ports import UsageEvent
from edgellm_local.emulator.usage_sqlite import SqliteUsage

Q = {"messages": [{"role": "user", "content": "Name a colour."}], "temperature": 0, "max_tokens": 4}


class GatedUsage(SqliteUsage):
    """A usage database that blocks: every batch waits for `gate` (set by the test) before it is
    written, and `entered` tells the test the writer is inside."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate, self.entered = threading.Event(), threading.Event()

    def write_batch(self, rows: list[tuple[Any, ...]]) -> None:
        self.entered.set()
        self.gate.wait(60)  # the test opens it; the bound only keeps a broken run from hanging
        super().write_batch(rows)


def rows_on_disk(path: Path) -> list[tuple[Any, ...]]:
    """The table as another process would read it (not through the sink, which flushes first)."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT route, cache_status, status FROM usage ORDER BY time").fetchall()


def test_a_hit_never_waits_for_a_usage_write(start_edge, make_deps, tmp_path: Path) -> None:
    usage = GatedUsage(tmp_path / "usage.sqlite3", flush_interval=0.001)
    server = start_edge(make_deps(usage=usage))
    try:
        first = httpx.post(server.url + "/v1/chat/completions", json=Q, timeout=60)
        assert first.status_code == 200
        assert usage.entered.wait(30), "the first answer's usage was never written"
        server.drain()  # the cache entry is written; the usage writer is still held at the gate
        hits = [httpx.post(server.url + "/v1/chat/completions", json=Q, timeout=10) for _ in range(5)]
        assert [(h.status_code, h.headers["cf-aig-cache-status"]) for h in hits] == [(200, "HIT")] * 5
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        assert not usage.gate.is_set()  # every answer above went out while the database was blocked
    finally:
        usage.gate.set()
    server.stop()
    assert rows_on_disk(tmp_path / "usage.sqlite3") == [("/v1/chat/completions", "MISS", 200)] + [("/v1/chat/completions", "HIT", 200)] * 5


def test_usage_is_complete_after_a_clean_stop(start_edge, make_deps, tmp_path: Path) -> None:
    """The writer would wait an hour for its next batch: only the stop's flush can write them."""
    usage = SqliteUsage(tmp_path / "usage.sqlite3", flush_interval=3600, batch_size=10_000)
    server = start_edge(make_deps(usage=usage))
    answered = []
    for i in range(12):
        path, body = (("/v1/chat/completions", Q) if i % 3 else ("/v1/completions", {"prompt": f"Count to {i}.", "max_tokens": 3}))
        response = httpx.post(server.url + path, json=body, timeout=60)
        assert response.status_code == 200
        answered.append((path, response.headers["cf-aig-cache-status"], 200))
    server.drain()
    server.stop()
    assert sorted(rows_on_disk(tmp_path / "usage.sqlite3")) == sorted(answered)  # every answered request, once


async def test_a_read_sees_every_row_recorded_before_it(tmp_path: Path) -> None:
    usage = SqliteUsage(tmp_path / "usage.sqlite3", flush_interval=3600, batch_size=100_000)
    for i in range(2_000):
        await usage.record(UsageEvent(1_000.0 + i, "acme", "k1", "m", "/v1/chat/completions", "HIT" if i % 2 else "MISS", 3, 5, 1.0, 200))
    assert await usage.tokens_spent("k1") == 1_000 * 8  # HITs are not charged
    rows = await usage.query(0, 10_000, ("cache_status",))
    assert [(r["cache_status"], r["requests"]) for r in rows] == [("HIT", 1_000), ("MISS", 1_000)]
    # the key's total is kept as rows arrive, without reading the table again
    await asyncio.gather(*(usage.record(UsageEvent(5_000.0, "acme", "k1", "m", "/v1/completions", "MISS", 1, 1, 1.0, 200)) for _ in range(10)))
    assert await usage.tokens_spent("k1") == 1_000 * 8 + 20
    usage.close()
    assert len(rows_on_disk(tmp_path / "usage.sqlite3")) == 2_010


async def test_a_usage_file_made_before_the_guardrails_column_gains_it_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "usage.sqlite3"
    old = [c for c in UsageEvent._fields if c != "guardrails"]
    with sqlite3.connect(path) as db:  # the table as an older edge made it, with one row
        db.execute(f"CREATE TABLE usage ({', '.join(old)})")
        db.execute(f"INSERT INTO usage VALUES ({', '.join('?' * len(old))})",
                   (1000.0, "acme", "k1", "m", "chat", "MISS", 3, 4, 12.0, 200))
    usage = SqliteUsage(path)
    usage.record_now(UsageEvent(1001.0, "acme", "k1", "m", "chat", "MISS", 1, 1, 5.0, 400, guardrails="prompt:S1:block"))
    rows = await usage.query(0, 2000, ("tenant",))
    usage.close()
    assert rows[0]["requests"] == 2 and rows[0]["prompt_tokens"] == 4
    assert rows[0]["guardrails"] == {"prompt:S1:block": 1}
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT guardrails FROM usage ORDER BY time").fetchall() == [("",), ("prompt:S1:block",)]
