"""The usage port on SQLite: one row per answered request (no prompt or answer text).

The Worker writes the same fields to a Workers Analytics Engine dataset; locally the rows are
here so `GET /admin/usage` can group them without a network."""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import astuple, dataclass, field, fields
from pathlib import Path
from typing import Any

from edgellm.ports import UsageEvent

GROUPS = {"tenant": "tenant", "model": "model", "route": "route", "cache_status": "cache_status", "key_id": "key_id",
          "day": "strftime('%Y-%m-%d', time, 'unixepoch')", "hour": "strftime('%Y-%m-%dT%H', time, 'unixepoch')"}
_COLUMNS = [f.name for f in fields(UsageEvent)]


@dataclass
class SqliteUsage:
    path: str | Path = ":memory:"
    _db: sqlite3.Connection = field(init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"CREATE TABLE IF NOT EXISTS usage ({', '.join(_COLUMNS)})")
        self._db.execute("CREATE INDEX IF NOT EXISTS usage_time ON usage (time)")
        self._db.execute("CREATE INDEX IF NOT EXISTS usage_key ON usage (key_id)")

    async def record(self, event: UsageEvent) -> None:
        with self._lock:
            self._db.execute(f"INSERT INTO usage VALUES ({', '.join('?' * len(_COLUMNS))})", astuple(event))

    async def query(self, start: float, end: float, group_by: tuple[str, ...], tenant: str | None = None) -> list[dict[str, Any]]:
        exprs = [GROUPS[g] for g in group_by]
        select = [f"{e} AS {g}" for e, g in zip(exprs, group_by)]
        billed = "CASE WHEN cache_status = 'HIT' THEN 0 ELSE {} END"
        saved = "CASE WHEN cache_status = 'HIT' THEN {} ELSE 0 END"
        sums = ["COUNT(*)", f"SUM({billed.format('prompt_tokens')})", f"SUM({billed.format('completion_tokens')})",
                f"SUM({saved.format('prompt_tokens')})", f"SUM({saved.format('completion_tokens')})",
                "SUM(cache_status = 'HIT')", "SUM(cache_status = 'MISS')", "SUM(status >= 400)", "SUM(latency_ms)"]
        sql = (f"SELECT {', '.join([*select, *sums])} FROM usage WHERE time >= ? AND time < ?"
               + (" AND tenant = ?" if tenant else ""))
        if exprs:
            sql += f" GROUP BY {', '.join(exprs)} ORDER BY {', '.join(exprs)}"
        params: list[Any] = [start, end, *([tenant] if tenant else [])]
        with self._lock:
            rows = self._db.execute(sql, params).fetchall()
        out = []
        for row in rows:
            n = len(group_by)
            count, prompt, completion, saved_prompt, saved_completion, hits, misses, errors, latency = row[n:]
            if not count:
                continue
            out.append({**dict(zip(group_by, row[:n])), "requests": count, "prompt_tokens": prompt or 0,
                        "completion_tokens": completion or 0, "saved_prompt_tokens": saved_prompt or 0,
                        "saved_completion_tokens": saved_completion or 0, "hits": hits or 0, "misses": misses or 0,
                        "errors": errors or 0, "latency_ms_total": latency or 0})
        return out

    async def tokens_spent(self, key_id: str) -> int:
        with self._lock:
            row = self._db.execute("SELECT SUM(prompt_tokens + completion_tokens) FROM usage WHERE key_id = ? AND cache_status != 'HIT'",
                                   (key_id,)).fetchone()
        return int(row[0] or 0)
