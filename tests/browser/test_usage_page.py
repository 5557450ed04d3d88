"""The usage page in headless Chromium: it asks /admin/usage with the token typed in and draws
requests, tokens, hit rate and cost as SVG charts; a tenant's key sees its own tenant only."""

from __future__ import annotations

from pathlib import Path
from typing import Awaitable, Callable

import httpx
from playwright.async_api import Page, expect

from edgellm.access.keys import KeyRing, new_key
from edgellm.config import Config
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.emulator.usage_sqlite import SqliteUsage

from .conftest import BROWSER_LOOP

pytestmark = BROWSER_LOOP

ADMIN = "usage-admin"
Q = {"messages": [{"role": "user", "content": "Name a colour."}], "temperature": 0, "max_tokens": 6}


async def test_usage_page_draws_the_charts(page: Page, start_edge: Callable[..., EdgeServer], make_deps, tmp_path: Path,
                                           screenshot: Callable[[str], Awaitable[None]]) -> None:
    deps = make_deps(config=Config(admin_token=ADMIN), usage=SqliteUsage(tmp_path / "usage.sqlite3"))
    keys = {}
    for tenant in ("alice", "bob"):
        made = new_key(tenant, deps.clock.now())
        await KeyRing(deps.kv).put(made.record)
        keys[tenant] = made.api_key
    edge = start_edge(deps)
    sent = 0
    for tenant, count in (("alice", 3), ("bob", 2)):
        for _ in range(count):
            response = httpx.post(edge.url + "/v1/chat/completions", json=Q, headers={"authorization": f"Bearer {keys[tenant]}"}, timeout=60)
            assert response.status_code == 200
            sent += 1
            edge.drain()
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)

    await page.goto(f"{edge.url}/usage")
    await expect(page.locator("body")).to_have_attribute("data-state", "idle")
    await page.get_by_label("Admin token or API key").fill(ADMIN)
    await page.get_by_role("button", name="Show usage").click()
    await expect(page.locator("body")).to_have_attribute("data-state", "shown")
    await expect(page.locator('[data-total="Requests"] strong')).to_have_text(str(sent))
    await expect(page.locator("#chart-requests polyline")).to_have_count(2)
    values = {await p.get_attribute("data-series"): float(await p.get_attribute("data-value") or 0)
              for p in await page.locator("#chart-requests circle.point").all()}
    assert values == {"alice": 3.0, "bob": 2.0}
    await expect(page.locator("#chart-cost rect.bar")).to_have_count(4)  # cost and saved for each tenant
    hit_bars = {await b.get_attribute("data-label"): float(await b.get_attribute("data-value") or 0)
                for b in await page.locator("#chart-hits rect.bar").all()}
    assert hit_bars["alice"] > hit_bars["bob"] > 0  # 2 of 3 HITs, 1 of 2
    await screenshot("admin")
    assert errors == []  # no CSP violation, no script error

    await page.get_by_label("Admin token or API key").fill(keys["bob"])
    await page.get_by_role("button", name="Show usage").click()
    await expect(page.locator('[data-total="Requests"] strong')).to_have_text("2")
    await expect(page.locator("#chart-requests polyline")).to_have_count(1)

    await page.get_by_label("Admin token or API key").fill("wrong")
    await page.get_by_role("button", name="Show usage").click()
    await expect(page.locator("body")).to_have_attribute("data-state", "error")
    await expect(page.locator("#error")).to_contain_text("token")


async def test_show_usage_waits_for_the_page_module(page: Page, start_edge: Callable[..., EdgeServer]) -> None:
    """Clicked before usage-page.mjs handles the form, the form would submit natively: the page
    reloads and the typed token is gone. The button is enabled only by the module."""
    edge = start_edge()
    await page.route("**/js/usage-page.mjs", lambda route: route.abort())
    await page.goto(f"{edge.url}/usage")
    await expect(page.get_by_role("button", name="Show usage")).to_be_disabled()
    await page.unroute("**/js/usage-page.mjs")
    await page.goto(f"{edge.url}/usage")
    await expect(page.locator("body")).to_have_attribute("data-state", "idle")
    await expect(page.get_by_role("button", name="Show usage")).to_be_enabled()


async def test_the_page_says_admin_routes_are_off_only_when_they_are(page: Page, start_edge: Callable[..., EdgeServer]) -> None:
    off = start_edge(config=Config(open_access=True))
    await page.goto(f"{off.url}/usage")
    await expect(page.locator("body")).to_have_attribute("data-admin", "off")
    await expect(page.locator("#admin-off")).to_be_visible()
    on = start_edge(config=Config(open_access=True, admin_token=ADMIN))
    await page.goto(f"{on.url}/usage")
    await expect(page.locator("body")).to_have_attribute("data-admin", "on")
    await expect(page.locator("#admin-off")).to_be_hidden()


CHARTS = ("chart-requests", "chart-tokens", "chart-hits", "chart-cost")
LIVE_CHARTS = ("live-requests", "live-errors", "live-hits", "live-ttft", "live-tokens")


async def chart_words(page: Page, ids: tuple[str, ...]) -> dict[str, str]:
    return {chart: (await page.locator(f"#{chart}").text_content() or "").strip() for chart in ids}


async def test_every_empty_chart_says_why_it_is_empty(page: Page, start_edge: Callable[..., EdgeServer], make_deps, tmp_path: Path,
                                                      screenshot: Callable[[str], Awaitable[None]]) -> None:
    """A frame with nothing in it reads as a broken page: before a token, each chart says what
    shows it; with a token and no usage yet, each says there is none; the live charts say the same."""
    edge = start_edge(make_deps(config=Config(admin_token=ADMIN), usage=SqliteUsage(tmp_path / "usage.sqlite3")))
    await page.goto(f"{edge.url}/usage")
    await expect(page.locator("body")).to_have_attribute("data-state", "idle")
    before = await chart_words(page, CHARTS)
    assert all("admin token" in words for words in before.values()), before
    live = await chart_words(page, LIVE_CHARTS)
    assert all("admin token" in words for words in live.values()), live
    await screenshot("usage-no-token")

    await page.get_by_label("Admin token or API key").fill(ADMIN)
    await page.get_by_role("button", name="Show usage").click()
    await expect(page.locator("body")).to_have_attribute("data-state", "shown")
    shown = await chart_words(page, CHARTS)
    assert all("no usage" in words.lower() for words in shown.values()), shown

    await page.get_by_label("Admin token or API key").fill("wrong")
    await page.get_by_role("button", name="Show usage").click()
    await expect(page.locator("body")).to_have_attribute("data-state", "error")
    refused = await chart_words(page, CHARTS)
    assert all("refused" in words for words in refused.values()), refused
