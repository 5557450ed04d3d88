"""Refusals a newcomer reads in their first hour say what was wrong in the caller's terms: the
field they sent (not the one the gateway maps it to), a JSON type by its JSON name, one sentence
with one stop, and where a refused feature does work."""

from __future__ import annotations

from typing import Any

import pytest

from edgellm.config import Config
from edgellm.errors import GatewayError, binding_error
from edgellm.openai import parse_chat_request
from edgellm.ports import CapacityExceeded, with_public
from edgellm.responses_wire import parse_request

CONFIG = Config()
MESSAGES = [{"role": "user", "content": "hi"}]


def refusal(parse: Any, body: dict[str, Any]) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        parse(body, CONFIG)
    return caught.value


@pytest.mark.parametrize("value", [0, 10**9, "12", True])
def test_max_completion_tokens_is_refused_under_its_own_name(value: Any) -> None:
    error = refusal(parse_chat_request, {"messages": MESSAGES, "max_completion_tokens": value})
    assert error.param == "max_completion_tokens"
    assert "'max_completion_tokens'" in error.message and "max_tokens'" not in error.message.replace("max_completion_tokens", "")


@pytest.mark.parametrize(("field", "value", "said"), [
    ("max_tokens", True, "must be an integer, got a boolean (true)."),
    ("temperature", False, "must be a number, got a boolean (false)."),
    ("temperature", "0.5", "must be a number, got a string ('0.5')."),
    ("top_k", [3], "must be an integer, got an array."),
    ("stream", "yes", "must be a boolean, got a string ('yes')."),
])
def test_a_wrong_json_type_is_named_in_json_terms(field: str, value: Any, said: str) -> None:
    error = refusal(parse_chat_request, {"messages": MESSAGES, field: value})
    assert error.message == f"'{field}' {said}"
    assert "True" not in error.message and "False" not in error.message


@pytest.mark.parametrize("field", ["tools", "tool_choice", "max_tool_calls"])
def test_responses_tools_say_chat_completions_takes_them(field: str) -> None:
    value = {"tools": [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}],
             "tool_choice": "required", "max_tool_calls": 2}[field]
    error = refusal(parse_request, {"input": "What time is it?", field: value})
    assert error.param == field and error.code == "unsupported_parameter"
    assert "POST /v1/chat/completions" in error.message and "tools" in error.message
    assert "text generation only" not in error.message


@pytest.mark.parametrize("public", ["3040: the local model server is stopping; try again later.", "busy;", "busy"])
def test_a_bindings_sentence_inside_the_edges_has_one_stop(public: str) -> None:
    error = binding_error(with_public(CapacityExceeded("llama.cpp said no"), public), "the AI binding", "ai")
    assert ".;" not in error.message and ";;" not in error.message and ".." not in error.message
    assert error.message.endswith("; retry shortly.")
