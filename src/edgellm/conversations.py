"""Conversation state: the chain of stored responses, owned by one Durable Object per conversation.

"The next turn sees the previous one" needs strong consistency, which KV (60 s propagation)
cannot give. A Durable Object is one single-threaded instance per name worldwide with its own
SQLite storage, so every response of a conversation is written and read in one place. A
response id carries its conversation's id (`resp_<conversation><turn>`), so any response is
found with no global index, and ids are random (unguessable) like OpenAI's.

`ConversationObject` is the object's logic (plain core code over a `SqlStorage` port: the
object's `ctx.storage.sql` on Cloudflare, a SQLite file locally); `ConversationStore` is what a
Worker request uses, through the `DurableObjectNamespace` port. Expiry is a TTL from the
clock (30 days by default), checked on every read; a conversation has a size cap; delete is
immediate.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Protocol

from .durable import DurableObjectNamespace
from .errors import ErrorKind, GatewayError, RetryAfter, dependency_error
from .http import Request, Response, json_bytes, json_response
from .ports import Clock
from .tenancy import TenantScope

DEFAULT_TTL_SECONDS = 30 * 86400
DEFAULT_MAX_BYTES = 1024 * 1024
PENDING_SECONDS = 3600.0  # how long a response being generated (or deleted while it was) is remembered
# Links a chain walk follows at most. `truncation: "auto"` lets a conversation outgrow the message
# cap (its oldest turns leave the prompt, not the store), so the bound is far above any prompt and
# only keeps a damaged file (a loop is caught by the ids seen) from an endless or huge walk.
DEFAULT_MAX_CHAIN = 4096
_RESPONSE_ID = re.compile(r"^resp_([0-9a-f]{32})([0-9a-f]{16})$")
_ORIGIN = "https://conversation.internal"


class SqlStorage(Protocol):
    """A Durable Object's SQLite storage (`ctx.storage.sql.exec`): rows as dicts."""

    def exec(self, query: str, *params: Any) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class StoredResponse:
    """One turn as stored: its own input messages and the assistant's answer. The history a
    later turn continues is the chain of these, root first."""

    id: str
    previous_response_id: str | None
    created_at: int
    model: str
    instructions: str | None
    input: tuple[dict[str, str], ...]
    output_text: str
    status: str  # "completed" | "incomplete"
    usage: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def conversation(self) -> str:
        return conversation_of(self.id) or ""

    def messages(self) -> list[dict[str, str]]:
        return [*self.input, {"role": "assistant", "content": self.output_text}]

    def to_json(self) -> dict[str, Any]:
        # one level, not `asdict`: its deep copy of `params` (a `text.format` schema) recursed once
        # per nesting level, a RecursionError for a deep schema after the answer was generated
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["input"] = list(self.input)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StoredResponse":
        return cls(**{**data, "input": tuple(data["input"])})


def new_conversation_id() -> str:
    return secrets.token_hex(16)


def new_response_id(conversation: str) -> str:
    return f"resp_{conversation}{secrets.token_hex(8)}"


def conversation_of(response_id: str) -> str | None:
    match = _RESPONSE_ID.match(response_id)
    return match.group(1) if match else None


# --- the Durable Object ------------------------------------------------------------------


