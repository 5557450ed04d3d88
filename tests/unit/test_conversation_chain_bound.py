"""A damaged conversation file (a cycle in its links, or a chain longer than any conversation)
must end the walk with a clear error: it once looped for ever (3.1 GB in ~30 s). The walk runs
on a thread joined with a deadline, so a regression fails here instead of hanging the run."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from edgellm.conversations import ConversationObject, ConversationStore, StoredResponse, new_conversation_id, new_response_id
from edgellm.errors import GatewayError
from edgellm.http import Request
from edgellm_local.emulator.conversation_sqlite import SqliteSqlStorage
from tests.conftest import ManualClock


def record(response_id: str, previous: str | None) -> StoredResponse:
    return StoredResponse(response_id, previous, 1, "m", None, ({"role": "user", "content": "q"},), "a", "completed")


def bounded(call: Any, seconds: float = 10) -> Any:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(asyncio.run(call()))
        except BaseException as exc:  # handed to the test's thread
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the chain walk did not end"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def corrupt_object(tmp_path: Path, links: int, cycle: bool) -> tuple[ConversationObject, str]:
    obj = ConversationObject(SqliteSqlStorage(tmp_path / "c.sqlite3"), ManualClock(), max_chain=16)
    conv = new_conversation_id()
    ids = [new_response_id(conv) for _ in range(links)]
    for i, rid in enumerate(ids):
        body = json.dumps(record(rid, ids[i - 1] if i else None).to_json())
        obj.storage.exec("INSERT INTO responses (id, previous, expires_at, size, body) VALUES (?, ?, ?, ?, ?)",
                         rid, None, 1e12, len(body), body)
    if cycle:  # written to the file, as damage would: the root points at the last turn
        body = json.dumps(record(ids[0], ids[-1]).to_json())
        obj.storage.exec("UPDATE responses SET body = ? WHERE id = ?", body, ids[0])
    return obj, ids[-1]


@pytest.mark.parametrize("links, cycle", [(3, True), (1, True), (40, False)])
def test_a_damaged_chain_is_a_clear_error_not_an_endless_walk(tmp_path: Path, links: int, cycle: bool) -> None:
    obj, last = corrupt_object(tmp_path, links, cycle)
    if links == 1:  # a turn that names itself
        body = json.dumps(record(last, last).to_json())
        obj.storage.exec("UPDATE responses SET body = ? WHERE id = ?", body, last)
    answer = bounded(lambda: obj.fetch(Request("GET", f"https://conversation.internal/chain/{last}", {}, b"")))
    assert answer.status == 422 and json.loads(bytes(answer.body))["error"] == "chain_corrupt"

    class Namespace:
        def get(self, name: str) -> ConversationObject:
            return obj

    with pytest.raises(GatewayError) as caught:
        bounded(lambda: ConversationStore(Namespace()).chain(last))  # type: ignore[arg-type]
    assert caught.value.status == 502 and caught.value.code == "conversation_corrupt" and caught.value.retry_after


def test_a_chain_within_the_bound_is_walked(tmp_path: Path) -> None:
    obj, last = corrupt_object(tmp_path, 16, cycle=False)
    answer = bounded(lambda: obj.fetch(Request("GET", f"https://conversation.internal/chain/{last}", {}, b"")))
    assert answer.status == 200 and len(json.loads(bytes(answer.body))["chain"]) == 16
