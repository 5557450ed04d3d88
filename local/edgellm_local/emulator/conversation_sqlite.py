"""The conversation Durable Objects' storage on the local edge: one SQLite file per object,
as each Durable Object on Cloudflare has its own SQLite database (`ctx.storage.sql`)."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgellm.config import Config
from edgellm.conversations import ConversationObject
from edgellm.ports import Clock


class SqliteSqlStorage:
    """`ctx.storage.sql.exec(query, *params)` over a SQLite file (autocommit, rows as dicts).

    The file is made when the first row is written: until then the database (its schema only)
    is in memory. Looking up a response id of no stored conversation, which any client can do
    with random ids, so leaves no file behind and holds no file descriptor."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._on_disk = path.exists()
        self._db = self._connect(path if self._on_disk else ":memory:")
        self._lock = threading.Lock()

    @staticmethod
    def _connect(target: Path | str) -> sqlite3.Connection:
        db = sqlite3.connect(target, isolation_level=None, check_same_thread=False)
        db.row_factory = sqlite3.Row
        return db

    def exec(self, query: str, *params: Any) -> list[dict[str, Any]]:
        with self._lock:
            rows = [dict(row) for row in self._db.execute(query, params).fetchall()]
            if not self._on_disk and self._db.total_changes:  # rows written (a schema alone counts none)
                self._persist()
            return rows

    def _persist(self) -> None:
        """Move the in-memory database to its file, and go on with the file."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        file = self._connect(self._path)
        try:
            self._db.backup(file)
        except BaseException:
            file.close()  # the rows stay in memory; the next write tries again
            raise
        self._db.close()
        self._db, self._on_disk = file, True

    def close(self) -> None:
        self._db.close()


@dataclass
class LocalConversationObject(ConversationObject):
    """The core's conversation object with the close hook the local namespace calls when it
    evicts the instance: its SQLite connection is closed, its file stays for the next instance."""

    def close(self) -> None:
        self.storage.close()  # type: ignore[attr-defined]  # always a SqliteSqlStorage here


def conversation_factory(directory: Path, config: Config, clock: Clock) -> Any:
    """Builds the object for a conversation name, its storage a file named for it."""

    def build(name: str) -> ConversationObject:
        file = directory / f"{hashlib.sha256(name.encode()).hexdigest()[:40]}.sqlite3"
        return LocalConversationObject(SqliteSqlStorage(file), clock, config.conversation_ttl, config.conversation_max_bytes)

    return build
