"""The conversation Durable Object on Cloudflare: the core's `ConversationObject` hosted in a
`workers.DurableObject` (its `ctx.storage.sql` as the `SqlStorage` port), and the Worker's
side of it, a `DurableObjectNamespace` over the `CONVERSATIONS` binding.

Runtime rules from workers-runtime.md: `sql.exec(query, ...bindings)` returns a cursor
(`toArray()` gives JS objects), SQL needs the SQLite backend (`new_sqlite_classes` in the
migration), a request goes through the one Durable Object stub (`pyodide_durable`: the SDK's keyword-only
`stub.fetch(url, method=, headers=, body=)`), and an
error thrown in the object reaches the caller as an exception (the core turns it into a 503).
"""

from __future__ import annotations

from typing import Any

from pyodide.ffi import jsnull  # type: ignore[import-not-found]

from ..config import Config
from ..conversations import ConversationObject
from ..deps import SystemClock
from .pyodide_env import EnvMapping
from .pyodide_toolbox import is_missing
from .pyodide_durable import WorkersDurableObjectNamespace, serve_object


def _binding(value: Any) -> Any:
    return jsnull if value is None else value  # Python None would arrive as JS undefined, which SQL refuses


class WorkersSqlStorage:
    """`ctx.storage.sql` as the core's `SqlStorage`: rows as dicts."""

    def __init__(self, sql: Any) -> None:
        self._sql = sql

    def exec(self, query: str, *params: Any) -> list[dict[str, Any]]:
        cursor = self._sql.exec(query, *[_binding(p) for p in params])
        rows = cursor.toArray()
        return [dict(row) for row in (rows.to_py() if hasattr(rows, "to_py") else rows)]


class ConversationHost:
    """What `entry.Conversation` (a `workers.DurableObject`) delegates to."""

    def __init__(self, ctx: Any, env: Any) -> None:
        self.config = Config.from_env(EnvMapping(env))
        self.object = ConversationObject(WorkersSqlStorage(ctx.storage.sql), SystemClock(),
                                         self.config.conversation_ttl, self.config.conversation_max_bytes)

    async def fetch(self, request: Any) -> Any:
        return await serve_object(self.object, request, self.config.conversation_max_bytes + 65536)


def conversation_namespace(env: Any) -> WorkersDurableObjectNamespace | None:
    """The Worker's side: the `CONVERSATIONS` binding through the one Durable Object stub."""
    binding = getattr(env, "CONVERSATIONS", None)
    return None if binding is None or is_missing(binding) else WorkersDurableObjectNamespace(binding)
