"""The operator's pages in headless Chromium, at desktop (1280 px) and phone (390 px) width:
the usage page's legends fit their charts and every series keeps one, costs read as dollars
(never `$3.8e-3`), an edge without an admin token says how to turn the report on; the home page
links the usage page; the Python page logs no "Refused to set unsafe header" and its code keeps
its lines on a phone; a HIT on the chat page does not claim "0 of N prompt tokens cached"."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest
from playwright.async_api import Page, expect

from edgellm.access.keys import KeyRing, new_key
from edgellm.config import Config
from edgellm.ports import BlobStore
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.emulator.usage_sqlite import SqliteUsage

from .conftest import BROWSER_LOOP, DESKTOP, PHONE, SCREENSHOTS
from .pages import ask, open_chat, wait_state
from .test_python_page import BOOT_TIMEOUT

pytestmark = BROWSER_LOOP

ADMIN = "usage-admin"
Q = {"messages": [{"role": "user", "content": "Name a colour."}], "temperature": 0, "max_tokens": 6}
TENANTS = (("alice", 2), ("bob-with-a-rather-long-tenant-name", 1), ("carol", 1), ("dave", 1))
WIDTHS = {"desktop": DESKTOP, "phone": PHONE}

# every legend text and label, with its svg's box: what "fits" is measured against
BOXES = """() => [...document.querySelectorAll('.charts svg')].map((svg) => {
  const box = svg.getBoundingClientRect();
  return {id: svg.id, box: [box.left, box.top, box.right, box.bottom],
          legend: [...svg.querySelectorAll('.legend text')].map((t) => { const b = t.getBoundingClientRect();
            return {text: t.textContent, box: [b.left, b.top, b.right, b.bottom]}; }),
          labels: [...svg.querySelectorAll(':scope > text')].map((t) => { const b = t.getBoundingClientRect();
            return {text: t.textContent, box: [b.left, b.top, b.right, b.bottom]}; })};
})"""


async def shoot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def inside(inner: list[float], outer: list[float]) -> bool:
    return inner[0] >= outer[0] - 0.5 and inner[2] <= outer[2] + 0.5 and inner[1] >= outer[1] - 0.5 and inner[3] <= outer[3] + 0.5


@pytest.fixture
def usage_edge(start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Any], tmp_path: Path) -> EdgeServer:
    deps = make_deps(config=Config(admin_token=ADMIN), usage=SqliteUsage(tmp_path / "usage.sqlite3"))
    import asyncio

    keys = {}
    for tenant, _ in TENANTS:
        made = new_key(tenant, deps.clock.now())
        asyncio.run(KeyRing(deps.kv).put(made.record))
        keys[tenant] = made.api_key
    edge = start_edge(deps)
    for tenant, count in TENANTS:
        for _ in range(count):
            response = httpx.post(edge.url + "/v1/chat/completions", json=Q, headers={"authorization": f"Bearer {keys[tenant]}"}, timeout=60)
            assert response.status_code == 200
            edge.drain()
    return edge


@pytest.mark.parametrize("width", sorted(WIDTHS))
async def test_usage_legends_fit_and_costs_read_as_dollars(page: Page, usage_edge: EdgeServer, width: str) -> None:
    await page.set_viewport_size(WIDTHS[width])
    await page.goto(f"{usage_edge.url}/usage")
    await page.get_by_label("Admin token or API key").fill(ADMIN)
    await page.get_by_role("button", name="Show usage").click()
    await expect(page.locator("body")).to_have_attribute("data-state", "shown")
    await shoot(page, f"usage-{width}")
    charts = {c["id"]: c for c in await page.evaluate(BOXES)}
    for chart in charts.values():
        for text in chart["legend"] + chart["labels"]:
            assert inside(text["box"], chart["box"]), (width, chart["id"], text)
    assert len(charts["chart-requests"]["legend"]) == len(TENANTS)  # one legend per tenant, at every width
    assert [t["text"] for t in charts["chart-cost"]["legend"]] == ["cost", "saved"]
    for label in ("Estimated cost", "Saved by the cache"):
        shown = await page.locator(f'[data-total="{label}"] strong').text_content() or ""
        assert re.fullmatch(r"\$\d+(\.\d+)?", shown), shown
    assert not any("e-" in t["text"] for c in charts.values() for t in c["labels"])


async def test_without_an_admin_token_the_usage_page_says_how_to_turn_it_on(page: Page, start_edge: Callable[..., EdgeServer]) -> None:
    edge = start_edge()
    raw = httpx.get(edge.url + "/admin/usage", timeout=10)
    assert raw.status_code == 404 and "--admin-token" in raw.json()["error"]["message"]
    await page.goto(f"{edge.url}/")
    await page.get_by_role("navigation").get_by_role("link", name="Usage").click()
    await expect(page).to_have_url(re.compile(r"/usage$"))
    await expect(page.locator("#admin-off")).to_contain_text("--admin-token")
    await page.get_by_label("Admin token or API key").fill("anything")
    await page.get_by_role("button", name="Show usage").click()
    await expect(page.locator("#error")).to_contain_text("--admin-token")


@pytest.mark.parametrize("width", sorted(WIDTHS))
async def test_python_page_has_no_unsafe_header_errors_and_keeps_code_lines(
        page: Page, start_edge: Callable[..., EdgeServer], published_r2: BlobStore, width: str) -> None:
    edge = start_edge(r2=published_r2)
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    await page.set_viewport_size(WIDTHS[width])
    await page.goto(f"{edge.url}/python")
    await expect(page.locator("#output")).to_have_attribute("data-runs", "1", timeout=BOOT_TIMEOUT)
    await shoot(page, f"python-{width}")
    assert not [e for e in errors if "unsafe header" in e], errors
    code = page.locator("#code")
    assert await code.evaluate("(el) => getComputedStyle(el).whiteSpace") == "pre"
    assert await page.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")  # the page itself never scrolls sideways


async def test_a_chat_hit_does_not_claim_prompt_tokens_cached(page: Page, edge: EdgeServer) -> None:
    await open_chat(page, edge)
    await ask(page, "Name a colour.", max_tokens=16, deterministic=True)
    edge.drain()
    await page.get_by_role("button", name="Ask again in a fresh chat").click()
    await wait_state(page, "done", 20_000)
    await expect(page.locator("#stat-cache")).to_have_text(re.compile(r"^HIT"))
    note = await page.locator(".turn-stats").last.text_content() or ""
    assert "prompt tokens cached" not in note and "cache" in note, note
    assert "of" not in (await page.locator("#stat-cached").text_content() or "of")
