"""The OpenAI wire format: requests parsed into Workers AI terms, answers rendered back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgellm.config import Config
from edgellm.errors import GatewayError
from edgellm.generation import Finish, Generation, Token, Usage
from edgellm.inference import binding_error
from edgellm.openai import parse_chat_request, parse_completion_request, render_chat_json, render_completion_json, render_stream
from edgellm.ports import BindingError
from edgellm.sse import SSEDecoder
from tests.support.generations import scripted_generation

CONFIG = Config()
USER = [{"role": "user", "content": "hi"}]


def chat(**body: Any) -> dict[str, Any]:
    return {"messages": USER, **body}


# --- parsing -----------------------------------------------------------------------------------


def test_defaults_are_those_of_workers_ai() -> None:
    request = parse_chat_request(chat(), CONFIG)
    assert request.model == CONFIG.model
    assert request.inputs == {"messages": USER, "max_tokens": 256, "temperature": 0.6}
    assert (request.stream, request.include_usage, request.stop) == (False, False, ())


def test_sampling_parameters_map_to_workers_ai_inputs() -> None:
    body = chat(max_tokens=64, temperature=0, top_p=0.9, top_k=40, seed=7, repetition_penalty=1.1,
                frequency_penalty=0.5, presence_penalty=-0.5, model=CONFIG.fallback_models[0])
    request = parse_chat_request(body, CONFIG)
    assert request.model == CONFIG.fallback_models[0]
    assert request.inputs == {
        "messages": USER, "max_tokens": 64, "temperature": 0.0, "top_p": 0.9, "top_k": 40, "seed": 7,
        "repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": -0.5,
    }


def test_equal_requests_spelled_differently_give_equal_inputs() -> None:
    """Defaults applied once: the binding and the cache key see one canonical request."""
    a = parse_chat_request(chat(), CONFIG)
    b = parse_chat_request(chat(temperature=0.6, max_tokens=256, model=CONFIG.model, n=1, stream=False), CONFIG)
    assert a.inputs == b.inputs and a.model == b.model


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "developer", "content": "be brief"}], [{"role": "system", "content": "be brief"}]),
        ([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], [{"role": "user", "content": "ab"}]),
        ([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
         [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]),
        ([{"role": "user", "content": "", "name": "ignored"}], [{"role": "user", "content": ""}]),
    ],
)
def test_messages(messages: list[dict[str, Any]], expected: list[dict[str, str]]) -> None:
    assert parse_chat_request({"messages": messages}, CONFIG).inputs["messages"] == expected


def test_max_completion_tokens_is_max_tokens() -> None:
    assert parse_chat_request(chat(max_completion_tokens=12), CONFIG).inputs["max_tokens"] == 12


@pytest.mark.parametrize(
    ("stop", "parsed"),
    [(None, ()), ("\n", ("\n",)), (["a", "bc"], ("a", "bc")), (["1", "2", "3", "4"], ("1", "2", "3", "4"))],
)
def test_stop(stop: Any, parsed: tuple[str, ...]) -> None:
    assert parse_chat_request(chat(stop=stop), CONFIG).stop == parsed


@pytest.mark.parametrize(
    ("body", "stream", "include_usage"),
    [
        (chat(stream=True), True, False),
        (chat(stream=True, stream_options={"include_usage": True}), True, True),
        (chat(stream=False, stream_options={"include_usage": False}), False, False),
    ],
)
def test_stream_flags(body: dict[str, Any], stream: bool, include_usage: bool) -> None:
    request = parse_chat_request(body, CONFIG)
    assert (request.stream, request.include_usage) == (stream, include_usage)
    assert "stream" not in request.inputs  # the binding call decides, not the inputs


@pytest.mark.parametrize(
    ("body", "param", "status"),
    [
        ([], None, 400),
        ("text", None, 400),
        ({}, "messages", 400),
        (chat(model=3), "model", 400),
        (chat(model="@cf/nope"), "model", 404),
        ({"messages": "hi"}, "messages", 400),
        ({"messages": []}, "messages", 400),
        ({"messages": ["hi"]}, "messages[0]", 400),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", 400),  # a tool result names its call
        ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls", 400),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f"}}]}]},
         "messages[0].tool_calls[0]", 400),
        (chat(response_format={"type": "sound"}), "response_format", 400),
        (chat(response_format="json"), "response_format", 400),
        (chat(response_format={"type": "json_schema", "json_schema": {"schema": {}}}), "response_format", 400),
        (chat(tools="f"), "tools", 400),
        (chat(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0]", 400),
        (chat(tool_choice="required"), "tool_choice", 400),
        (chat(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}}),
         "tool_choice", 400),
        (chat(parallel_tool_calls=False), "parallel_tool_calls", 400),
        (chat(top_logprobs=2), "top_logprobs", 400),
        (chat(logprobs=True, top_logprobs=21), "top_logprobs", 400),
        (chat(logprobs=True, stop="x"), "logprobs", 400),
        (chat(functions=[{"name": "f"}]), "functions", 400),
        ({"messages": [{"content": "x"}]}, "messages[0].role", 400),
        ({"messages": [USER[0], {"role": "user", "content": 1}]}, "messages[1].content", 400),
        ({"messages": [{"role": "user"}]}, "messages[0].content", 400),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]", 400),
        (chat(n=2), "n", 400),
        (chat(stop=""), "stop", 400),
        (chat(stop=[1]), "stop", 400),
        (chat(stop=["a", "b", "c", "d", "e"]), "stop", 400),
        (chat(stream="yes"), "stream", 400),
        (chat(stream_options=True), "stream_options", 400),
        (chat(stream=True, stream_options={"include_usage": "yes"}), "include_usage", 400),
        (chat(max_tokens=0), "max_tokens", 400),
        (chat(max_tokens=1.5), "max_tokens", 400),
        (chat(max_completion_tokens=-1), "max_completion_tokens", 400),
        (chat(temperature=5.01), "temperature", 400),
        (chat(temperature=True), "temperature", 400),
        (chat(seed=0), "seed", 400),
        (chat(raw="no"), "raw", 400),
        (chat(lora=""), "lora", 400),
    ],
)
def test_chat_rejects(body: Any, param: str | None, status: int) -> None:
    with pytest.raises(GatewayError) as info:
        parse_chat_request(body, CONFIG)
    assert info.value.status == status
    assert info.value.param == param
    if param:
        assert param.split(".")[-1].split("[")[0] in info.value.message


def test_completion_continues_the_prompt_raw() -> None:
    request = parse_completion_request({"prompt": "Once upon", "max_tokens": 8}, CONFIG)
    assert request.inputs == {"prompt": "Once upon", "max_tokens": 8, "temperature": 0.6, "raw": True}
    assert parse_completion_request({"prompt": ["Once"]}, CONFIG).inputs["prompt"] == "Once"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "missing_required_parameter"),
        ({"prompt": 1}, "invalid_type"),
        ({"prompt": ["a", "b"]}, "invalid_type"),  # batches are not supported
        ({"prompt": ""}, "invalid_value"),
    ],
)
def test_completion_rejects(body: dict[str, Any], code: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse_completion_request(body, CONFIG)
    assert (info.value.status, info.value.param, info.value.code) == (400, "prompt", code)


# --- rendering ---------------------------------------------------------------------------------


generation = scripted_generation


FINISH = Finish("length", Usage(4, 2))


async def test_chat_json() -> None:
    data = await render_chat_json(generation(Token("Hel"), Token("lo"), FINISH), 1700000000)
    assert data["id"].startswith("chatcmpl-")
    assert data["object"] == "chat.completion"
    assert data["created"] == 1700000000
    assert data["model"] == "@cf/meta/llama-2-7b-chat-int8"
    assert data["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "logprobs": None, "finish_reason": "length"}]
    assert data["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}


async def test_completion_json() -> None:
    data = await render_completion_json(generation(Token("Hel"), Token("lo"), FINISH), 1)
    assert data["id"].startswith("cmpl-") and data["object"] == "text_completion"
    assert data["choices"] == [{"index": 0, "text": "Hello", "logprobs": None, "finish_reason": "length"}]
    assert data["usage"]["total_tokens"] == 6


async def test_ids_are_unique() -> None:
    ids = {(await render_chat_json(generation(FINISH), 1))["id"] for _ in range(20)}
    assert len(ids) == 20


async def _stream(gen: Generation, *, chat: bool, include_usage: bool) -> tuple[list[bytes], list[Any]]:
    chunks = [c async for c in render_stream(gen, 5, chat=chat, include_usage=include_usage)]
    decoder = SSEDecoder()
    payloads = [p for c in chunks for p in decoder.feed(c)]
    return chunks, [p if p == "[DONE]" else json.loads(p) for p in payloads]


async def test_chat_stream_is_one_chunk_per_token_then_done() -> None:
    chunks, events = await _stream(generation(Token("Hel"), Token("lo"), FINISH), chat=True, include_usage=False)
    assert len(chunks) == len(events) == 5  # each event is its own body chunk: flushed token by token
    assert events[-1] == "[DONE]"
    data = events[:-1]
    assert {e["object"] for e in data} == {"chat.completion.chunk"}
    assert len({e["id"] for e in data}) == 1 and {e["created"] for e in data} == {5}
    assert [e["choices"][0]["delta"] for e in data] == [{"role": "assistant", "content": ""}, {"content": "Hel"}, {"content": "lo"}, {}]
    assert [e["choices"][0]["finish_reason"] for e in data] == [None, None, None, "length"]
    assert all("usage" not in e for e in data)


async def test_chat_stream_with_include_usage_ends_with_a_usage_chunk() -> None:
    _, events = await _stream(generation(Token("Hi"), FINISH), chat=True, include_usage=True)
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    assert all(e["usage"] is None for e in events[:-2])  # OpenAI sends null usage until the end


async def test_completion_stream() -> None:
    _, events = await _stream(generation(Token("a"), Token("b"), FINISH), chat=False, include_usage=True)
    assert events[-1] == "[DONE]"
    assert {e["object"] for e in events[:-1]} == {"text_completion"}
    assert [e["choices"][0]["text"] for e in events[:-2]] == ["a", "b", ""]
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    assert events[-2]["usage"]["total_tokens"] == 6


async def test_a_failure_mid_stream_is_an_error_event_without_done() -> None:
    failure = binding_error(BindingError("connection reset"), "m")
    _, events = await _stream(generation(Token("a"), failure), chat=True, include_usage=False)
    assert "[DONE]" not in events
    assert events[-1]["error"]["type"] == "upstream_error"
    assert "connection reset" not in events[-1]["error"]["message"] and events[-1]["error"]["message"]  # the binding's text stays in the log
    assert events[1]["choices"][0]["delta"] == {"content": "a"}
