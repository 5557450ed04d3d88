"""Range, If-Range and If-None-Match as pure functions (RFC 9110 sections 13 and 14)."""

from __future__ import annotations

import pytest

from edgellm.artifacts.conditional import (
    ByteRange, etag_listed, none_match, parse_content_range, parse_etags, parse_range, range_applies, range_header,
)
from edgellm.errors import GatewayError

SIZE = 1000

# (header, expected ByteRange or None = serve the whole 200)
RANGES = [
    (None, None),
    ("bytes=0-0", ByteRange(0, 0)),
    ("bytes=0-499", ByteRange(0, 499)),
    ("bytes=500-999", ByteRange(500, 999)),
    ("bytes=500-5000", ByteRange(500, 999)),  # last clipped to the end
    ("bytes=990-", ByteRange(990, 999)),
    ("bytes=0-", ByteRange(0, 999)),
    ("bytes=-10", ByteRange(990, 999)),
    ("bytes=-5000", ByteRange(0, 999)),  # suffix longer than the representation: all of it
    ("Bytes = 1-2", ByteRange(1, 2)),  # the unit is case-insensitive, whitespace allowed
    ("bytes=999-999", ByteRange(999, 999)),
    # ignored (malformed, another unit, several ranges): full 200
    ("bytes=5-1", None),
    ("bytes=-", None),
    ("bytes=", None),
    ("bytes=a-b", None),
    ("bytes=1-2-3", None),
    ("bytes 0-1", None),
    ("items=0-1", None),
    ("bytes=0-1,5-6", None),
    ("bytes=0-1, -1", None),
    ("bytes=+1-2", None),
    ("bytes=1.5-2", None),
    ("", None),
]


@pytest.mark.parametrize("header, expected", RANGES)
def test_parse_range(header: str | None, expected: ByteRange | None) -> None:
    assert parse_range(header, SIZE) == expected


@pytest.mark.parametrize("header, size", [
    ("bytes=1000-", 1000), ("bytes=1000-2000", 1000), ("bytes=5000-6000", 1000),
    ("bytes=-0", 1000), ("bytes=0-", 0), ("bytes=-5", 0), ("bytes=0-0", 0),
])
def test_unsatisfiable_ranges(header: str, size: int) -> None:
    with pytest.raises(GatewayError) as info:
        parse_range(header, size)
    assert info.value.status == 416
    assert info.value.headers == {"content-range": f"bytes */{size}"}


def test_byte_range_helpers() -> None:
    r = ByteRange(10, 19)
    assert r.length == 10
    assert r.content_range(100) == "bytes 10-19/100"


ETAG = '"abc"'

NONE_MATCH = [
    (None, False),
    ('"abc"', True),
    ('W/"abc"', True),  # If-None-Match uses the weak comparison
    ('"x", "abc"', True),
    ('"x" ,W/"abc"', True),
    ("*", True),
    ('"x"', False),
    ("abc", False),  # unquoted: malformed, so not a match
    ('"abc', False),
    ("", False),
]


@pytest.mark.parametrize("header, matches", NONE_MATCH)
def test_none_match(header: str | None, matches: bool) -> None:
    assert none_match(header, ETAG) is matches


def test_parse_etags() -> None:
    assert parse_etags('"a", W/"b"') == [(False, '"a"'), (True, '"b"')]
    assert parse_etags("*") == [(False, "*")]
    assert parse_etags('"a" junk') is None
    assert parse_etags(" ") is None
    assert parse_etags('abc, W/"b", c', bare=True) == [(False, '"abc"'), (True, '"b"'), (False, '"c"')]
    assert parse_etags("a b", bare=True) is None


@pytest.mark.parametrize(
    "header, listed",
    [("abc", True), ('"abc"', True), ("x, abc", True), ('W/abc', True), ("*", True), ("x", False), ("abcd", False), ("", False)],
)
def test_etag_listed_takes_bare_tags_as_r2_does(header: str, listed: bool) -> None:
    assert etag_listed(header, ETAG, bare=True) is listed


IF_RANGE = [
    (None, True),
    ('"abc"', True),
    (' "abc" ', True),
    ('"other"', False),
    ('W/"abc"', False),  # If-Range requires a strong match
    ("Wed, 21 Oct 2015 07:28:00 GMT", False),  # a date: nothing to compare it with, serve 200
    ("", False),
]


@pytest.mark.parametrize("header, applies", IF_RANGE)
def test_range_applies(header: str | None, applies: bool) -> None:
    assert range_applies(header, ETAG) is applies


@pytest.mark.parametrize(
    "offset, length, suffix, header",
    [(None, None, 5, "bytes=-5"), (10, None, None, "bytes=10-"), (10, 5, None, "bytes=10-14"), (None, 3, None, "bytes=0-2")],
)
def test_range_header_is_what_parse_range_reads_back(offset: int | None, length: int | None, suffix: int | None, header: str) -> None:
    assert range_header(offset, length, suffix) == header
    size = 100
    asked = parse_range(header, size)
    assert asked is not None
    first = size - suffix if suffix is not None else offset or 0
    assert (asked.first, asked.length) == (first, length or suffix or size - first)


def test_parse_content_range_reads_what_byte_range_writes() -> None:
    assert parse_content_range(ByteRange(10, 19).content_range(100)) == (10, 19, 100)
    assert parse_content_range(" bytes 5-9/* ") == (5, 9, None)
    assert parse_content_range("bytes */100") is None  # a 416 names no bytes
    assert parse_content_range("bytes 1-2/3 junk") is None and parse_content_range(None) is None
