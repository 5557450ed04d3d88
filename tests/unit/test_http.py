"""The request vocabulary: the path stays raw, the query is decoded once, in `Request.query`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from edgellm.errors import ErrorKind
from edgellm.http import Request

SRC = Path(__file__).resolve().parents[2] / "src" / "edgellm"
LOCAL = Path(__file__).resolve().parents[2] / "local" / "edgellm_local"  # its HTTP server's refusals (431)


@pytest.mark.parametrize(
    ("url", "query"),
    [
        ("http://edge/admin/usage", {}),
        ("http://edge/admin/usage?from=2026-01-01&to=2026-02-01", {"from": "2026-01-01", "to": "2026-02-01"}),
        ("http://edge/x?group_by=tenant%2Cmodel&q=a+b", {"group_by": "tenant,model", "q": "a b"}),
        ("http://edge/x?k=1&k=2", {"k": "2"}),  # a repeated name: the last one wins
        ("http://edge/x?flag&empty=", {}),  # names without a value are absent, not ""
    ],
)
def test_query_is_the_decoded_query_string(url: str, query: dict[str, str]) -> None:
    request = Request("GET", url)
    assert request.query == query
    assert "?" not in request.path


def test_the_path_read_once_is_kept_and_a_replaced_request_reads_its_own() -> None:
    """`path` is split out of the URL when first read and kept: a copy with another URL has its
    own, the kept value is no field (equality and `repr` stay the request's fields)."""
    from dataclasses import replace

    request = Request("GET", "http://edge/a%2Fb?x=1")
    assert request.path == "/a%2Fb" and request.path is request.path
    moved = replace(request, url="http://edge/c/d")
    assert (moved.path, request.path) == ("/c/d", "/a%2Fb")
    assert request == Request("GET", "http://edge/a%2Fb?x=1") and "path" not in repr(request)
    assert Request("GET", "http://edge").path == "/"


def test_path_stays_percent_encoded_while_the_query_is_decoded() -> None:
    request = Request("GET", "http://edge/models/a%2Fb/manifest.json?v=%2F")
    assert request.path == "/models/a%2Fb/manifest.json"
    assert request.query == {"v": "/"}


def _kinds_used_in(source: Path) -> set[str]:
    used: set[str] = set()
    for path in source.rglob("*.py"):  # the enum's own members are assignments, not `ErrorKind.X`
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ErrorKind":
                used.add(node.attr)
    return used


def test_every_error_kind_is_used_by_the_core() -> None:
    """A kind nothing raises would still be advertised in the OpenAPI error enum."""
    unused = {kind.name for kind in ErrorKind} - _kinds_used_in(SRC) - _kinds_used_in(LOCAL)
    assert not unused, f"error kinds nothing raises: {sorted(unused)}"
