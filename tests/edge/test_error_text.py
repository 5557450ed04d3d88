"""A binding's own error text never reaches the client (issue 25, "error messages echo internal
exception text"), through the local edge's real HTTP server: llama.cpp's words, a runtime's
exception and internal paths stay in the edge's log, and the client reads a clear message in the
OpenAI error shape, with Retry-After on a 5xx."""

from __future__ import annotations

import json
import logging
from typing import Callable

import httpx
import pytest

from edgellm.ports import BindingError
from tests.support.fake_ai import FailingAI

SECRET = "/root/.secret/models/x.gguf"
FAILURES = [BindingError(f"llama.cpp failed: std::runtime_error: mmap of {SECRET} failed"),
            RuntimeError(f"adapter bug reading {SECRET}")]  # an adapter that let a runtime error through


@pytest.mark.parametrize("failure", FAILURES, ids=["binding", "runtime"])
@pytest.mark.parametrize("streamed", [False, True])
def test_a_bindings_own_text_stays_in_the_log(start_edge: Callable[..., object], caplog: pytest.LogCaptureFixture,
                                              failure: BaseException, streamed: bool) -> None:
    server = start_edge(ai=FailingAI(failure), kv=None)
    with caplog.at_level(logging.WARNING):
        response = httpx.post(server.url + "/v1/chat/completions", timeout=30,  # type: ignore[attr-defined]
                              json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": streamed})
    assert response.status_code == 502 and int(response.headers["retry-after"]) > 0, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == "upstream_error"
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
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 8, "stream": True, "store": False}),
    "workers-ai": ("/client/v4/accounts/local/ai/run/@cf/meta/llama-2-7b-chat-int8",
                   {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}),
}


@pytest.mark.parametrize("route", sorted(STREAM_ROUTES))
def test_a_bindings_text_after_the_first_byte_is_logged_and_kept_out_of_the_error_event(
        start_edge: Callable[..., object], caplog: pytest.LogCaptureFixture, route: str) -> None:
    """After the first byte a failure can only be an SSE error event: the event carries the edge's
    words, the binding's own text (an internal path here) reaches the edge's log, on every stream."""
    from tests.support.fake_ai import ScriptedAI

    ai = ScriptedAI(fail_after=2, mid_stream=BindingError(f"connection reset reading {SECRET}"))
    server = start_edge(ai=ai, kv=None)
    path, payload = STREAM_ROUTES[route]
    with caplog.at_level(logging.WARNING):
        response = httpx.post(server.url + path, json=payload, timeout=30)  # type: ignore[attr-defined]
    assert response.status_code == 200, response.text
    last = [line for line in response.text.splitlines() if line.startswith("data:")][-1]
    assert "error" in json.loads(last[5:]) or json.loads(last[5:]).get("type") == "error", response.text  # it ended with an error event
    assert "data: [DONE]" not in response.text and SECRET not in response.text and "connection reset" not in response.text
    assert any(SECRET in record.getMessage() for record in caplog.records), "the binding's text never reached the log"
