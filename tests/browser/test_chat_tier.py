"""The chat page's tier switch in headless Chromium: "This device" downloads SmolLM2's shards from
the local edge, runs it in WebAssembly on the (not cross-origin isolated, so single-thread) chat
page and answers with the edge's own greedy text; "Edge" answers through the same OpenAI-shaped
client at the edge; a device that cannot hold the model falls back to the edge and says why.
Each answer says where it ran. No request leaves the host."""

from __future__ import annotations

from typing import Callable

import pytest
from playwright.async_api import Browser, Page, expect

from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP, _shoot
from .test_device_page import (  # noqa: F401  (fixtures: the same GGUF behind the edge)
    ANSWER_TIMEOUT, LOAD_TIMEOUT, MAX_TOKENS, QUESTION, device_edge, edge_answer, new_context, smollm2_runner,
)

pytestmark = BROWSER_LOOP


async def open_chat(page: Page, edge: EdgeServer) -> None:
    await page.goto(f"{edge.url}/chat")
    await expect(page.locator("body")).to_have_attribute("data-state", "idle")


async def choose(page: Page, tier: str) -> None:
    await page.get_by_label(tier, exact=True).click()  # not check(): a fallback unchecks it at once
    await expect(page.locator("body")).to_have_attribute("data-state", "idle", timeout=LOAD_TIMEOUT)


async def ask(page: Page, text: str) -> tuple[str, str | None]:
    """Send `text` greedily in a fresh chat; the answer's text and the tier its note names."""
    await page.get_by_role("button", name="New chat").click()
    await page.get_by_label("Max tokens").fill(str(MAX_TOKENS))
    await page.get_by_label("Deterministic").set_checked(True)
    await page.get_by_label("Message").fill(text)
    await page.get_by_role("button", name="Send").click()
    await expect(page.locator("body")).to_have_attribute("data-state", "done", timeout=ANSWER_TIMEOUT)
    answer = page.locator(".message.assistant").last
    note = answer.locator(".turn-stats")
    return await answer.locator(".content").text_content() or "", await note.get_attribute("data-tier")


async def test_the_switch_answers_on_the_device_and_at_the_edge(
    browser: Browser, device_edge: Callable[..., EdgeServer], request: pytest.FixtureRequest
) -> None:
    edge = device_edge()
    context, traffic = await new_context(browser, edge)
    try:
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
        await expect(page.locator(".message.assistant").last.locator(".turn-stats")).to_contain_text("ran on this device")
        assert text.strip() and text == expected, "greedy text differs between the device and the edge"
        await expect(page.locator("#stat-cache")).to_have_text("— (ran on this device)")
        await _shoot(page, request, "device")

        await choose(page, "Edge")
        assert await page.locator("body").get_attribute("data-tier") == "edge"
        text, tier = await ask(page, QUESTION)
        assert tier == "edge" and text == expected
        await expect(page.locator(".message.assistant").last.locator(".turn-stats")).to_contain_text("ran at the edge")
        assert traffic.off_host() == [], f"requests left the host: {traffic.off_host()}"
    finally:
        await context.close()


async def test_a_device_that_cannot_hold_the_model_falls_back_to_the_edge_and_says_why(
    browser: Browser, device_edge: Callable[..., EdgeServer], request: pytest.FixtureRequest
) -> None:
    edge = device_edge()
    context, traffic = await new_context(browser, edge)
    await context.add_init_script("Object.defineProperty(Navigator.prototype, 'deviceMemory', {get: () => 0.25})")
    try:
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
        await _shoot(page, request, "fallback")
    finally:
        await context.close()
