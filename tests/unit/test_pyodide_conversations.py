"""The conversation Durable Object's Pyodide adapters, run under CPython over the real `workers`
SDK (`tests/support/fake_pyodide` stands in only what lies under it): the Worker's calls go
through the SDK's Durable Object stub to `entry.Conversation`, a `workers.DurableObject` hosting a
`ConversationObject` whose storage is `ctx.storage.sql` (here SQLite behind the same cursor
shape), and back."""

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


@pytest.fixture
def adapter():
    with fp.installed() as rt:
        import entry
        from edgellm.runtime import pyodide_conversations

        pyodide_conversations.entry = entry
        pyodide_conversations.rt = rt
        yield pyodide_conversations


async def test_a_conversation_round_trips_through_the_durable_object_adapters(adapter) -> None:
    env = fp.JsEnv(CONVERSATION_TTL="3600")
    binding = fp.DurableObjectNamespace(adapter.entry.Conversation, env, storage=lambda: SimpleNamespace(sql=FakeSql()))
    # what the Worker's env holds: the SDK's wrapper over the binding (workers/rpc.py _EnvWrapper)
    wrapped = adapter.rt.workers._EnvWrapper(fp.JsEnv(CONVERSATIONS=binding)).CONVERSATIONS
    store = ConversationStore(adapter.WorkersDurableObjectNamespace(wrapped))
    conversation = new_conversation_id()
    first, second = new_response_id(conversation), new_response_id(conversation)
    await store.append(StoredResponse(first, None, 1, "m", None, ({"role": "user", "content": "q"},), "a", "completed"))
    await store.append(StoredResponse(second, first, 2, "m", None, ({"role": "user", "content": "q2"},), "b", "completed"))
    assert [r.id for r in await store.chain(second)] == [first, second]
    assert list(binding.instances) == [f"default/{conversation}"]  # one object per conversation, named in its tenant
    await store.delete(first)
    with pytest.raises(GatewayError) as info:
        await store.get(first)
    assert info.value.status == 404


async def test_a_failing_object_is_a_503(adapter) -> None:
    class Reset(fp.DurableObjectStub):
        async def fetch(self, url: Any, init: Any = None) -> Any:
            raise fp.JsException("Error: Durable Object reset because its code was updated.")

    class Broken(fp.DurableObjectNamespace):
        def get(self, object_id: Any) -> Any:
            return Reset(self, object_id.name)

    wrapped = adapter.rt.workers._EnvWrapper(fp.JsEnv(CONVERSATIONS=Broken(adapter.entry.Conversation, fp.JsEnv()))).CONVERSATIONS
    store = ConversationStore(adapter.WorkersDurableObjectNamespace(wrapped))
    with pytest.raises(GatewayError) as info:
        await store.get(new_response_id(new_conversation_id()))
    assert info.value.status == 503 and info.value.retry_after