@dataclass
class ConversationObject:
    """One conversation's responses in the object's SQLite storage.

    Internal protocol (JSON): `POST /responses` appends (409 if the id exists, 413 past the
    size cap), `GET /responses/{id}`, `GET /chain/{id}` (root first; 404 if the id itself is
    gone or expired; an earlier turn deleted or expired ends the history there, so a response
    that `GET` finds can always be continued, as on OpenAI), `DELETE /responses/{id}`, `DELETE /` (the whole conversation).
    """

    storage: SqlStorage
    clock: Clock
    ttl_seconds: int = DEFAULT_TTL_SECONDS
    max_bytes: int = DEFAULT_MAX_BYTES
    max_chain: int = DEFAULT_MAX_CHAIN  # links a chain walk follows at most (see DEFAULT_MAX_CHAIN)

    def __post_init__(self) -> None:
        self.storage.exec(
            "CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, previous TEXT, "
            "expires_at REAL NOT NULL, size INTEGER NOT NULL, body TEXT NOT NULL)"
        )
        # responses being generated (`POST /pending/{id}`), and those deleted while they were: a
        # DELETE mid-stream is a delete, and the answer that ends later is then never stored
        self.storage.exec("CREATE TABLE IF NOT EXISTS pending (id TEXT PRIMARY KEY, expires_at REAL NOT NULL)")
        self.storage.exec("CREATE TABLE IF NOT EXISTS tombstones (id TEXT PRIMARY KEY, expires_at REAL NOT NULL)")

    async def fetch(self, request: Request) -> Response:
        self._expire()
        parts = request.path.strip("/").split("/")
        if request.method == "POST" and parts == ["responses"]:
            return self._append(StoredResponse.from_json(json.loads(request.body)))
        if request.method == "GET" and len(parts) == 2 and parts[0] == "responses":
            record = self._get(parts[1])
            return json_response(record.to_json()) if record else _missing()
        if request.method == "GET" and len(parts) == 2 and parts[0] == "chain":
            chain = self._chain(parts[1])
            if chain == "corrupt":
                return json_response({"error": "chain_corrupt", "limit": self.max_chain}, status=422)
            return json_response({"chain": [r.to_json() for r in chain]}) if chain else _missing()  # type: ignore[union-attr]
        if request.method == "POST" and len(parts) == 2 and parts[0] == "pending":
            self.storage.exec("INSERT OR REPLACE INTO pending (id, expires_at) VALUES (?, ?)", parts[1], self.clock.now() + PENDING_SECONDS)
            return json_response({"pending": parts[1]}, status=201)
        if request.method == "DELETE" and len(parts) == 2 and parts[0] == "responses":
            deleted = bool(self.storage.exec("DELETE FROM responses WHERE id = ? RETURNING id", parts[1]))
            if not deleted and self.storage.exec("DELETE FROM pending WHERE id = ? RETURNING id", parts[1]):
                self.storage.exec("INSERT OR REPLACE INTO tombstones (id, expires_at) VALUES (?, ?)", parts[1], self.clock.now() + PENDING_SECONDS)
                deleted = True
            return json_response({"deleted": True}) if deleted else _missing()
        if request.method == "DELETE" and parts == [""]:
            self.storage.exec("DELETE FROM responses")
            return json_response({"deleted": True})
        return json_response({"error": "no such operation"}, status=404)

    def _expire(self) -> None:
        now = self.clock.now()
        self.storage.exec("DELETE FROM responses WHERE expires_at <= ?", now)
        self.storage.exec("DELETE FROM pending WHERE expires_at <= ?", now)
        self.storage.exec("DELETE FROM tombstones WHERE expires_at <= ?", now)

    def _get(self, response_id: str) -> StoredResponse | None:
        rows = self.storage.exec("SELECT body FROM responses WHERE id = ?", response_id)
        return StoredResponse.from_json(json.loads(rows[0]["body"])) if rows else None

    def _chain(self, response_id: str) -> list[StoredResponse] | None | str:
        """Root first; None if a link is gone; "corrupt" if the stored links loop or run longer
        than `max_chain` links: a damaged file must never make the walk endless."""
        chain: list[StoredResponse] = []
        seen: set[str] = set()
        current: str | None = response_id
        while current is not None:
            if current in seen or len(chain) >= self.max_chain:
                return "corrupt"
            seen.add(current)
            record = self._get(current)
            if record is None:  # the id itself: 404; a turn further back deleted: history from after it
                if not chain:
                    return None
                break
            chain.append(record)
            current = record.previous_response_id
        return chain[::-1]

    def _append(self, record: StoredResponse) -> Response:
        body = json_bytes(record.to_json()).decode()
        used = self.storage.exec("SELECT COALESCE(SUM(size), 0) AS used FROM responses")[0]["used"]
        if int(used) + len(body) > self.max_bytes:
            return json_response({"error": "conversation_full", "limit": self.max_bytes}, status=413)
        if self.storage.exec("SELECT id FROM responses WHERE id = ?", record.id):
            return json_response({"error": "exists"}, status=409)
        if self.storage.exec("SELECT id FROM tombstones WHERE id = ?", record.id):
            return json_response({"error": "deleted"}, status=410)  # deleted while it was generated
        if record.previous_response_id is not None and not self._get(record.previous_response_id):
            return json_response({"error": "previous_gone"}, status=410)  # a child that could not be continued
        self.storage.exec("DELETE FROM pending WHERE id = ?", record.id)
        self.storage.exec(
            "INSERT INTO responses (id, previous, expires_at, size, body) VALUES (?, ?, ?, ?, ?)",
            record.id, record.previous_response_id, self.clock.now() + self.ttl_seconds, len(body), body,
        )
        return json_response({"stored": record.id}, status=201)


