"""The Workers AI wire format: the input schema's ranges and defaults, the REST envelope and the
SSE stream of `{"response": token}` events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgellm.config import Config
from edgellm.errors import GatewayError
from edgellm.generation import Finish, Generation, Token, Usage
from edgellm.inference import binding_error
from edgellm.ports import BindingError
from edgellm.sse import SSEDecoder
from edgellm.workers_ai import render_json, render_stream, result_envelope, validate_inputs, validate_sampling
from tests.support.generations import scripted_generation

CONFIG = Config()
MESSAGES = [{"role": "user", "content": "hi"}]


def test_prompt_input_with_defaults() -> None:
    inputs, stream = validate_inputs({"prompt": "hi"}, CONFIG)
    assert inputs == {"prompt": "hi", "max_tokens": 256, "temperature": 0.6}
    assert stream is False


def test_messages_input_with_every_option() -> None:
    body = {"messages": MESSAGES, "stream": True, "raw": False, "lora": "my-adapter", "max_tokens": 10,
            "temperature": 0, "top_p": 1, "top_k": 1, "seed": 9_999_999_999, "repetition_penalty": 2,
            "frequency_penalty": 0, "presence_penalty": 0}
    inputs, stream = validate_inputs(body, CONFIG)
    assert stream is True
    assert "stream" not in inputs
    assert inputs == {**{k: v for k, v in body.items() if k != "stream"}, "temperature": 0.0, "top_p": 1.0,
                      "repetition_penalty": 2.0, "frequency_penalty": 0.0, "presence_penalty": 0.0}


# (parameter, accepted edge values, rejected values): the schema's ranges, both ends.
RANGES = [
    ("temperature", [0, 5, 0.6], [-0.01, 5.01]),
    ("top_k", [1, 50], [0, 51]),
    ("seed", [1, 9_999_999_999], [0, 10_000_000_000, -1]),
    ("top_p", [0, 2, 0.5], [-0.1, 2.1]),
    ("repetition_penalty", [0, 2], [-0.1, 2.1]),
    ("frequency_penalty", [-2, 2], [-2.1, 2.1]),
    ("presence_penalty", [-2, 2], [-2.1, 2.1]),
    ("max_tokens", [1, CONFIG.context_window], [0, -5, CONFIG.context_window + 1]),
]


@pytest.mark.parametrize(("name", "accepted", "rejected"), RANGES, ids=[r[0] for r in RANGES])
def test_ranges(name: str, accepted: list[float], rejected: list[float]) -> None:
    for value in accepted:
        assert validate_sampling({name: value}, CONFIG)[name] == value
    for value in rejected:
        with pytest.raises(GatewayError) as info:
            validate_sampling({name: value}, CONFIG)
        assert (info.value.status, info.value.param, info.value.code) == (400, name, "out_of_range")
        assert name in info.value.message and str(value) in info.value.message


@pytest.mark.parametrize("name", ["temperature", "top_p", "top_k", "seed", "repetition_penalty", "frequency_penalty", "presence_penalty", "max_tokens"])
@pytest.mark.parametrize("value", ["1", True, [1], {"v": 1}, float("nan"), float("inf")])
def test_wrong_types(name: str, value: Any) -> None:
    with pytest.raises(GatewayError) as info:
        validate_sampling({name: value}, CONFIG)
    assert info.value.status == 400 and info.value.param == name


@pytest.mark.parametrize(("name", "value"), [("top_k", 2.5), ("seed", 1.5), ("max_tokens", 10.1)])
def test_integers_must_be_whole(name: str, value: float) -> None:
    with pytest.raises(GatewayError) as info:
        validate_sampling({name: value}, CONFIG)
    assert info.value.code == "invalid_type"
    assert validate_sampling({name: 3.0}, CONFIG)[name] == 3  # 3.0 is a whole number on the wire


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ([], None),
        ({}, "messages"),
        ({"prompt": "a", "messages": MESSAGES}, "prompt"),  # exactly one of the two
        ({"prompt": ""}, "prompt"),
        ({"prompt": 1}, "prompt"),
        ({"messages": []}, "messages"),
        ({"messages": {"role": "user"}}, "messages"),
        ({"messages": [{"role": "developer", "content": "x"}]}, "messages[0].role"),  # no OpenAI aliases here
        ({"messages": [{"role": "user", "content": ["parts"]}]}, "messages[0].content"),
        ({"messages": MESSAGES, "stream": "true"}, "stream"),
        ({"messages": MESSAGES, "raw": 1}, "raw"),
        ({"messages": MESSAGES, "lora": 3}, "lora"),
    ],
)
def test_rejects(body: Any, param: str | None) -> None:
    with pytest.raises(GatewayError) as info:
        validate_inputs(body, CONFIG)
    assert info.value.status == 400
    assert info.value.param == param


def test_max_tokens_bound_follows_the_configured_context_window() -> None:
    small = Config(context_window=100)
    assert validate_sampling({"max_tokens": 100}, small)["max_tokens"] == 100
    with pytest.raises(GatewayError):
        validate_sampling({"max_tokens": 101}, small)


# --- rendering ---------------------------------------------------------------------------------


generation = scripted_generation


def test_envelope() -> None:
    assert result_envelope({"response": "x"}) == {"result": {"response": "x"}, "success": True, "errors": [], "messages": []}
    failed = result_envelope(None, success=False, errors=[{"code": 400, "message": "bad"}])
    assert failed == {"result": None, "success": False, "errors": [{"code": 400, "message": "bad"}], "messages": []}


async def test_render_json() -> None:
    data = await render_json(generation(Token("Hel"), Token("lo"), Finish("stop", Usage(3, 2))))
    assert data == result_envelope({"response": "Hello", "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})


async def _stream(gen: Generation) -> tuple[list[bytes], list[Any]]:
    chunks = [c async for c in render_stream(gen)]
    decoder = SSEDecoder()
    payloads = [p for c in chunks for p in decoder.feed(c)]
    return chunks, [p if p == "[DONE]" else json.loads(p) for p in payloads]


async def test_render_stream_is_one_event_per_token_then_usage_then_done() -> None:
    chunks, events = await _stream(generation(Token("Hel"), Token(""), Token("lo"), Finish("stop", Usage(3, 2))))
    assert events == [
        {"response": "Hel"},
        {"response": "lo"},  # empty tokens are not sent
        {"response": "", "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}},
        "[DONE]",
    ]
    assert len(chunks) == 4


async def test_render_stream_failure_is_an_error_event_without_done() -> None:
    _, events = await _stream(generation(Token("a"), binding_error(BindingError("boom"), "m")))
    assert events[0] == {"response": "a"}
    assert events[-1]["error"]["type"] == "upstream_error"
    assert "[DONE]" not in events


@pytest.mark.parametrize(
    "options", [{}, {"raw": True}, {"raw": False, "lora": "adapter"}, {"raw": "no"}, {"raw": 1}, {"lora": ""}, {"lora": 3}]
)
def test_both_wire_formats_read_raw_and_lora_alike(options: dict[str, Any]) -> None:
    """`raw` and `lora` are Workers AI options the OpenAI routes accept as extensions: one parser."""
    from edgellm.openai import parse_chat_request

    def outcome(parse: Any) -> Any:
        try:
            inputs = parse()
        except GatewayError as exc:
            return exc.status, exc.param
        return {k: inputs[k] for k in ("raw", "lora") if k in inputs}

    workers = outcome(lambda: validate_inputs({"messages": MESSAGES, **options}, CONFIG)[0])
    openai = outcome(lambda: parse_chat_request({"messages": MESSAGES, **options}, CONFIG).inputs)
    assert workers == openai
    assert workers == options if isinstance(workers, dict) else workers[0] == 400


async def test_render_stream_final_event_carries_what_the_guardrails_did() -> None:
    _, events = await _stream(generation(Token("a"), Finish("stop", Usage(1, 1), guardrails="flagged; categories=S2")))
    assert events[-2]["edgellm_guardrails"] == "flagged; categories=S2" and events[-1] == "[DONE]"
    _, events = await _stream(generation(Token("a"), Finish("stop", Usage(1, 1))))
    assert "edgellm_guardrails" not in events[-2]
