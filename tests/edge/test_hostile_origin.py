"""A misbehaving origin (a real second process, `tests/support/hostile_origin.py`) behind the real
local edge, itself a child process under a memory limit (`tests/support/watched_edge.py`): every
request is bounded in time, so a regression fails (an error, a timeout, the edge gone) and never
hangs the run. The edge's own binding always fails (`--fault fail=1`), so every generation goes to
the origin."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from tests.support.hostile_origin import MARKER, HostileOriginProcess
from tests.support.watched_edge import WatchedEdge

TIMEOUT_MS = 1500  # the origin's connect / first-byte / idle budget
TOTAL_MS = 6000  # its whole-answer budget
WAIT = 30  # the longest any request here may take before the test fails


@pytest.fixture(scope="module")
def origin() -> Iterator[HostileOriginProcess]:
    process = HostileOriginProcess.start()
    yield process
    process.stop()


@pytest.fixture(scope="module")
def edge(origin: HostileOriginProcess, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WatchedEdge]:
    origins = [{"name": "hostile", "url": origin.url, "timeout_ms": TIMEOUT_MS, "total_ms": TOTAL_MS}]
    env = {"ORIGINS": json.dumps(origins), "BREAKER": json.dumps({"failures": 1_000_000}),
           "EDGE_FIRST_TOKEN_MS": "60000", "EDGE_STALL_MS": "60000"}
    watched = WatchedEdge.start(tiny_model, tmp_path_factory.mktemp("hostile-origin-edge"), env=env, faults=("fail=1",))
    yield watched
    watched.stop()


@pytest.fixture
def client(edge: WatchedEdge) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=edge.url, timeout=WAIT) as c:
        yield c
    assert edge.alive(), "the edge process died (memory limit?):\n" + edge.log()[-3000:]
    assert httpx.get(edge.url + "/healthz", timeout=5).status_code == 200


def chat(**extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"hello {uuid.uuid4().hex}"}], "max_tokens": 16, **extra}


def stream(client: httpx.Client, body: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]], bool]:
    """(response, the data events, whether [DONE] came)."""
    events, done = [], False
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as response:
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[6:]))
    return response, events, done


def text_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))


def assert_upstream_error(response: httpx.Response, code: str) -> None:
    assert response.status_code == 502, response.text
    assert response.headers.get("retry-after", "").isdigit()
    error = response.json()["error"]
    assert error["type"] == "upstream_error" and error["code"] == code, error


def assert_error_event(response: httpx.Response, events: list[dict[str, Any]], code: str) -> None:
    assert response.status_code == 200
    assert events and "error" in events[-1], events[-3:]
    assert events[-1]["error"]["code"] == code, events[-1]


def test_a_well_behaved_origin_answers(origin: HostileOriginProcess, client: httpx.Client) -> None:
    origin.set_mode("ok")
    response = client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "one two three"


def test_a_gzip_stream_is_decoded(origin: HostileOriginProcess, client: httpx.Client) -> None:
    origin.set_mode("gzip")
    response = client.post("/v1/chat/completions", json=chat())
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "one two three"
    response, events, done = stream(client, chat())
    assert done and text_of(events) == "one two three"


def test_a_whole_json_answer_to_a_streamed_request_is_read_as_the_answer(origin: HostileOriginProcess, client: httpx.Client) -> None:
    """An origin asked to stream that answers `application/json` (it does not stream, or a proxy
    buffered it) gave a whole answer, not a broken stream: the edge reads it by its content type
    and renders it as the client asked, a stream of chunks ending in [DONE] or a JSON answer."""
    origin.set_mode("json_answer")
    response, events, done = stream(client, chat(stream_options={"include_usage": True}))
    assert response.status_code == 200 and done, events[-3:]
    assert text_of(events) == "one two three"
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0].get("finish_reason")] == ["stop"]
    assert events[-1]["usage"]["prompt_tokens"] == 7 and events[-1]["usage"]["completion_tokens"] == 3
    whole = client.post("/v1/chat/completions", json=chat())
    assert whole.status_code == 200, whole.text
    assert whole.json()["choices"][0]["message"]["content"] == "one two three"
    origin.set_mode("json_tool_call")
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    response, events, done = stream(client, chat(tools=tools))
    assert response.status_code == 200 and done, events[-3:]
    calls = [c for e in events if e.get("choices") for c in e["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["function"]["name"] == "get_weather" and "".join(c["function"].get("arguments") or "" for c in calls) == '{"city": "Paris"}'
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_json_error_in_place_of_a_stream_is_the_origins_failure(origin: HostileOriginProcess, client: httpx.Client) -> None:
    origin.set_mode("json_error")
    response, events, done = stream(client, chat())
    assert MARKER not in json.dumps(events)
    assert_upstream_error(client.post("/v1/chat/completions", json=chat()), "origin_error")


def test_an_encoding_the_edge_cannot_decode_is_refused(origin: HostileOriginProcess, client: httpx.Client) -> None:
    origin.set_mode("unknown_encoding")
    response = client.post("/v1/chat/completions", json=chat())
    assert_upstream_error(response, "origin_bad_encoding")
    assert "x-squash" in response.json()["error"]["message"]


@pytest.mark.parametrize("mode", ["gzip_bomb", "long_line"])
def test_a_line_without_end_is_cut_in_bounded_memory(origin: HostileOriginProcess, client: httpx.Client, mode: str) -> None:
    origin.set_mode(mode)
    response = client.post("/v1/chat/completions", json=chat())
    assert_upstream_error(response, "origin_garbage")
    response, events, done = stream(client, chat())
    assert response.status_code in (200, 502)
    if response.status_code == 200:
        assert_error_event(response, events, "origin_garbage")


def test_an_origin_that_never_answers_is_given_up_on(origin: HostileOriginProcess, client: httpx.Client) -> None:
    origin.set_mode("no_headers")
    response = client.post("/v1/chat/completions", json=chat())
    assert_upstream_error(response, "origin_unreachable")


def test_keep_alive_pings_do_not_hold_a_request_open(origin: HostileOriginProcess, client: httpx.Client) -> None:
    origin.set_mode("pings")
    assert_upstream_error(client.post("/v1/chat/completions", json=chat()), "origin_stalled")
    response, events, done = stream(client, chat())
    if response.status_code == 200:
        assert_error_event(response, events, "origin_stalled")
    else:
        assert_upstream_error(response, "origin_stalled")


def test_an_origin_ignoring_max_tokens_is_cut_at_the_requests_own(origin: HostileOriginProcess, client: httpx.Client) -> None:
    origin.set_mode("endless")
    answer = client.post("/v1/chat/completions", json=chat(max_tokens=16))
    assert answer.status_code == 200, answer.text
    data = answer.json()
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] <= 16
    assert data["choices"][0]["message"]["content"].count("more") <= 16
    response, events, done = stream(client, chat(max_tokens=16))
    assert response.status_code == 200 and done
    assert text_of(events).count("more") <= 16
    assert [e["choices"][0]["finish_reason"] for e in events if e.get("choices") and e["choices"][0].get("finish_reason")] == ["length"]


def test_an_origin_trickling_tokens_is_cut_at_its_whole_answer_budget(origin: HostileOriginProcess, client: httpx.Client) -> None:
    """Tokens every 0.5 s, each within the 1.5 s idle budget, with max_tokens far away: only
    `total_ms` ends it (JSON: a 502; streamed: the tokens so far, then an error event)."""
    origin.set_mode("slow_tokens")
    assert_upstream_error(client.post("/v1/chat/completions", json=chat(max_tokens=4096)), "origin_timeout")
    response, events, done = stream(client, chat(max_tokens=4096))
    assert "slow" in text_of(events)
    assert_error_event(response, events, "origin_timeout")
    assert not done


def test_garbage_from_an_origin_is_a_502_not_an_internal_error(origin: HostileOriginProcess, client: httpx.Client) -> None:
    origin.set_mode("garbage")
    assert_upstream_error(client.post("/v1/chat/completions", json=chat()), "origin_garbage")
    origin.set_mode("garbage_late")
    assert_upstream_error(client.post("/v1/chat/completions", json=chat()), "origin_garbage")
    response, events, done = stream(client, chat())
    assert_error_event(response, events, "origin_garbage")
    assert not done


@pytest.mark.parametrize("mode", ["usage_huge", "usage_negative"])
def test_impossible_usage_numbers_never_reach_the_client(origin: HostileOriginProcess, client: httpx.Client, mode: str) -> None:
    origin.set_mode(mode)
    answer = client.post("/v1/chat/completions", json=chat())
    assert_upstream_error(answer, "origin_garbage")
    response, events, done = stream(client, chat())
    assert_error_event(response, events, "origin_garbage")
    assert "1e+308" not in json.dumps(events) and "-5" not in json.dumps([e.get("usage") for e in events])


# --- an origin's own text: the edge's log only --------------------------------


def assert_logged_not_shown(edge: WatchedEdge, *answers: Any) -> None:
    for answer in answers:
        assert MARKER not in json.dumps(answer), answer
    assert edge.wait_log(MARKER), "the origin's own text never reached the edge's log"


def test_an_origins_context_refusal_is_the_edges_own_message_with_the_numbers(origin: HostileOriginProcess, client: httpx.Client,
                                                                              edge: WatchedEdge) -> None:
    """llama.cpp's `exceed_context_size_error` is OpenAI's `context_length_exceeded` in the edge's
    words: the origin's window, the request's max_tokens and the origin's own counts, never its text."""
    origin.set_mode("context_refusal")
    for body in (chat(), {**chat(), "stream": True}):
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"], error["type"]) == ("context_length_exceeded", "messages", "invalid_request_error")
        assert "hostile" in error["message"] and "max_tokens 16" in error["message"] and "4242" in error["message"] and "512" in error["message"]
        assert "exceeds the available context size" not in error["message"]
        assert_logged_not_shown(edge, response.text)


def test_an_origins_failure_text_stays_in_the_log(origin: HostileOriginProcess, client: httpx.Client, edge: WatchedEdge) -> None:
    origin.set_mode("refusal_500")
    answer = client.post("/v1/chat/completions", json=chat())
    assert_upstream_error(answer, "origin_error")
    assert_logged_not_shown(edge, answer.text)
    origin.set_mode("error_event")
    answer = client.post("/v1/chat/completions", json=chat())
    assert_upstream_error(answer, "origin_error")
    response, events, done = stream(client, chat())
    assert_error_event(response, events, "origin_error")
    assert not done
    assert_logged_not_shown(edge, answer.text, events)
