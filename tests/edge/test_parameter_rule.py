"""One rule for fields the OpenAI-shaped routes do not know, on chat completions and responses
alike: llama.cpp's `grammar` is honoured by the local edge (and keyed by the cache), its other
extensions and unknown fields are refused by name, harmless OpenAI fields are accepted."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx
import pytest

from edgellm_local.emulator.server import EdgeServer

MODEL = "@cf/meta/llama-2-7b-chat-int8"
YES_NO = 'root ::= "yes" | "no"'
CHAT: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Is the sky blue?"}], "max_tokens": 8,
                        "temperature": 0}
RESPONSE: dict[str, Any] = {"model": MODEL, "input": "Is the sky blue?", "max_output_tokens": 8, "temperature": 0, "store": False}
ROUTES = [("/v1/chat/completions", CHAT), ("/v1/responses", RESPONSE)]


def text_of(path: str, body: dict[str, Any]) -> str:
    if path == "/v1/responses":
        return "".join(c["text"] for item in body["output"] for c in item.get("content", []))
    return body["choices"][0]["message"]["content"]


@pytest.fixture
def edge(start_edge: Callable[..., EdgeServer]) -> EdgeServer:
    return start_edge()


@pytest.mark.parametrize("path, base", ROUTES)
def test_grammar_is_honoured_and_keyed(edge: EdgeServer, path: str, base: dict[str, Any]) -> None:
    yes = httpx.post(edge.url + path, json={**base, "grammar": 'root ::= "yes"'}, timeout=60)
    no = httpx.post(edge.url + path, json={**base, "grammar": 'root ::= "no"'}, timeout=60)
    either = httpx.post(edge.url + path, json={**base, "grammar": YES_NO}, timeout=60)
    assert (yes.status_code, no.status_code, either.status_code) == (200, 200, 200), (yes.text, no.text)
    assert text_of(path, yes.json()) == "yes" and text_of(path, no.json()) == "no"  # not one cached answer for both
    assert text_of(path, either.json()) in ("yes", "no")


def test_a_streamed_chat_answer_meets_its_grammar(edge: EdgeServer) -> None:
    with httpx.stream("POST", edge.url + "/v1/chat/completions", json={**CHAT, "grammar": YES_NO, "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    assert text in ("yes", "no")


@pytest.mark.parametrize("path, base", ROUTES)
@pytest.mark.parametrize("name, value, code", [
    ("verbose", True, "unsupported_parameter"),
    ("add_generation_prompt", False, "unsupported_parameter"),
    ("continue_final_message", True, "unsupported_parameter"),
    ("min_p", 0.1, "unsupported_parameter"),
    ("frobnicate", 1, "unknown_parameter"),
])
def test_other_extensions_and_unknown_fields_are_refused_by_name(edge: EdgeServer, path: str, base: dict[str, Any],
                                                                  name: str, value: Any, code: str) -> None:
    answer = httpx.post(edge.url + path, json={**base, name: value}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == (name, code) and f"'{name}'" in error["message"]


def test_harmless_openai_fields_are_accepted_on_chat(edge: EdgeServer) -> None:
    answer = httpx.post(edge.url + "/v1/chat/completions", timeout=60,
                        json={**CHAT, "user": "u1", "metadata": {"a": "b"}, "store": False, "service_tier": "auto"})
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("extra", [{"response_format": {"type": "json_object"}},
                                   {"tools": [{"type": "function", "function": {"name": "f"}}]}])
def test_grammar_with_another_constraint_is_refused(edge: EdgeServer, extra: dict[str, Any]) -> None:
    answer = httpx.post(edge.url + "/v1/chat/completions", json={**CHAT, "grammar": YES_NO, **extra}, timeout=60)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "grammar"


def test_a_broken_grammar_is_a_400_not_a_failure(edge: EdgeServer) -> None:
    answer = httpx.post(edge.url + "/v1/chat/completions", json={**CHAT, "grammar": "root ::= ("}, timeout=60)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


def test_the_prefill_pair_is_honoured_after_a_final_assistant_message(edge: EdgeServer) -> None:
    """How an edge asks an origin (which may be another EdgeLLM) to continue a partial answer."""
    messages = [*CHAT["messages"], {"role": "assistant", "content": "The answer is"}]
    answer = httpx.post(edge.url + "/v1/chat/completions", timeout=60,
                        json={**CHAT, "messages": messages, "continue_final_message": True, "add_generation_prompt": False})
    assert answer.status_code == 200, answer.text
    refused = httpx.post(edge.url + "/v1/chat/completions", timeout=60,
                         json={**CHAT, "messages": messages, "continue_final_message": False})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "continue_final_message"
