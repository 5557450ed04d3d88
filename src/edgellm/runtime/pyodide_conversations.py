"""The conversation Durable Object on Cloudflare: the core's `ConversationObject` hosted in a
`workers.DurableObject` (its `ctx.storage.sql` as the `SqlStorage` port), and the Worker's
side of it, a `DurableObjectNamespace` over the `CONVERSATIONS` binding.

Runtime rules from workers-runtime.md: `sql.exec(query, ...bindings)` returns a cursor
(`toArray()` gives JS objects), SQL needs the SQLite backend (`new_sqlite_classes` in the
migration), a request to a stub is `await stub.fetch(url, init)` with `to_js` options, and an
error thrown in the object reaches the caller as an exception (the core turns it into a 503).
"""

from __future__ import annotations

from typing import Any

from pyodide.ffi import JsException, jsnull, to_js  # type: ignore[import-not-found]

from ..config import Config
from ..conversations import ConversationObject
from ..http import Request, Response
from ..ports import BindingError, SystemClock
from .pyodide import EnvMapping, is_missing, js_options, to_core_request, to_native_response


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
        core = await to_core_request(request, self.config.conversation_max_bytes + 65536)
        return to_native_response(await self.object.fetch(core))


class WorkersDurableStub:
    def __init__(self, stub: Any) -> None:
        self._stub = stub

    async def fetch(self, request: Request) -> Response:
        init: dict[str, Any] = {"method": request.method, "headers": dict(request.headers)}
        if request.body:
            init["body"] = to_js(request.body)
        try:
            answer = await self._stub.fetch(request.url, js_options(init))
            body = (await answer.arrayBuffer()).to_bytes()
        except JsException as exc:
            raise BindingError(f"Durable Object request failed: {getattr(exc, 'message', exc)}") from exc
        headers = {str(k).lower(): str(v) for k, v in (answer.headers.entries() if hasattr(answer.headers, "entries") else [])}
        return Response(int(answer.status), headers, bytes(body))


class WorkersDurableNamespace:
    """A Durable Object binding as the core's `DurableObjectNamespace`: one object per name."""

    def __init__(self, binding: Any) -> None:
        self._binding = binding

    def get(self, name: str) -> WorkersDurableStub:
        return WorkersDurableStub(self._binding.get(self._binding.idFromName(name)))


def conversation_namespace(env: Any) -> WorkersDurableNamespace | None:
    binding = getattr(env, "CONVERSATIONS", None)
    return None if binding is None or is_missing(binding) else WorkersDurableNamespace(binding)

