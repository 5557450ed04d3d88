"""The conversation Durable Objects' storage on the local edge: one SQLite file per object,
as each Durable Object on Cloudflare has its own SQLite database (`ctx.storage.sql`)."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

from edgellm.config import Config
from edgellm.conversations import ConversationObject
from edgellm.ports import Clock


class SqliteSqlStorage:
    """`ctx.storage.sql.exec(query, *params)` over a SQLite file (autocommit, rows as dicts)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()

    def exec(self, query: str, *params: Any) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(row) for row in self._db.execute(query, params).fetchall()]

    def close(self) -> None:
        self._db.close()


def conversation_factory(directory: Path, config: Config, clock: Clock) -> Any:
    """Builds the object for a conversation name, its storage a file named for it."""

    def build(name: str) -> ConversationObject:
        file = directory / f"{hashlib.sha256(name.encode()).hexdigest()[:40]}.sqlite3"
        return ConversationObject(SqliteSqlStorage(file), clock, config.conversation_ttl, config.conversation_max_bytes)

    return build
