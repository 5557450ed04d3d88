"""Stored conversations under deletes and long chains, through the local
edge's real HTTP server with its conversation Durable Objects: a DELETE while a response streams
deletes it, a parent deleted mid-stream leaves no child that cannot be continued, and a chain
past the message cap is `truncation: "auto"` or the documented `conversation_too_large`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from edgellm.config import Config
from edgellm.deps import Deps
from edgellm_local.doubles.scripted import ScriptedAI
from edgellm_local.emulator.conversation_sqlite import conversation_factory
from edgellm_local.emulator.durable import LocalDurableObjectNamespace
from tests.conftest import ManualClock

WAIT = 60
NO_CACHE = {"cf-aig-skip-cache": "true"}


@pytest.fixture
def conversing(start_edge, make_deps: Callable[..., Deps], tmp_path: Path):
    def make(config: Config | None = None, **gate: Any):
        config = config or Config(open_access=True)
        clock = ManualClock()
        base = make_deps(config=config, clock=clock)
        ai = ScriptedAI(base.ai, **gate)
        namespace = LocalDurableObjectNamespace(conversation_factory(tmp_path / "conversations", config, clock), class_name="Conversation")
        return start_edge(replace(base, ai=ai, conversations=namespace)), ai

    return make


def create(server: Any, **body: Any) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json={"input": "Say hello.", "max_output_tokens": 8, "temperature": 0, **body},
                      headers=NO_CACHE, timeout=WAIT)


def _stream_until_stalled(server: Any, ai: ScriptedAI, on_stall: Callable[[str], None], **body: Any) -> list[dict[str, Any]]:
    """Stream a response; once the binding stalls, call `on_stall(response id)`, open the gate,
    and read the stream to its end. Returns its events."""
    events, response_id = [], None
    with httpx.stream("POST", server.url + "/v1/responses", json={"input": "Tell a story.", "max_output_tokens": 20, "temperature": 0,
                                                                  "stream": True, **body}, headers=NO_CACHE, timeout=WAIT) as stream:
        for line in stream.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            events.append(event)
            if event["type"] == "response.created":
                response_id = event["response"]["id"]
            if event["type"] == "response.output_text.delta" and not ai.gate.is_set():
                assert ai.stalled.wait(WAIT) and response_id
                on_stall(response_id)
                ai.gate.set()
    return events


def test_deleting_a_response_while_it_streams_deletes_it(conversing) -> None:
    server, ai = conversing(stall_after=1)
    deletes: list[httpx.Response] = []
    events = _stream_until_stalled(server, ai, lambda rid: deletes.append(httpx.delete(f"{server.url}/v1/responses/{rid}", timeout=WAIT)))
    assert deletes[0].status_code == 200 and deletes[0].json()["deleted"] is True
    rid = events[0]["response"]["id"]
    assert events[-1]["type"] in ("response.completed", "response.incomplete")  # the client still gets its answer
    assert httpx.get(f"{server.url}/v1/responses/{rid}", timeout=WAIT).status_code == 404  # and it was never stored
    assert httpx.delete(f"{server.url}/v1/responses/{rid}", timeout=WAIT).status_code == 404


def test_deleting_the_parent_mid_stream_leaves_no_child_that_cannot_be_continued(conversing) -> None:
    server, ai = conversing(stall_after=1)
    ai.gate.set()
    parent = create(server).json()["id"]
    ai.gate.clear()
    ai.stalled.clear()
    events = _stream_until_stalled(server, ai, lambda rid: httpx.delete(f"{server.url}/v1/responses/{parent}", timeout=WAIT),
                                   previous_response_id=parent)
    child = events[0]["response"]["id"]
    assert events[-1]["type"] == "error" and events[-1]["code"] == "response_not_found", events[-1]
    assert httpx.get(f"{server.url}/v1/responses/{child}", timeout=WAIT).status_code == 404
    # nothing stored can be read but not continued: every stored response continues
    assert create(server, previous_response_id=child).status_code == 404


def test_a_chain_past_the_message_cap_is_truncated_on_request_or_named_as_too_large(conversing) -> None:
    server, ai = conversing(config=Config(open_access=True, fixed_max_messages=6))
    ai.gate.set()
    ids = [create(server).json()["id"]]
    for _ in range(2):  # three turns: 6 messages stored
        ids.append(create(server, previous_response_id=ids[-1]).json()["id"])
    refused = create(server, previous_response_id=ids[-1])
    error = refused.json()["error"]
    assert refused.status_code == 400 and (error["code"], error["param"]) == ("conversation_too_large", "previous_response_id"), error
    assert "messages" not in (error["param"] or "") and "truncation" in error["message"]
    truncated = create(server, previous_response_id=ids[-1], truncation="auto")
    assert truncated.status_code == 200, truncated.text
    assert truncated.json()["truncation"] == "auto" and truncated.json()["previous_response_id"] == ids[-1]
    # and it continues: the next auto turn fits again
    assert create(server, previous_response_id=truncated.json()["id"], truncation="auto").status_code == 200
    assert create(server, truncation="bogus").status_code == 400
