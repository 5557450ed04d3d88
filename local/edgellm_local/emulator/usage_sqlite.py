"""The usage port on SQLite: one row per answered request (no prompt or answer text).

The Worker writes the same fields to a Workers Analytics Engine dataset, fire-and-forget; locally
the rows are here so `GET /admin/usage` can group them without a network. Recording costs a
request as little as it does there: `record` appends the row to a list in memory and returns, and
a writer thread commits the rows in batches (every `flush_interval` seconds, or at once when
`batch_size` are waiting), one transaction per batch, in WAL with `synchronous=NORMAL`. Before,
each answer (HITs included) was an autocommit INSERT on the event loop, a commit and a sync per
request: ~80% of a HIT's time under load, and growing with the table.

What that costs: rows are in memory for up to one batch. A clean stop (`close`, called by the
local server's shutdown) writes them all; a crash (SIGKILL, power loss) loses at most the batch
not yet committed. Reads see everything recorded before them: `query` waits for the writer to
commit what is pending, in a thread, off the event loop; `tokens_spent` (a keyed budget, asked on
every request of such a key) reads the table once per key and then keeps the key's total in memory
as rows are recorded, so neither grows with the table.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgellm.ports import UsageEvent

GROUPS = {"tenant": "tenant", "model": "model", "route": "route", "cache_status": "cache_status", "key_id": "key_id",
          "day": "strftime('%Y-%m-%d', time, 'unixepoch')", "hour": "strftime('%Y-%m-%dT%H', time, 'unixepoch')"}
_COLUMNS = list(UsageEvent._fields)
_INSERT = f"INSERT INTO usage VALUES ({', '.join('?' * len(_COLUMNS))})"
_KEY, _STATUS, _PROMPT, _COMPLETION = (_COLUMNS.index(c) for c in ("key_id", "cache_status", "prompt_tokens", "completion_tokens"))
log = logging.getLogger("edgellm.usage")


def _billed(row: tuple[Any, ...]) -> int:
    return 0 if row[_STATUS] == "HIT" else int(row[_PROMPT] or 0) + int(row[_COMPLETION] or 0)


@dataclass
class SqliteUsage:
    path: str | Path = ":memory:"
    batch_size: int = 512  # rows that wake the writer before its interval is up
    flush_interval: float = 0.05  # seconds a recorded row waits at most before its batch is committed
    max_pending: int = 200_000  # rows held while the database cannot be written (beyond: the oldest are dropped, logged)
    _db: sqlite3.Connection = field(init=False, repr=False)
    _db_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)  # the connection's one user
    _cond: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)  # guards what follows
    _pending: list[tuple[Any, ...]] = field(default_factory=list, init=False, repr=False)
    _recorded: int = field(default=0, init=False, repr=False)  # rows handed to `record`, ever
    _written: int = field(default=0, init=False, repr=False)  # rows committed or given up on
    _flushing: int = field(default=0, init=False, repr=False)  # readers waiting for a commit now
    _spent: dict[str, int] = field(default_factory=dict, init=False, repr=False)  # keys whose total is kept in memory
    _writer: threading.Thread | None = field(default=None, init=False, repr=False)
    dropped: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # in WAL: durable at checkpoints, consistent always
        self._db.execute(f"CREATE TABLE IF NOT EXISTS usage ({', '.join(_COLUMNS)})")
        have = {row[1] for row in self._db.execute("PRAGMA table_info(usage)")}
        for column in _COLUMNS:  # a file made before a column was added: the column, its old rows ''
            if column not in have:
                self._db.execute(f"ALTER TABLE usage ADD COLUMN {column} DEFAULT ''")
        self._db.execute("CREATE INDEX IF NOT EXISTS usage_time ON usage (time)")
        self._db.execute("CREATE INDEX IF NOT EXISTS usage_key ON usage (key_id)")

    async def record(self, event: UsageEvent) -> None:
        self.record_now(event)

    def record_now(self, event: UsageEvent) -> None:
        """Queue the row for the writer; never waits for the database."""
        row = event  # its own row: a named tuple, its fields in column order
        with self._cond:
            if len(self._pending) >= self.max_pending:
                del self._pending[0]
                self.dropped += 1
                self._written += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    log.warning("usage database not keeping up: %d rows dropped", self.dropped)
            self._pending.append(row)
            self._recorded += 1
            key = row[_KEY]
            if key in self._spent:
                self._spent[key] += _billed(row)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="usage-writer", daemon=True)
                self._writer.start()
            elif len(self._pending) >= self.batch_size:
                self._cond.notify_all()

    def _write_loop(self) -> None:
        """The writer thread: commits what is pending in batches; ends when idle or closed (the
        next `record` starts another), so an idle sink holds no thread."""
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._flushing or len(self._pending) >= self.batch_size,
                                    timeout=self.flush_interval)
                if not self._pending:
                    self._writer = None
                    self._cond.notify_all()
                    return
            self._write_pending()

    def _write_pending(self) -> None:
        with self._db_lock:  # taken before the rows leave `_pending`: a row is always in one or the other
            with self._cond:
                batch, self._pending = self._pending[: self.batch_size * 8], self._pending[self.batch_size * 8:]
            try:
                self.write_batch(batch)
            except Exception as exc:  # a usage write never fails a request; the rows are logged as lost
                log.warning("usage batch of %d rows not written: %s", len(batch), exc)
            with self._cond:
                self._written += len(batch)
                self._cond.notify_all()

    def write_batch(self, rows: list[tuple[Any, ...]]) -> None:
        """One transaction for the batch (the writer thread holds the connection)."""
        self._db.execute("BEGIN")
        try:
            self._db.executemany(_INSERT, rows)
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def flush(self) -> None:
        """Blocking: until every row recorded before this call is committed (a thread's call)."""
        with self._cond:
            target = self._recorded
            self._flushing += 1
            try:
                self._cond.notify_all()
                while self._written < target:
                    if self._writer is None:  # no writer to wait for: write here
                        break
                    self._cond.wait()
            finally:
                self._flushing -= 1
        while True:
            with self._cond:
                if self._written >= target or not self._pending:
                    return
            self._write_pending()

    def close(self) -> None:
        """A clean stop (the local server's shutdown): every recorded row is written. The sink
        stays usable: a later `record` starts a writer again, a later read still answers."""
        self.flush()

    async def query(self, start: float, end: float, group_by: tuple[str, ...], tenant: str | None = None) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._query, start, end, group_by, tenant)

    def _query(self, start: float, end: float, group_by: tuple[str, ...], tenant: str | None) -> list[dict[str, Any]]:
        self.flush()  # what was recorded before the read is in it
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
        verdicts_sql = (f"SELECT {', '.join([*exprs, 'guardrails', 'COUNT(*)'])} FROM usage WHERE time >= ? AND time < ?"
                        + (" AND tenant = ?" if tenant else "") + " AND guardrails != ''"
                        + f" GROUP BY {', '.join([*exprs, 'guardrails'])}")
        with self._db_lock:
            rows = self._db.execute(sql, params).fetchall()
            verdict_rows = self._db.execute(verdicts_sql, params).fetchall()
        n = len(group_by)
        verdicts: dict[tuple[Any, ...], dict[str, int]] = {}
        for row in verdict_rows:  # each row's "stage:label:action" items, counted per group
            counts = verdicts.setdefault(tuple(row[:n]), {})
            for item in row[n].split(","):
                counts[item] = counts.get(item, 0) + row[n + 1]
        out = []
        for row in rows:
            count, prompt, completion, saved_prompt, saved_completion, hits, misses, errors, latency = row[n:]
            if not count:
                continue
            out.append({**dict(zip(group_by, row[:n])), "requests": count, "prompt_tokens": prompt or 0,
                        "completion_tokens": completion or 0, "saved_prompt_tokens": saved_prompt or 0,
                        "saved_completion_tokens": saved_completion or 0, "hits": hits or 0, "misses": misses or 0,
                        "errors": errors or 0, "latency_ms_total": latency or 0,
                        "guardrails": verdicts.get(tuple(row[:n]), {})})
        return out

    async def tokens_spent(self, key_id: str) -> int:
        with self._cond:
            spent = self._spent.get(key_id)
        if spent is not None:
            return spent
        return await asyncio.to_thread(self._load_spent, key_id)

    def _load_spent(self, key_id: str) -> int:
        """The key's total from the table plus its rows not yet written, read once: from then on
        `record` keeps it (this process is the table's one writer)."""
        with self._db_lock:  # the writer is not between taking rows and committing them
            row = self._db.execute("SELECT SUM(prompt_tokens + completion_tokens) FROM usage WHERE key_id = ? AND cache_status != 'HIT'",
                                   (key_id,)).fetchone()
            with self._cond:
                if key_id not in self._spent:
                    self._spent[key_id] = int(row[0] or 0) + sum(_billed(r) for r in self._pending if r[_KEY] == key_id)
                return self._spent[key_id]
