"""The nesting depth of a body is bounded BEFORE parsing, by a scan of its raw bytes.

On workerd, `json.loads` of a body ~5000 deep kills the isolate (a WebAssembly stack overflow,
no RecursionError: workers-runtime.md), so a parse that merely catches RecursionError is not
enough: the body must never reach `json.loads`.
"""

from __future__ import annotations

import json

import pytest

from edgellm.errors import GatewayError
from edgellm.http import Request
from edgellm import validation
from edgellm.validation import MAX_JSON_DEPTH, json_depth, json_too_deep, read_json


def nested(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


@pytest.mark.parametrize("data,depth", [
    (b"{}", 1), (b"[1, 2]", 1), (b'{"a": [{"b": []}]}', 4), (b'"[[[["', 0),
    (b'{"a": "[[[[\\"]]{{"}', 1),  # brackets and an escaped quote inside a string are text
    (b'["\\\\", [[]]]', 3),  # an escaped backslash ends before the closing quote
    (b'["abc', 1), (b'["\\', 1),  # an unterminated string runs to the end, as json.loads reads it
    (nested(300), 300), (b"]]]][[", 0),  # json.loads stops at the first stray closer
])
def test_depth_is_found_without_parsing(data: bytes, depth: int) -> None:
    assert json_depth(data) == depth


def test_utf16_bodies_are_scanned_as_json_loads_reads_them() -> None:
    body = json.dumps({"a": [[[]]]}).encode("utf-16")
    assert json_depth(body) == 4 and json.loads(body) == {"a": [[[]]]}


def test_the_limit_is_exact() -> None:
    assert not json_too_deep(nested(MAX_JSON_DEPTH)) and json_too_deep(nested(MAX_JSON_DEPTH + 1))
    # brackets inside strings never count, however many
    assert not json_too_deep(json.dumps({"content": "[" * 10_000}).encode())


def body_request(data: bytes) -> Request:
    return Request("POST", "https://edge.example/v1/chat/completions", {"content-type": "application/json"}, data)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 5000, 100_000])
def test_a_body_nested_too_deep_never_reaches_json_loads(depth: int, monkeypatch: pytest.MonkeyPatch) -> None:
    parsed: list[bytes] = []
    monkeypatch.setattr(validation.json, "loads", lambda data, **kw: parsed.append(data))
    with pytest.raises(GatewayError) as info:
        read_json(body_request(b'{"messages": ' + nested(depth - 1) + b"}"), 4 * 1024 * 1024)
    error = info.value
    assert error.status == 400 and error.code == "json_too_deep" and str(MAX_JSON_DEPTH) in error.message
    assert parsed == []


def test_a_body_at_the_limit_is_parsed() -> None:
    body = b'{"messages": ' + nested(MAX_JSON_DEPTH - 1) + b"}"
    assert read_json(body_request(body), 4 * 1024 * 1024)["messages"]
