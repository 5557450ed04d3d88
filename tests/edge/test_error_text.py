"""A binding's own error text never reaches the client (no internal exception text echoed in an
error message), through the local edge's real HTTP server: llama.cpp's words, a runtime's
exception and internal paths stay in the edge's log, and the client reads a clear message in the
OpenAI error shape, with Retry-After on a 5xx."""

from __future__ import annotations

import json
import logging
from typing import Callable

import httpx
import pytest

from edgellm.ports import BindingError
from edgellm_local.doubles.scripted import ScriptedAI

SECRET = "/root/.secret/models/x.gguf"
FAILURES = [BindingError(f"llama.cpp failed: std::runtime_error: mmap of {SECRET} failed"),
            RuntimeError(f"adapter bug reading {SECRET}")]  # an adapter that let a runtime error through


@pytest.mark.parametrize("failure", FAILURES, ids=["binding", "runtime"])
@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("cached", [False, True], ids=["direct", "through-the-flights-object"])
def test_a_bindings_own_text_stays_in_the_log(start_edge: Callable[..., object], caplog: pytest.LogCaptureFixture,
                                              failure: BaseException, streamed: bool, cached: bool) -> None:
    """`cached`: a cacheable miss runs in the flights Durable Object (the local emulation), whose
    error crosses back to the Worker as a JSON line: the text must survive that crossing for the
    log, and only for the log."""
    server = start_edge(ai=ScriptedAI(fail=failure, description=None), **({} if cached else {"kv": None}))
    with caplog.at_level(logging.WARNING):
        response = httpx.post(server.url + "/v1/chat/completions", timeout=30,  # type: ignore[attr-defined]
                              json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": streamed,
                                    "temperature": 0})  # deterministic: cacheable, so a miss goes through the flights object
    assert response.status_code == 502 and int(response.headers["retry-after"]) > 0, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code", "request_id"} and error["code"] == "upstream_error"
    assert SECRET not in response.text and "llama.cpp" not in response.text and "RuntimeError" not in response.text
    assert error["message"].startswith("The AI binding failed")
    assert any(SECRET in record.getMessage() for record in caplog.records)  # the operator still sees it


def test_a_llama_cpp_refusal_is_the_edges_words(start_edge: Callable[..., object]) -> None:
    server = start_edge()
    response = httpx.post(server.url + "/v1/chat/completions", timeout=60, headers={"cf-aig-skip-cache": "true"},  # type: ignore[attr-defined]
                          json={"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                                             {"role": "assistant", "content": "b"}], "max_tokens": 4})
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_model_input", response.text
    assert "llama.cpp" not in response.text and "chat template" in response.json()["error"]["message"]


STREAM_ROUTES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True, "temperature": 0}),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 8, "stream": True, "store": False, "temperature": 0}),
    "workers-ai": ("/client/v4/accounts/local/ai/run/@cf/meta/llama-2-7b-chat-int8",
                   {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True, "temperature": 0}),
}


@pytest.mark.parametrize("route", sorted(STREAM_ROUTES))
@pytest.mark.parametrize("cached", [False, True], ids=["direct", "through-the-flights-object"])
def test_a_bindings_text_after_the_first_byte_is_logged_and_kept_out_of_the_error_event(
        start_edge: Callable[..., object], caplog: pytest.LogCaptureFixture, route: str, cached: bool) -> None:
    """After the first byte a failure can only be an SSE error event: the event carries the edge's
    words, the binding's own text (an internal path here) reaches the edge's log, on every stream."""

    ai = ScriptedAI(fail_after=2, mid_stream=BindingError(f"connection reset reading {SECRET}"))
    server = start_edge(ai=ai, **({} if cached else {"kv": None}))
    path, payload = STREAM_ROUTES[route]
    with caplog.at_level(logging.WARNING):
        response = httpx.post(server.url + path, json=payload, timeout=30)  # type: ignore[attr-defined]
    assert response.status_code == 200, response.text
    last = [line for line in response.text.splitlines() if line.startswith("data:")][-1]
    assert "error" in json.loads(last[5:]) or json.loads(last[5:]).get("type") == "error", response.text  # it ended with an error event
    assert "data: [DONE]" not in response.text and SECRET not in response.text and "connection reset" not in response.text
    assert any(SECRET in record.getMessage() for record in caplog.records), "the binding's text never reached the log"


class FaultyConversation:
    """A conversation Durable Object that fails on one path (`/pending/`, `/responses`): it throws
    (on workerd the caller gets an AbortError carrying the object's traceback) or answers a 500
    whose body is its traceback; either way holding an internal path."""

    def __init__(self, inner: object, path: str, how: str) -> None:
        self.inner, self.path, self.how = inner, path, how

    async def fetch(self, request: object) -> object:
        from edgellm.http import Response

        if self.path in request.url and request.method == "POST":  # type: ignore[attr-defined]
            if self.how == "throws":
                raise RuntimeError(f"sqlite3.OperationalError: disk I/O error at {SECRET}")
            return Response(500, {"content-type": "text/plain"}, f"Traceback: disk I/O error at {SECRET}".encode())
        return await self.inner.fetch(request)  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["throws", "answers-500"])
@pytest.mark.parametrize("path, streamed", [("/pending/", False), ("/responses", False), ("/responses", True)],
                         ids=["begin", "append", "append-streamed"])
def test_a_conversation_objects_own_text_stays_in_the_log(start_edge: Callable[..., object], make_deps: Callable[..., object],
                                                          caplog: pytest.LogCaptureFixture, tmp_path: object, path: str,
                                                          streamed: bool, how: str) -> None:
    """The conversation store failing (before the answer, when the turn is stored, and when a
    streamed turn is stored after its last delta) is the edge's 503 words, or its SSE error event:
    the object's own text is in the log only."""
    from dataclasses import replace

    from edgellm.config import Config
    from edgellm_local.emulator.conversation_sqlite import conversation_factory
    from edgellm_local.emulator.durable import LocalDurableObjectNamespace
    from tests.conftest import ManualClock

    config, clock = Config(open_access=True), ManualClock()
    build = conversation_factory(tmp_path / "conversations", config, clock)  # type: ignore[operator]
    namespace = LocalDurableObjectNamespace(lambda name: FaultyConversation(build(name), path, how), class_name="Conversation")
    deps = make_deps(config=config, clock=clock, ai=ScriptedAI(), kv=None)  # type: ignore[operator]
    server = start_edge(replace(deps, conversations=namespace))
    with caplog.at_level(logging.WARNING):
        response = httpx.post(server.url + "/v1/responses", json={"input": "hi", "max_output_tokens": 8, "stream": streamed},  # type: ignore[attr-defined]
                              timeout=30)
    assert SECRET not in response.text and "OperationalError" not in response.text and "Traceback" not in response.text
    if streamed:
        assert response.status_code == 200 and "event: error" in response.text and "conversation_store_unavailable" in response.text
        assert "response.completed" not in response.text
    else:
        assert response.status_code == 503 and int(response.headers["retry-after"]) > 0, response.text
        assert response.json()["error"]["code"] == "conversation_store_unavailable"
    assert any(SECRET in record.getMessage() for record in caplog.records), "the object's text never reached the log"
