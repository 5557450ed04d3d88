"""The OpenAI Responses wire format: requests parsed into Workers AI terms, answers rendered as
a Response object or as the Responses event stream."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgellm.config import Config
from edgellm.errors import ErrorKind, GatewayError
from edgellm.generation import Finish, Token, Usage
from edgellm.inference import binding_error
from edgellm.ports import BindingError
from edgellm.responses_wire import ResponseMeta, parse_request, render_json, render_stream, response_object
from edgellm.sse import SSEDecoder
from tests.support.generations import scripted_generation

CONFIG = Config()


def parse(**body: Any):
    return parse_request({"input": "hi", **body}, CONFIG)


# --- parsing -----------------------------------------------------------------------------------


def test_a_string_input_is_one_user_message_with_the_edges_defaults() -> None:
    request = parse()
    assert request.input == ({"role": "user", "content": "hi"},)
    assert request.sampling == {"max_tokens": 256, "temperature": 0.6}
    assert (request.store, request.stream, request.previous_response_id) == (True, False, None)


def test_message_items_with_text_parts_and_developer_role() -> None:
    request = parse(input=[
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
        {"role": "user", "content": "d"},
    ], instructions="sys", max_output_tokens=9, temperature=0, top_p=0.5)
    assert request.input == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"},
                             {"role": "assistant", "content": "c"}, {"role": "user", "content": "d"})
    assert request.sampling == {"max_tokens": 9, "temperature": 0.0, "top_p": 0.5}
    generation = request.generation_request([{"role": "user", "content": "h"}, {"role": "assistant", "content": "i"}], "s1")
    assert generation.inputs["messages"][:3] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "h"}, {"role": "assistant", "content": "i"}]
    assert generation.session == "s1" and generation.inputs["max_tokens"] == 9


@pytest.mark.parametrize("body,param,code", [
    ({"tools": [{"type": "function", "name": "f"}]}, "tools", "unsupported_parameter"),
    ({"tool_choice": "required"}, "tool_choice", "unsupported_parameter"),
    ({"text": {"format": {"type": "xml"}}}, "text.format", "invalid_value"),
    ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format", "invalid_value"),  # no name
    ({"text": {"format": "json"}}, "text.format", "invalid_type"),
    ({"text": {"verbosity": "high"}}, "text", "unsupported_parameter"),
    ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported_parameter"),
    ({"background": True}, "background", "unsupported_parameter"),
    ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
    ({"frobnicate": 1}, "frobnicate", "unknown_parameter"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input[0].content[0]", "unsupported_content"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]", "unsupported_content"),
    ({"input": [{"type": "function_call_output", "call_id": "c", "output": "x"}]}, "input[0].type", "unsupported_item"),
    ({"input": ""}, "input", "invalid_value"),
    ({"input": []}, "input", "invalid_type"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "invalid_role"),
    ({"max_output_tokens": 0}, "max_output_tokens", "out_of_range"),
    ({"temperature": 9}, "temperature", "out_of_range"),
    ({"store": "yes"}, "store", "invalid_type"),
    ({"previous_response_id": ""}, "previous_response_id", "invalid_value"),
    ({"metadata": {"k": 1}}, "metadata", "invalid_value"),
])
def test_unsupported_or_bad_fields_are_a_400_naming_them(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(GatewayError) as info:
        parse(**body)
    assert (info.value.status, info.value.param, info.value.code) == (400, param, code)


def test_a_missing_input_is_a_400() -> None:
    with pytest.raises(GatewayError) as info:
        parse_request({"model": CONFIG.model}, CONFIG)
    assert (info.value.param, info.value.code) == ("input", "missing_required_parameter")


def test_fields_that_ask_for_plain_text_only_are_accepted() -> None:
    request = parse(tools=[], tool_choice="auto", parallel_tool_calls=True, text={"format": {"type": "text"}},
                    include=[], truncation="disabled", reasoning=None, background=False, user="u",
                    service_tier="auto", metadata={"a": "b"}, prompt_cache_key="k")
    assert request.metadata == {"a": "b"} and request.prompt_cache_key == "k"


# --- rendering ---------------------------------------------------------------------------------

META = ResponseMeta("resp_" + "a" * 48, 1_800_000_000, parse(max_output_tokens=2), message_id="msg_1")


async def test_json_is_a_response_object_stored_before_it_is_returned() -> None:
    stored: list[tuple[str, Finish]] = []

    async def on_complete(text: str, finish: Finish) -> None:
        stored.append((text, finish))

    generation = scripted_generation(Token("Hel"), Token("lo"), Finish("length", Usage(5, 2, 3)))
    data = await render_json(generation, META, on_complete)
    assert stored and stored[0][0] == "Hello"
    assert data["object"] == "response" and data["id"] == META.id and data["created_at"] == META.created_at
    assert data["status"] == "incomplete" and data["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["output"] == [{"id": "msg_1", "type": "message", "status": "incomplete", "role": "assistant",
                               "content": [{"type": "output_text", "text": "Hello", "annotations": [], "logprobs": []}]}]
    assert data["usage"] == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 3}, "output_tokens": 2,
                             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 7}
    assert data["max_output_tokens"] == 2 and data["store"] is True and data["tools"] == []


def decode(chunks: list[bytes], whole: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) pairs; every data's `type` must equal its event name."""
    events = []
    for block in b"".join(chunks).decode().split("\n\n"):
        if not block:
            continue
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        name, data = lines[0][7:], json.loads(lines[1][6:])
        assert data["type"] == name
        events.append((name, data))
    if whole:
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert list(SSEDecoder().feed(b"".join(chunks)))  # plain SSE decoders read it too
    return events


