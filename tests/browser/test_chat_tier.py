"""The chat page's tier switch in headless Chromium: "This device" downloads SmolLM2's shards from
the local edge, runs it in WebAssembly on the (not cross-origin isolated, so single-thread) chat
page and answers with the edge's own greedy text; "Edge" answers through the same OpenAI-shaped
client at the edge; a device that cannot hold the model falls back to the edge and says why.
Each answer says where it ran. No request leaves the host."""

from __future__ import annotations

from typing import Callable

import pytest
from playwright.async_api import Page, expect

from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP, shoot
from .pages import LOAD_TIMEOUT, QUESTION, OpenContext, ask_greedy, edge_answer, open_chat, turn_note, wait_state

pytestmark = BROWSER_LOOP


async def choose(page: Page, tier: str) -> None:
    await page.get_by_label(tier, exact=True).click()  # not check(): a fallback unchecks it at once
    await wait_state(page, "idle", LOAD_TIMEOUT)


async def ask(page: Page, text: str) -> tuple[str, str | None]:
    """Send `text` greedily in a fresh chat; the answer's text and the tier its note names."""
    await page.get_by_role("button", name="New chat").click()
    answer = await ask_greedy(page, text)
    return answer, await turn_note(page).get_attribute("data-tier")


async def test_the_switch_answers_on_the_device_and_at_the_edge(
    watched_context: OpenContext, device_edge: Callable[..., EdgeServer], request: pytest.FixtureRequest
) -> None:
    edge = device_edge()
    context, traffic = await watched_context(edge)
    page = await context.new_page()
    await open_chat(page, edge)
    assert await page.evaluate("crossOriginIsolated") is False, "the chat page must not need COOP/COEP"
    assert await page.locator("body").get_attribute("data-tier") == "edge", "the edge is the default"
    expected = edge_answer(edge, QUESTION)

    await choose(page, "This device")
    assert await page.locator("body").get_attribute("data-tier") == "device", await page.locator("#tier-notice").text_content()
    await expect(page.locator("#tier-now")).to_contain_text("single thread")
    assert traffic.shards, "the device tier downloaded no shard"
    text, tier = await ask(page, QUESTION)
    assert tier == "device"
    await expect(turn_note(page)).to_contain_text("ran on this device")
    assert text.strip() and text == expected, "greedy text differs between the device and the edge"
    await expect(page.locator("#stat-cache")).to_have_text("— (ran on this device)")
    await shoot(page, request, "device")

    await choose(page, "Edge")
    assert await page.locator("body").get_attribute("data-tier") == "edge"
    text, tier = await ask(page, QUESTION)
    assert tier == "edge" and text == expected
    await expect(turn_note(page)).to_contain_text("ran at the edge")
    assert traffic.off_host() == [], f"requests left the host: {traffic.off_host()}"


async def test_a_device_that_cannot_hold_the_model_falls_back_to_the_edge_and_says_why(
    watched_context: OpenContext, device_edge: Callable[..., EdgeServer], request: pytest.FixtureRequest
) -> None:
    edge = device_edge()
    context, traffic = await watched_context(edge)
    await context.add_init_script("Object.defineProperty(Navigator.prototype, 'deviceMemory', {get: () => 0.25})")
    page = await context.new_page()
    await open_chat(page, edge)
    await choose(page, "This device")
    body = page.locator("body")
    assert await body.get_attribute("data-tier") == "edge"
    assert await body.get_attribute("data-fallback") == "memory"
    await expect(page.locator("#tier-notice")).to_contain_text("this device reports 0.25 GB")
    await expect(page.get_by_label("Edge", exact=True)).to_be_checked()
    assert traffic.shards == [], "a shard was downloaded for a device that cannot hold the model"
    text, tier = await ask(page, QUESTION)
    assert tier == "edge" and text.strip()
    await shoot(page, request, "fallback")
