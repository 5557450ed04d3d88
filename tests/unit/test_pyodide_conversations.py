"""The conversation Durable Object's Pyodide adapters, run under CPython against
`tests/support/fake_pyodide`: the Worker's stub calls reach a hosted `ConversationObject` whose
storage is `ctx.storage.sql` (here SQLite behind the same cursor shape), and back."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace
from typing import Any

import pytest

from edgellm.conversations import ConversationStore, StoredResponse, new_conversation_id, new_response_id
from edgellm.errors import GatewayError
from tests.support import fake_pyodide as fp


class FakeSql:
    """`ctx.storage.sql`: `exec(query, *bindings)` -> a cursor with `toArray()`; JS undefined refused."""

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:", isolation_level=None)
        self.db.row_factory = sqlite3.Row

    def exec(self, query: str, *bindings: Any) -> Any:
        if any(b is None for b in bindings):
            raise fp.JsException("Error: Wrong type for value: undefined")
        values = [None if b is fp.jsnull else b for b in bindings]
        rows = [dict(r) for r in self.db.execute(query, values).fetchall()]
        return SimpleNamespace(toArray=lambda: rows)


class FakeHeaders:
    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers

    def items(self) -> Any:
        return self._headers.items()

    def entries(self) -> Any:
        return list(self._headers.items())


class FakeObjectBinding:
    """`env.CONVERSATIONS`: one hosted object per name, reached by `stub.fetch(url, init)`."""

    def __init__(self, host_factory: Any) -> None:
        self.hosts: dict[str, Any] = {}
        self.factory = host_factory

    def idFromName(self, name: str) -> str:  # noqa: N802 (Cloudflare's name)
        return f"id:{name}"

    def get(self, object_id: str) -> Any:
        host = self.hosts.setdefault(object_id, self.factory())
        binding = self

        class Stub:
            async def fetch(self, url: str, init: Any) -> Any:
                options = fp.require_js_object(init)
                body = options.get("body")
                raw = body.data if isinstance(body, fp.Uint8Array) else b""
                request = SimpleNamespace(method=options["method"], url=url, headers=FakeHeaders(options["headers"]),
                                          bytes=_bytes(raw))
                native = await host.fetch(request)
                return SimpleNamespace(status=native.status, headers=FakeHeaders(native.headers),
                                       body=native.body or None, arrayBuffer=_buffer(native.body))

        binding.last = object_id
        return Stub()


def _bytes(raw: bytes) -> Any:
    async def read() -> bytes:
        return raw
    return read


def _buffer(raw: bytes) -> Any:
    async def read() -> Any:
        return SimpleNamespace(to_bytes=lambda: raw)
    return read


@pytest.fixture
def adapter():
    with fp.installed():
        from edgellm.runtime import pyodide_conversations

        yield pyodide_conversations


async def test_a_conversation_round_trips_through_the_durable_object_adapters(adapter) -> None:
    env = SimpleNamespace(CONVERSATION_TTL="3600")
    binding = FakeObjectBinding(lambda: adapter.ConversationHost(SimpleNamespace(storage=SimpleNamespace(sql=FakeSql())), env))
    store = ConversationStore(adapter.WorkersDurableObjectNamespace(binding))
    conversation = new_conversation_id()
    first, second = new_response_id(conversation), new_response_id(conversation)
    await store.append(StoredResponse(first, None, 1, "m", None, ({"role": "user", "content": "q"},), "a", "completed"))
    await store.append(StoredResponse(second, first, 2, "m", None, ({"role": "user", "content": "q2"},), "b", "completed"))
    assert [r.id for r in await store.chain(second)] == [first, second]
    assert list(binding.hosts) == [f"id:default/{conversation}"]  # one object per conversation, named in its tenant
    await store.delete(first)
    with pytest.raises(GatewayError) as info:
        await store.get(first)
    assert info.value.status == 404


async def test_a_failing_object_is_a_503(adapter) -> None:
    class Broken:
        def idFromName(self, name: str) -> str:  # noqa: N802
            return name

        def get(self, object_id: str) -> Any:
            class Stub:
                async def fetch(self, url: str, init: Any) -> Any:
                    raise fp.JsException("Error: Durable Object reset because its code was updated.")
            return Stub()

    store = ConversationStore(adapter.WorkersDurableObjectNamespace(Broken()))
    with pytest.raises(GatewayError) as info:
        await store.get(new_response_id(new_conversation_id()))
    assert info.value.status == 503 and info.value.retry_after