async def test_the_stream_has_the_responses_event_sequence() -> None:
    order: list[str] = []

    async def on_complete(text: str, finish: Finish) -> None:
        order.append("stored")

    generation = scripted_generation(Token("Hel"), Token("lo"), Finish("stop", Usage(5, 2)))
    chunks = []
    async for chunk in render_stream(generation, META, on_complete):
        chunks.append(chunk)
        order.append(decode([chunk], whole=False)[0][0])
    events = decode(chunks)
    assert [name for name, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed",
    ]
    assert order.index("stored") < order.index("response.completed")  # the next turn will find it
    by_name = dict(events)
    assert by_name["response.created"]["response"]["status"] == "in_progress"
    assert [d["delta"] for n, d in events if n == "response.output_text.delta"] == ["Hel", "lo"]
    assert by_name["response.output_text.done"]["text"] == "Hello"
    assert {d["item_id"] for n, d in events if "output_text" in n} == {"msg_1"}
    final = by_name["response.completed"]["response"]
    assert final["status"] == "completed" and final["output"][0]["content"][0]["text"] == "Hello"
    assert final["usage"]["input_tokens"] == 5 and final["usage"]["input_tokens_details"] == {"cached_tokens": 0}


async def test_a_length_stop_ends_with_response_incomplete() -> None:
    async def on_complete(text: str, finish: Finish) -> None:
        pass

    chunks = [c async for c in render_stream(scripted_generation(Token("a"), Finish("length", Usage(1, 1))), META, on_complete)]
    name, data = decode(chunks)[-1]
    assert name == "response.incomplete" and data["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


async def test_a_failure_mid_stream_is_an_error_event_and_nothing_is_stored() -> None:
    stored: list[str] = []

    async def on_complete(text: str, finish: Finish) -> None:
        stored.append(text)

    generation = scripted_generation(Token("a"), binding_error(BindingError("reset"), "m"))
    events = decode([c async for c in render_stream(generation, META, on_complete)])
    name, data = events[-1]
    # the binding's own text ("reset") stays in the edge's log; the event names the model
    assert name == "error" and data["code"] == "upstream_error" and "reset" not in data["message"] and "failed for m " in data["message"]
    assert "response.completed" not in [n for n, _ in events] and stored == []


def test_text_format_becomes_the_generations_response_format_and_is_echoed() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}
    request = parse(text={"format": fmt})
    inputs = request.generation_request([], None).inputs
    assert inputs["response_format"] == {"type": "json_schema", "json_schema": schema}  # Workers AI's shape
    meta = ResponseMeta("resp_x", 0, request)
    assert response_object(meta, "m", status="completed", text="{}")["text"] == {"format": fmt}
    assert parse(text={"format": {"type": "json_object"}}).generation_request([], None).inputs["response_format"] == {"type": "json_object"}
    plain = parse(text={"format": {"type": "text"}})
    assert "response_format" not in plain.generation_request([], None).inputs
    assert response_object(ResponseMeta("resp_y", 0, plain), "m", status="completed")["text"] == {"format": {"type": "text"}}


async def test_an_answer_cut_by_the_content_policy_is_incomplete_for_content_filter() -> None:
    async def on_complete(text: str, finish: Finish) -> None:
        pass

    data = await render_json(scripted_generation(Finish("content_filter", Usage(5, 0), cacheable=False)), META, on_complete)
    assert data["status"] == "incomplete" and data["incomplete_details"] == {"reason": "content_filter"}
    assert data["output"][0]["status"] == "incomplete"
    cut = scripted_generation(Token("a "), Finish("content_filter", Usage(5, 1), guardrails="flagged; categories=S2"),
                              GatewayError(ErrorKind.INVALID_REQUEST, "The answer was stopped.", code="content_filter"))
    events = decode([c async for c in render_stream(cut, META, on_complete)])
    names = [name for name, _ in events]
    assert names[-2:] == ["response.incomplete", "error"] and "response.completed" not in names
    final = dict(events)["response.incomplete"]
    assert final["response"]["status"] == "incomplete" and final["response"]["incomplete_details"] == {"reason": "content_filter"}
    assert final["edgellm_guardrails"] == "flagged; categories=S2" and events[-1][1]["code"] == "content_filter"


async def test_the_streams_final_event_carries_what_the_guardrails_did() -> None:
    async def on_complete(text: str, finish: Finish) -> None:
        pass

    flagged = scripted_generation(Token("a"), Finish("stop", Usage(1, 1), guardrails="masked; detectors=email"))
    name, data = decode([c async for c in render_stream(flagged, META, on_complete)])[-1]
    assert name == "response.completed" and data["edgellm_guardrails"] == "masked; detectors=email"
    plain = scripted_generation(Token("a"), Finish("stop", Usage(1, 1)))
    assert "edgellm_guardrails" not in decode([c async for c in render_stream(plain, META, on_complete)])[-1][1]
