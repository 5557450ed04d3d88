"""SSE framing: what the encoder writes, and a decoder that copes with how bytes arrive."""

from __future__ import annotations

import json
from typing import AsyncIterator

import pytest

from edgellm.sse import IncompleteStream, SSEDecoder, decode_events, encode_done, encode_event


@pytest.mark.parametrize(
    ("data", "wire"),
    [
        ({"response": "hi"}, b'data: {"response":"hi"}\n\n'),
        ({"response": "caf\u00e9 \u2603"}, 'data: {"response":"caf\u00e9 \u2603"}\n\n'.encode()),  # UTF-8, not \u escapes
        ({"response": "a\nb"}, b'data: {"response":"a\\nb"}\n\n'),  # a newline in text stays inside one data line
        ("[DONE]", b"data: [DONE]\n\n"),
    ],
)
def test_encode_event(data: object, wire: bytes) -> None:
    assert encode_event(data) == wire


def test_encode_done() -> None:
    assert encode_done() == b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("chunks", "events"),
    [
        ([b"data: a\n\n"], ["a"]),
        ([b"data: a\n\ndata: b\n\n"], ["a", "b"]),  # two events in one chunk
        ([b"da", b"ta: a", b"\n", b"\n"], ["a"]),  # one event split over chunks
        ([b"data: a\r\n\r\n"], ["a"]),  # CRLF line endings
        ([b"data: line1\ndata: line2\n\n"], ["line1\nline2"]),  # multi-line data
        ([b"data:no-space\n\n"], ["no-space"]),  # the space after the colon is optional
        ([b": comment\nevent: x\nid: 1\ndata: a\n\n"], ["a"]),  # other fields are ignored
        ([b"\n\n\n"], []),  # blank lines alone dispatch nothing
        (["data: \u00e9\n\n"], ["\u00e9"]),  # str chunks are accepted too
    ],
)
def test_decoder(chunks: list[bytes | str], events: list[str]) -> None:
    decoder = SSEDecoder()
    out = [e for chunk in chunks for e in decoder.feed(chunk)]
    out += list(decoder.flush())
    assert out == events


def test_decoder_flush_dispatches_an_unterminated_event() -> None:
    decoder = SSEDecoder()
    assert list(decoder.feed(b"data: a\n")) == []
    assert list(decoder.flush()) == ["a"]
    decoder = SSEDecoder()
    assert list(decoder.feed(b"data: b")) == []
    assert list(decoder.flush()) == ["b"]


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def test_decode_events_stops_at_done() -> None:
    wire = b"".join(encode_event({"response": t}) for t in ("a", "b")) + encode_done() + encode_event({"response": "late"})
    # split at every 7 bytes to cross event boundaries
    parts = [wire[i : i + 7] for i in range(0, len(wire), 7)]
    events = [e async for e in decode_events(_chunks(*parts))]
    assert events == [{"response": "a"}, {"response": "b"}]


async def test_decode_events_without_done_is_a_cut_stream() -> None:
    received = []
    with pytest.raises(IncompleteStream):
        async for event in decode_events(_chunks(b'data: {"response":"a"}\n\ndata: {"response":"b"}')):
            received.append(event)
    assert received == [{"response": "a"}, {"response": "b"}]  # what arrived, then the error


async def test_done_without_a_trailing_blank_line_still_ends_cleanly() -> None:
    events = [e async for e in decode_events(_chunks(b'data: {"response":"a"}\n\ndata: [DONE]'))]
    assert events == [{"response": "a"}]


async def test_encode_then_decode_round_trips() -> None:
    payloads = [{"response": s} for s in ("", " ", "\n\n", "data: x", "\u2603\U0001F600", '"quoted"')]
    wire = b"".join(encode_event(p) for p in payloads) + encode_done()
    events = [e async for e in decode_events(_chunks(*[bytes([b]) for b in wire]))]  # byte by byte
    assert events == payloads
    assert all(json.dumps(p) for p in events)


def test_decoder_survives_a_chunk_boundary_inside_a_utf8_character() -> None:
    wire = encode_event({"response": "\u65e5\u672c \U0001F600"})
    decoder = SSEDecoder()
    out = [e for i in range(len(wire)) for e in decoder.feed(wire[i : i + 1])]
    assert [json.loads(e) for e in out] == [{"response": "\u65e5\u672c \U0001F600"}]


def test_a_lone_surrogate_is_escaped_not_an_encoding_error() -> None:
    # JSON input may carry "\ud800"; echoing it (e.g. in an error) must not fail mid-response
    wire = encode_event({"error": {"message": "bad \ud800"}})
    assert wire == b'data: {"error":{"message":"bad \\ud800"}}\n\n'
    assert json.loads(wire[6:]) == {"error": {"message": "bad \ud800"}}
