"""A published manifest that is not what the edge can serve is a 502 in the edge's words
(`invalid_manifest`): Python's own text about it (a TypeError's) is the error's detail, which the
edge logs, never the Hub client's message."""

from __future__ import annotations

import json

import pytest

from edgellm.artifacts.hf import parse_snapshot
from edgellm.errors import GatewayError

SHA = "a" * 64


def manifest(**model: object) -> bytes:
    return json.dumps({"model": {"size": 4, "sha256": SHA, **model}, "shards": 7, "files": []}).encode()


def test_a_value_of_the_wrong_type_is_the_edges_words_and_pythons_text_is_the_detail() -> None:
    with pytest.raises(GatewayError) as info:
        parse_snapshot("tiny", manifest())  # "shards": 7, iterated: Python's "'int' object is not iterable"
    error = info.value
    assert (error.status, error.code) == (502, "invalid_manifest")
    assert "wrong type" in error.message and "not iterable" not in error.message and "TypeError" not in error.message
    assert "not iterable" in (error.detail or "")


def test_a_missing_field_is_named() -> None:
    with pytest.raises(GatewayError) as info:
        parse_snapshot("tiny", json.dumps({"model": {"size": 4, "sha256": SHA}}).encode())
    assert "'shards' is missing" in info.value.message