def _missing() -> Response:
    return json_response({"error": "not_found"}, status=404)


# --- what a Worker request uses ----------------------------------------------------------


def _unavailable(exc: BaseException | str) -> GatewayError:
    """The store failing, in the gateway's words: the exception's text (paths, internal names, an
    object's traceback) is not the caller's to read; it is the error's detail, for the log."""
    message, code = "The conversation store is unavailable; retry shortly.", "conversation_store_unavailable"
    if isinstance(exc, BaseException):
        return dependency_error(exc, ErrorKind.UNAVAILABLE, message, code, RetryAfter.DEPENDENCY, "the conversation store")
    return GatewayError(ErrorKind.UNAVAILABLE, message, code=code, retry_after=RetryAfter.DEPENDENCY, detail=f"the conversation store: {exc}")


def not_found(response_id: str) -> GatewayError:
    return GatewayError(ErrorKind.NOT_FOUND, f"Response with id '{response_id}' not found (never stored, deleted, or expired).",
                        param="response_id", code="response_not_found")


@dataclass(frozen=True)
class ConversationStore:
    """One tenant's stored responses, reached through one Durable Object per conversation.

    The object's name is `<tenant>/<conversation>`: a tenant reaching for another's response id
    lands on an object that holds nothing, so scoping needs no check that could be forgotten."""

    namespace: DurableObjectNamespace
    scope: TenantScope = TenantScope("default")  # whose conversations: names their objects

    async def _call(self, conversation: str, method: str, path: str, body: Any = None) -> Response:
        request = Request(method, _ORIGIN + path, {"content-type": "application/json"},
                          json_bytes(body) if body is not None else b"")
        try:
            response = await self.namespace.get(self.scope.object_name(conversation)).fetch(request)
        except GatewayError:
            raise
        except Exception as exc:  # the object failed or could not be reached: a failing dependency
            raise _unavailable(exc) from exc
        if response.status >= 500:
            said = bytes(response.body[:300]).decode(errors="replace") if isinstance(response.body, (bytes, bytearray)) else ""
            raise _unavailable(f"status {response.status} {said}".rstrip())
        return response

    async def append(self, record: StoredResponse) -> None:
        response = await self._call(record.conversation, "POST", "/responses", record.to_json())
        if response.status == 413:
            raise GatewayError(ErrorKind.INVALID_REQUEST, "This conversation has reached its size limit; start a new one (omit 'previous_response_id').",
                               param="previous_response_id", code="conversation_too_large")
        if response.status == 410:
            if json.loads(bytes(response.body)).get("error") == "deleted":
                return  # its owner deleted it while it was generated: the answer is not stored
            raise GatewayError(ErrorKind.NOT_FOUND, f"Response '{record.previous_response_id}' was deleted while this answer was generated; "
                               "the answer was not stored.", param="previous_response_id", code="response_not_found")
        if response.status != 201:
            raise _unavailable(f"append answered {response.status}")

    async def begin(self, response_id: str) -> None:
        """Say `response_id` is being generated: a DELETE before it is stored then deletes it."""
        await self._about(response_id, "POST", f"/pending/{response_id}")

    async def _about(self, response_id: str, method: str, path: str) -> Response:
        """Ask the object of `response_id`'s conversation; a 404 (or an id of no conversation)
        is this id's not-found error."""
        conversation = conversation_of(response_id)
        if conversation is None:
            raise not_found(response_id)
        response = await self._call(conversation, method, path)
        if response.status == 404:
            raise not_found(response_id)
        return response

    async def get(self, response_id: str) -> StoredResponse:
        response = await self._about(response_id, "GET", f"/responses/{response_id}")
        return StoredResponse.from_json(json.loads(bytes(response.body)))

    async def chain(self, response_id: str) -> list[StoredResponse]:
        """The conversation up to and including `response_id`, root first."""
        response = await self._about(response_id, "GET", f"/chain/{response_id}")
        if response.status == 422:
            raise GatewayError(ErrorKind.UPSTREAM, f"The stored conversation of '{response_id}' is damaged: its chain loops or is "
                               "longer than any conversation can be. Start a new one (omit 'previous_response_id').",
                               param="previous_response_id", code="conversation_corrupt", retry_after=RetryAfter.DEPENDENCY)
        return [StoredResponse.from_json(r) for r in json.loads(bytes(response.body))["chain"]]

    async def delete(self, response_id: str) -> None:
        await self._about(response_id, "DELETE", f"/responses/{response_id}")
