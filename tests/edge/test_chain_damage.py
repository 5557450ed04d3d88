"""A cycle written into a running edge's conversation store, through the local
edge's real HTTP server: continuing the damaged chain is the documented 502 `conversation_corrupt`
(with Retry-After) within a bounded time, and the edge goes on answering. The walk once looped for
ever (3.1 GB in ~30 s); the edge is its own process under a memory and time watchdog
(`tests/support/watched_edge.py`), so a regression fails here instead of hanging the run."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.support.watched_edge import WatchedEdge

WAIT = 30  # the longest any request here may take before the test fails
NO_CACHE = {"cf-aig-skip-cache": "true"}


@pytest.fixture
def edge(tiny_model: Path, tmp_path: Path) -> Iterator[WatchedEdge]:
    watched = WatchedEdge.start(tiny_model, tmp_path)
    yield watched
    watched.stop()


def turn(edge: WatchedEdge, previous: str | None = None) -> httpx.Response:
    body = {"input": "Say hello.", "max_output_tokens": 4, "temperature": 0, **({"previous_response_id": previous} if previous else {})}
    return httpx.post(edge.url + "/v1/responses", json=body, headers=NO_CACHE, timeout=WAIT)


def test_a_cycle_written_into_a_running_edges_store_is_a_502_and_the_edge_goes_on(edge: WatchedEdge) -> None:
    ids: list[str] = []
    for _ in range(3):
        answer = turn(edge, ids[-1] if ids else None)
        assert answer.status_code == 200, answer.text
        ids.append(answer.json()["id"])
    files = list((edge.state / "conversations").glob("*.sqlite3"))
    assert len(files) == 1, files  # one conversation, one Durable Object's file
    with sqlite3.connect(files[0]) as db:  # the damage, written to the file under the running edge: the root names the last turn
        (body,) = db.execute("SELECT body FROM responses WHERE id = ?", (ids[0],)).fetchone()
        record = json.loads(body)
        assert record["previous_response_id"] is None
        db.execute("UPDATE responses SET body = ? WHERE id = ?", (json.dumps({**record, "previous_response_id": ids[-1]}), ids[0]))
    for stream in (False, True):
        refused = httpx.post(edge.url + "/v1/responses", json={"input": "Go on.", "max_output_tokens": 4, "previous_response_id": ids[-1],
                                                               "stream": stream}, headers=NO_CACHE, timeout=WAIT)
        assert refused.status_code == 502 and int(refused.headers["retry-after"]) > 0, refused.text
        error = refused.json()["error"]
        assert error["code"] == "conversation_corrupt" and error["param"] == "previous_response_id"
    assert httpx.get(edge.url + f"/v1/responses/{ids[-1]}", timeout=WAIT).status_code == 200  # one turn alone is still readable
    assert edge.alive(), edge.log()[-3000:]
    assert httpx.get(edge.url + "/healthz", timeout=5).status_code == 200
    assert turn(edge).status_code == 200  # and a new conversation is served
