"""The pages' pure functions, table-driven, run in Chromium itself (the engine that ships them):
SSE framing, how a response was delivered, and how a token piece is shown."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page

from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP

pytestmark = BROWSER_LOOP

SSE_CASES = [
    ("one event", ["data: a\n\n"], ["a"]),
    ("split mid-line", ["da", "ta: {\"x\"", ":1}\n", "\n"], ['{"x":1}']),
    ("CRLF", ["data: a\r\n\r\ndata: b\r\n\r\n"], ["a", "b"]),
    ("CRLF split between reads", ["data: a\r", "\n\r", "\n"], ["a"]),
    ("multi-line data", ["data: a\ndata: b\n\n"], ["a\nb"]),
    ("comments and other fields", [": keep-alive\nevent: x\nid: 1\ndata: a\n\n"], ["a"]),
    ("no space after colon", ["data:a\n\n"], ["a"]),
    ("done marker", ["data: [DONE]\n\n"], ["[DONE]"]),
    ("last event without blank line", ["data: tail"], ["tail"]),
    ("blank lines alone", ["\n\n\n"], []),
]

DELIVERY_CASES = [
    ("downloaded", {"responseStatus": 200, "transferSize": 1300, "encodedBodySize": 1000}, "network"),
    ("revalidated (Chromium: status 200, headers only)", {"responseStatus": 200, "transferSize": 300, "encodedBodySize": 1000}, "revalidated"),
    ("revalidated small file", {"responseStatus": 200, "transferSize": 300, "encodedBodySize": 20}, "revalidated"),
    ("status 304 reported", {"responseStatus": 304, "transferSize": 300, "encodedBodySize": 1000}, "revalidated"),
    ("from cache without a request", {"responseStatus": 200, "transferSize": 0, "encodedBodySize": 1000}, "cache"),
    ("empty body downloaded", {"responseStatus": 200, "transferSize": 300, "encodedBodySize": 0}, "network"),
    ("no timing entry", None, "unknown"),
]

VISIBLE_CASES = [
    ("plain", "abc", "abc"),
    ("space", " the", "·the"),
    ("newline and tab", "\n\t", "↵⇥"),
    ("carriage return", "\r", "␍"),
    ("zero-width joiner", "\u200d", "U+200D"),
    ("NEL", "\u0085", "U+0085"),
    ("emoji", "🙂", "🙂"),
]


@pytest_asyncio.fixture(loop_scope="session")
async def modules_page(page: Page, edge: EdgeServer) -> Page:
    await page.goto(edge.url + "/")
    return page


async def run_module(page: Page, module: str, body: str, arg: Any) -> Any:
    return await page.evaluate(f"async (arg) => {{ const m = await import('{module}'); {body} }}", arg)


@pytest.mark.parametrize(("case", "chunks", "expected"), SSE_CASES, ids=[c[0] for c in SSE_CASES])
async def test_sse_decoder(modules_page: Page, case: str, chunks: list[str], expected: list[str]) -> None:
    body = "const d = new m.SSEDecoder(); const out = []; for (const c of arg) out.push(...d.feed(c)); out.push(...d.flush()); return out;"
    assert await run_module(modules_page, "/js/sse.mjs", body, chunks) == expected


@pytest.mark.parametrize(("case", "entry", "kind"), DELIVERY_CASES, ids=[c[0] for c in DELIVERY_CASES])
async def test_classify_delivery(modules_page: Page, case: str, entry: dict[str, int] | None, kind: str) -> None:
    result = await run_module(modules_page, "/js/artifacts.mjs", "return m.classifyDelivery(arg ?? undefined);", entry)
    assert result["kind"] == kind
    assert result["status"] == {"network": entry and entry["responseStatus"], "revalidated": 304}.get(kind)


@pytest.mark.parametrize(("case", "text", "shown"), VISIBLE_CASES, ids=[c[0] for c in VISIBLE_CASES])
async def test_visible_text(modules_page: Page, case: str, text: str, shown: str) -> None:
    assert await run_module(modules_page, "/js/pieces.mjs", "return m.visibleText(arg);", text) == shown


async def test_byte_level_hex(modules_page: Page) -> None:
    # "你" is E4 BD A0; GPT-2's byte-level alphabet spells E4 BD as "ä½" and A0 as "ł"
    assert await run_module(modules_page, "/js/pieces.mjs", "return [m.byteLevelHex('ä½'), m.byteLevelHex('ł'), m.byteLevelHex('Ġ'), m.byteLevelHex('<0xE4>x中')];", None) == [
        "E4 BD", "A0", "20", None,
    ]
