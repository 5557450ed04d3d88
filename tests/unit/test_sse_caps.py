"""The SSE decoder's caps: a line or an event past its cap is refused, not buffered without end."""

from __future__ import annotations

import pytest

from edgellm.sse import SSEDecoder, SSEFrameTooLarge


def test_a_line_without_newline_is_refused_past_the_cap() -> None:
    decoder = SSEDecoder(max_line=1000)
    assert list(decoder.feed(b"data: " + b"a" * 500)) == []
    with pytest.raises(SSEFrameTooLarge, match="line"):
        list(decoder.feed(b"a" * 600))


def test_an_event_of_many_lines_is_refused_past_the_cap() -> None:
    decoder = SSEDecoder(max_line=1000, max_event=2000)
    with pytest.raises(SSEFrameTooLarge, match="event"):
        list(decoder.feed(b"".join(b"data: " + b"b" * 900 + b"\n" for _ in range(3))))


def test_events_under_the_caps_split_anywhere_still_decode() -> None:
    stream = b"data: one\r\n\r\ndata: two\ndata: lines\n\n: ping\n\ndata: [DONE]\n\n"
    for size in (1, 2, 3, 7, len(stream)):
        decoder = SSEDecoder(max_line=20, max_event=40)
        out = [d for i in range(0, len(stream), size) for d in decoder.feed(stream[i:i + size])]
        assert out == ["one", "two\nlines", "[DONE]"]
