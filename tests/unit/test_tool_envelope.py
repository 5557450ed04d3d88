"""The local binding's tool-call envelope (`{"tool_calls": [...]}` / `{"response": ...}`) is its
own wire format with llama.cpp: whatever point max_tokens cuts it at, what comes out is a
partial tool call or answer text, never the envelope; after tool results the answer path is
plain text."""

from __future__ import annotations


import pytest

from edgellm_local.llama import grammar as structured
from edgellm_local.llama.grammar import ToolPlan, ToolCallStream

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
CALL = '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}'
ANSWER = '{"response": "It is sunny in Paris \\u00e9t\\u00e9."}'


def leaks(text: str | None) -> bool:
    return text is not None and any(k in text for k in ('"tool_calls"', '"response"', '{"name"'))


@pytest.mark.parametrize("cut", range(0, len(CALL) + 1))
def test_a_call_cut_anywhere_is_a_partial_call_never_text(cut: int) -> None:
    plan = ToolPlan([WEATHER, TIME])
    text, calls = plan.parse(CALL[:cut])
    assert not leaks(text)
    if cut >= len('{"t'):  # from here the envelope says it is a call
        assert text is None and len(calls) == 1
        function = calls[0]["function"]
        assert calls[0]["id"].startswith("call_") and function["name"] in ("get_weather", "get_time")
        assert '{"city": "Paris"}'.startswith(function["arguments"])  # arguments as far as generated
    else:
        assert calls == [] and text == ""


def test_a_cut_name_is_completed_from_the_tool_it_begins() -> None:
    _, calls = ToolPlan([WEATHER, TIME]).parse('{"tool_calls": [{"name": "get_t')
    assert calls[0]["function"]["name"] == "get_time"


@pytest.mark.parametrize("cut", range(0, len(ANSWER) + 1))
def test_an_answer_cut_anywhere_is_its_text_so_far(cut: int) -> None:
    text, calls = ToolPlan([WEATHER]).parse(ANSWER[:cut])
    assert calls == [] and not leaks(text)
    assert "It is sunny in Paris été.".startswith(text or "")


def test_the_stream_scanner_and_the_parser_agree_on_a_cut_call() -> None:
    cut = CALL[:-12]
    scanner = ToolCallStream()
    streamed = "".join(f["function"].get("arguments", "") for f in scanner.feed(cut))
    _, calls = ToolPlan([WEATHER]).parse(cut)
    assert calls[0]["function"]["arguments"] == streamed


def test_past_calls_and_results_are_rendered_as_plain_text_not_the_envelope() -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 21}'}]
    rendered = structured.history(messages)
    assert [m["role"] for m in rendered] == ["user", "assistant", "user"]
    assert not any(leaks(m["content"]) or "tool_response" in m["content"] for m in rendered)
    assert "get_weather" in rendered[1]["content"] and '{"temperature": 21}' in rendered[2]["content"]


def test_after_tool_results_auto_offers_the_answer_path_unconstrained() -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "21 C"}]
    body = {"messages": list(messages)}
    plan = structured.apply({"messages": messages, "tools": [WEATHER]}, body)
    assert plan is not None and plan.free_answer
    assert "response_format" not in body  # plain text: no grammar forces another call
    assert plan.parse("It is 21 C in Paris.") == ("It is 21 C in Paris.", [])
    text, calls = plan.parse(CALL)  # a further call it chose to write is still read as one
    assert text is None and calls[0]["function"]["name"] == "get_weather"
    forced = {"messages": list(messages)}
    assert not structured.apply({"messages": messages, "tools": [WEATHER], "tool_choice": "required"}, forced).free_answer
    assert "response_format" in forced  # a forced call stays grammar-constrained


def test_a_free_answer_that_is_json_but_no_envelope_is_text() -> None:
    plan = ToolPlan([WEATHER], after_results=True)
    assert plan.parse('{"temperature": 21}') == ('{"temperature": 21}', [])
    assert plan.parse('{"response": "Sunny."}') == ("Sunny.", [])


@pytest.mark.parametrize("fenced", ["```", "```json", "```json\n" + CALL[:20], "```json\n" + CALL + "\n```"])
def test_a_code_fence_around_the_envelope_is_not_text(fenced: str) -> None:
    text, calls = ToolPlan([WEATHER]).parse(fenced)
    assert not leaks(text) and "```" not in (text or "")
    assert bool(calls) == ("tool_calls" in fenced)
