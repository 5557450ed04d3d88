"""The conversation Durable Object's logic over real SQLite storage: append, chain, delete,
expiry on an injected clock, the size cap; the local storage's file made with the first row,
and closed when the instance is evicted."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from edgellm.conversations import (
    ConversationObject, StoredResponse, conversation_of, new_conversation_id, new_response_id,
)
from edgellm.config import Config
from edgellm.http import Request, Response
from edgellm_local.emulator.conversation_sqlite import SqliteSqlStorage, conversation_factory
from tests.conftest import ManualClock

ORIGIN = "https://conversation.internal"


def record(response_id: str, previous: str | None, text: str, size: int = 0) -> StoredResponse:
    return StoredResponse(response_id, previous, 1, "m", None, ({"role": "user", "content": f"q {text}" + "x" * size},), text, "completed")


async def call(obj: ConversationObject, method: str, path: str, body: Any = None) -> Response:
    return await obj.fetch(Request(method, ORIGIN + path, {}, json.dumps(body).encode() if body is not None else b""))


@pytest.fixture
def obj(tmp_path: Path, clock: ManualClock) -> ConversationObject:
    return ConversationObject(SqliteSqlStorage(tmp_path / "c.sqlite3"), clock, ttl_seconds=3600, max_bytes=4000)


def test_response_ids_carry_their_conversation() -> None:
    conversation = new_conversation_id()
    response_id = new_response_id(conversation)
    assert conversation_of(response_id) == conversation and response_id != new_response_id(conversation)
    assert conversation_of("resp_../../etc") is None and conversation_of(response_id + "0") is None


async def test_a_chain_is_the_history_root_first(obj: ConversationObject) -> None:
    conv = new_conversation_id()
    ids = [new_response_id(conv) for _ in range(3)]
    for i, rid in enumerate(ids):
        assert (await call(obj, "POST", "/responses", record(rid, ids[i - 1] if i else None, f"a{i}").to_json())).status == 201
    chain = json.loads((await call(obj, "GET", f"/chain/{ids[2]}")).body)["chain"]
    assert [r["id"] for r in chain] == ids
    history = [m for r in chain for m in StoredResponse.from_json(r).messages()]
    assert [m["content"] for m in history] == ["q a0", "a0", "q a1", "a1", "q a2", "a2"]
    assert (await call(obj, "POST", "/responses", record(ids[0], None, "again").to_json())).status == 409


async def test_a_deleted_turn_ends_the_history_and_what_get_finds_can_be_continued(obj: ConversationObject) -> None:
    """Continuing from a response whose earlier turn was deleted was a 404 while
    `GET` of it said 200. As on OpenAI, a response that is still there can be continued; the
    deleted turn is gone from the history (from every later prompt)."""
    conv = new_conversation_id()
    first, second, third = new_response_id(conv), new_response_id(conv), new_response_id(conv)
    await call(obj, "POST", "/responses", record(first, None, "a").to_json())
    await call(obj, "POST", "/responses", record(second, first, "b").to_json())
    await call(obj, "POST", "/responses", record(third, second, "c").to_json())
    assert (await call(obj, "DELETE", f"/responses/{second}")).status == 200
    assert (await call(obj, "GET", f"/responses/{second}")).status == 404
    assert (await call(obj, "GET", f"/chain/{second}")).status == 404  # the id itself: gone
    assert (await call(obj, "GET", f"/responses/{third}")).status == 200
    chain = json.loads((await call(obj, "GET", f"/chain/{third}")).body)["chain"]
    assert [r["id"] for r in chain] == [third]
    assert (await call(obj, "DELETE", f"/responses/{second}")).status == 404


async def test_responses_expire_after_the_ttl(obj: ConversationObject, clock: ManualClock) -> None:
    rid = new_response_id(new_conversation_id())
    await call(obj, "POST", "/responses", record(rid, None, "a").to_json())
    clock.advance(3599)
    assert (await call(obj, "GET", f"/responses/{rid}")).status == 200
    clock.advance(1)
    assert (await call(obj, "GET", f"/responses/{rid}")).status == 404


async def test_a_conversation_has_a_size_cap(obj: ConversationObject) -> None:
    conv = new_conversation_id()
    first = new_response_id(conv)
    assert (await call(obj, "POST", "/responses", record(first, None, "a", size=2500).to_json())).status == 201
    assert (await call(obj, "POST", "/responses", record(new_response_id(conv), first, "b", size=2500).to_json())).status == 413
    assert (await call(obj, "POST", "/responses", record(new_response_id(conv), first, "c", size=100).to_json())).status == 201


async def test_state_survives_a_new_instance_over_the_same_storage(tmp_path: Path, clock: ManualClock) -> None:
    rid = new_response_id(new_conversation_id())
    first = ConversationObject(SqliteSqlStorage(tmp_path / "c.sqlite3"), clock)
    await call(first, "POST", "/responses", record(rid, None, "a").to_json())
    again = ConversationObject(SqliteSqlStorage(tmp_path / "c.sqlite3"), clock)
    assert json.loads((await call(again, "GET", f"/responses/{rid}")).body)["output_text"] == "a"


async def test_a_conversation_gets_its_file_with_its_first_row(tmp_path: Path, clock: ManualClock) -> None:
    """Looking up ids of a conversation never stored (any client can, with random ids) leaves no file."""
    file = tmp_path / "conversations" / "c.sqlite3"
    rid = new_response_id(new_conversation_id())
    obj = ConversationObject(SqliteSqlStorage(file), clock)
    assert (await call(obj, "GET", f"/responses/{rid}")).status == 404
    assert (await call(obj, "GET", f"/chain/{rid}")).status == 404
    assert (await call(obj, "DELETE", f"/responses/{rid}")).status == 404
    assert (await call(obj, "DELETE", "/")).status == 200
    assert not file.exists()
    assert (await call(obj, "POST", "/responses", record(rid, None, "a").to_json())).status == 201
    assert file.exists()
    obj.storage.close()  # type: ignore[attr-defined]
    again = ConversationObject(SqliteSqlStorage(file), clock)
    assert json.loads((await call(again, "GET", f"/responses/{rid}")).body)["output_text"] == "a"


async def test_closing_a_local_conversation_closes_its_database(tmp_path: Path, clock: ManualClock) -> None:
    """What the namespace calls when it evicts the instance: the descriptor goes, the data stays."""
    build = conversation_factory(tmp_path, Config(), clock)
    rid = new_response_id(new_conversation_id())
    obj = build(f"default/{rid}")
    assert (await call(obj, "POST", "/responses", record(rid, None, "a").to_json())).status == 201
    open_with_it = len(os.listdir("/proc/self/fd"))
    obj.close()  # type: ignore[attr-defined]
    assert len(os.listdir("/proc/self/fd")) == open_with_it - 1
    assert json.loads((await call(build(f"default/{rid}"), "GET", f"/responses/{rid}")).body)["output_text"] == "a"
