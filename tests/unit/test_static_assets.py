"""Static assets answer `If-None-Match` with the same rules as the artifact routes (one matcher)."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgellm.http import Request
from edgellm_local.emulator.assets import StaticAssets
from tests.unit.test_ranges import NONE_MATCH


@pytest.fixture
def assets(tmp_path: Path) -> StaticAssets:
    (tmp_path / "index.html").write_text("<!doctype html><title>hi</title>")
    return StaticAssets(tmp_path)


@pytest.mark.parametrize("header, matches", NONE_MATCH)
def test_if_none_match_follows_the_artifact_rules(assets: StaticAssets, header: str | None, matches: bool) -> None:
    first = assets.serve(Request("GET", "http://edge/"))
    assert first is not None and first.status == 200
    current = first.headers["etag"]
    sent = None if header is None else header.replace('"abc"', current).replace("abc", current.strip('"'))
    response = assets.serve(Request("GET", "http://edge/", {"if-none-match": sent} if sent is not None else {}))
    assert response is not None and response.status == (304 if matches else 200)
