"""The chat page makes a cache HIT visible and honest: "Ask again in a fresh chat" resends the last
question alone (in the same conversation it never could be a HIT: the history differs), and a HIT
shows that it was replayed from the cache instead of an absurd tokens-per-second figure. With
"Deterministic" on, the slider itself shows the temperature sent: 0."""

from __future__ import annotations

import re

from playwright.async_api import Page, expect

from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP
from .pages import answer_text, ask, open_chat, wait_state

pytestmark = BROWSER_LOOP


async def test_ask_again_as_a_new_chat_comes_back_from_the_cache_and_says_so(page: Page, edge: EdgeServer) -> None:
    await open_chat(page, edge)
    again = page.get_by_role("button", name="Ask again in a fresh chat")
    await expect(again).to_be_disabled()  # nothing asked yet
    first = await ask(page, "Name a colour.", max_tokens=16, deterministic=True)
    await expect(page.locator("#stat-cache")).to_have_text("MISS")
    await expect(page.locator("#stat-tps")).not_to_have_text(re.compile("cached"))
    edge.drain()  # the KV write runs after the answer (waitUntil)

    await again.click()
    await wait_state(page, "done", 20_000)
    await expect(page.locator(".message.user")).to_have_count(1)  # a new chat holding only the question
    await expect(page.locator("#stat-cache")).to_have_text(re.compile(r"^HIT"))
    await expect(page.locator("#stat-tps")).to_have_text(re.compile(r"cached"))
    await expect(page.locator("#status")).to_have_text(re.compile(r"from the edge's cache \(HIT\)"))
    assert await answer_text(page) == first


async def test_the_slider_shows_zero_while_deterministic_and_the_old_value_after(page: Page, edge: EdgeServer) -> None:
    await open_chat(page, edge)
    slider = page.get_by_label(re.compile("^Temperature"))
    await slider.fill("1.2")
    await expect(page.locator("#temperature-value")).to_have_text("1.2")
    await page.get_by_label("Deterministic").check()
    assert await slider.input_value() == "0"
    await expect(page.locator("#temperature-value")).to_have_text("0.0")
    await page.get_by_label("Deterministic").uncheck()
    assert await slider.input_value() == "1.2"
    await expect(page.locator("#temperature-value")).to_have_text("1.2")
