"""Unmasking an answer for its caller (`unmask_answer`): the streaming unmasker puts back only
this request's placeholders, wherever the stream cuts them, holding back at most a placeholder's
length; the events step owns its source (closable before its first step) and unmasks tool-call
arguments as JSON string content."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgellm.generation import Event, Finish, Token, ToolCallDelta, Usage
from edgellm.guardrails.unmask import Unmasker, remasked, unmasked_answer

MAP = {"[EMAIL_1]": "jane.doe@example.com", "[PAYMENT_CARD_1]": "4111 1111 1111 1111", "[EMAIL_2]": "bob@example.org"}
MASKED = "Write to [EMAIL_1] and [EMAIL_2]; card [PAYMENT_CARD_1] is on file. [EMAIL_3] [x] [EMAIL_1"
PLAIN = ("Write to jane.doe@example.com and bob@example.org; card 4111 1111 1111 1111 is on file. "
         "[EMAIL_3] [x] [EMAIL_1")


def test_a_whole_text_gets_the_values_back_and_nothing_else():
    unmasker = Unmasker(MAP)
    assert unmasker.feed(MASKED) + unmasker.close() == PLAIN


@pytest.mark.parametrize("cut", range(len(MASKED) + 1))
def test_a_placeholder_cut_at_any_offset_is_put_back_whole(cut):
    unmasker = Unmasker(MAP)
    out = unmasker.feed(MASKED[:cut]) + unmasker.feed(MASKED[cut:]) + unmasker.close()
    assert out == PLAIN


def test_a_stream_one_character_at_a_time_is_unmasked_and_the_hold_is_bounded():
    unmasker = Unmasker(MAP)
    longest = max(map(len, MAP))
    out = []
    for char in MASKED:
        out.append(unmasker.feed(char))
        assert unmasker.held < longest  # never more than a placeholder's proper prefix
    out.append(unmasker.close())
    assert "".join(out) == PLAIN
    assert unmasker.held == 0


def test_text_that_cannot_be_a_placeholder_is_released_at_once():
    unmasker = Unmasker(MAP)
    assert unmasker.feed("see [x] and [EM") == "see [x] and "
    assert unmasker.feed("PTY]") == "[EMPTY]"  # the prefix stopped matching: released as it was
    assert unmasker.feed("[EMAIL_3]") == "[EMAIL_3]"  # a placeholder the model made up, not this request's
    assert unmasker.feed("[EMAIL_") == "" and unmasker.close() == "[EMAIL_"  # the end releases a partial one as is


def test_no_map_is_the_text_itself():
    unmasker = Unmasker({})
    assert unmasker.feed("[EMAIL_1]") == "[EMAIL_1]" and unmasker.held == 0


def test_remasking_gives_the_masked_text_back():
    assert remasked(PLAIN, MAP) == MASKED


class Source:
    """An event source that says whether it was closed."""

    def __init__(self, items: list[Event]) -> None:
        self.items, self.closed = list(items), False

    def __aiter__(self) -> "Source":
        return self

    async def __anext__(self) -> Event:
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    async def aclose(self) -> None:
        self.closed = True


async def collect(stream: Any) -> list[Event]:
    return [event async for event in stream]


async def test_the_events_step_unmasks_tokens_split_across_events_and_flushes_before_finish():
    finish = Finish("stop", Usage(3, 4))
    tokens = ["Mail [EM", "AIL", "_1] now [EMAIL_", "1"]
    out = await collect(unmasked_answer(Source([*(Token(t) for t in tokens), finish]), MAP))
    assert out[-1] == finish
    assert "".join(e.text for e in out if isinstance(e, Token)) == "Mail jane.doe@example.com now [EMAIL_1"
    assert all(e.text for e in out if isinstance(e, Token))  # no empty token events


async def test_tool_call_arguments_are_unmasked_as_json_string_content():
    secret_map = {"[SECRET_1]": 'pa"ss\\word', "[EMAIL_1]": "jane.doe@example.com"}
    deltas = [ToolCallDelta(0, id="call_1", name="send", arguments='{"to": "[EMA'),
              ToolCallDelta(0, arguments='IL_1]", "pw": "[SECRET_1]"}'),
              ToolCallDelta(1, id="call_2", name="noop", arguments="{}")]
    out = await collect(unmasked_answer(Source([Token("ok [EMAIL_"), *deltas, Finish("tool_calls", Usage())]), secret_map))
    text = "".join(e.text for e in out if isinstance(e, Token))
    assert text == "ok [EMAIL_"  # a text prefix cut off by a tool call is released as it was
    first = [e for e in out if isinstance(e, ToolCallDelta) and e.index == 0]
    assert first[0].id == "call_1" and first[0].name == "send"  # the call's head goes out even while its arguments are held
    arguments = json.loads("".join(e.arguments for e in first))
    assert arguments == {"to": "jane.doe@example.com", "pw": 'pa"ss\\word'}
    assert isinstance(out[-1], Finish)


async def test_the_events_step_closes_its_source_when_closed_before_its_first_step():
    source = Source([Token("[EMAIL_1]"), Finish("stop", Usage())])
    stream = unmasked_answer(source, MAP)
    await stream.aclose()
    assert source.closed
