"""Driving the chat and device pages as a user does, for every test of them: open a page and wait
for its state, ask a question and read the answer, watch what a browser context fetches.

The pages say where they are in `body[data-state]` (idle, ready, streaming, done, stopped,
error), so a test waits on that attribute, never on a delay.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import httpx
from playwright.async_api import Browser, BrowserContext, Locator, Page, Request, expect

from edgellm_local.emulator.server import EdgeServer

DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
ANSWER_TIMEOUT = 120_000  # SmolLM2 on two shared cores, in WebAssembly on the device tier
LOAD_TIMEOUT = 240_000  # 98 MB downloaded, hashed and loaded on two shared cores
# Greedy decoding picks the top token; where the top two are nearly tied the x86 kernels of the
# edge's llama.cpp and the WebAssembly SIMD kernels of the device's can rank them differently
# (float sums in another order). "What is the capital of France?" is one: its first token is
# "The" on the device and "L" on the edge, 0.045 nats apart (top_logprobs on both). This question's
# greedy answer has a margin of at least 0.66 nats at every token on the edge, far above that noise.
QUESTION = "Hi!"
MAX_TOKENS = 12


async def wait_state(page: Page, state: str, timeout: float | None = None) -> None:
    await expect(page.locator("body")).to_have_attribute("data-state", state, timeout=timeout)


async def open_chat(page: Page, edge: EdgeServer) -> None:
    await page.goto(f"{edge.url}/chat")
    await wait_state(page, "idle")


async def open_device(page: Page, edge: EdgeServer, query: str = "") -> None:
    await page.goto(f"{edge.url}/device{query}")
    await wait_state(page, "ready", LOAD_TIMEOUT)


async def send(page: Page, text: str, *, max_tokens: int | None = None, deterministic: bool | None = None) -> None:
    """Type `text` and press Send (after setting the controls given); returns at once."""
    if max_tokens is not None:
        await page.get_by_label("Max tokens").fill(str(max_tokens))
    if deterministic is not None:
        await page.get_by_label("Deterministic").set_checked(deterministic)
    await page.get_by_label("Message").fill(text)
    await page.get_by_role("button", name="Send").click()


async def ask(page: Page, text: str, *, max_tokens: int | None = None, deterministic: bool | None = None,
              timeout: float = 20_000) -> str:
    """Send `text` and wait for the answer to be done; its text."""
    await send(page, text, max_tokens=max_tokens, deterministic=deterministic)
    await wait_state(page, "done", timeout)
    return await answer_text(page)


async def ask_greedy(page: Page, text: str) -> str:
    """`text` asked greedily for `MAX_TOKENS`, as the device and tier tests compare the tiers."""
    return await ask(page, text, max_tokens=MAX_TOKENS, deterministic=True, timeout=ANSWER_TIMEOUT)


def last_answer(page: Page) -> Locator:
    return page.locator(".message.assistant").last


def turn_note(page: Page) -> Locator:
    """The last answer's note: its tier, time to first token, tokens per second, tokens cached."""
    return last_answer(page).locator(".turn-stats")


async def answer_text(page: Page) -> str:
    return await last_answer(page).locator(".content").text_content() or ""


def edge_answer(edge: EdgeServer, text: str) -> str:
    """The edge's greedy answer to `text` through its API: what the device tier must match."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": MAX_TOKENS, "temperature": 0}
    response = httpx.post(f"{edge.url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


@dataclass
class Traffic:
    """Every request the browser context sends: shard downloads counted, nothing off-host."""

    origin: str
    urls: list[str] = field(default_factory=list)
    endings: dict[str, asyncio.Future[str]] = field(default_factory=dict)

    def record(self, request: Request) -> None:
        self.urls.append(request.url)

    def ended(self, url: str) -> asyncio.Future[str]:
        """How the (last) request for `url` ended: "finished" (all its body read) or "failed" (aborted)."""
        return self.endings.setdefault(url, asyncio.get_running_loop().create_future())

    def end(self, request: Request, how: str) -> None:
        future = self.ended(request.url)
        if not future.done():
            future.set_result(how)

    @property
    def shards(self) -> list[str]:
        return [u for u in self.urls if "/blobs/sha256-" in u]

    def off_host(self) -> list[str]:
        return [u for u in self.urls if not (u.startswith(self.origin + "/") or u.startswith(("blob:", "data:")))]


OpenContext = Callable[[EdgeServer], Awaitable[tuple[BrowserContext, Traffic]]]  # the `watched_context` fixture


async def new_context(browser: Browser, edge: EdgeServer) -> tuple[BrowserContext, Traffic]:
    """A fresh browser context (its own caches) whose every request `Traffic` records."""
    context = await browser.new_context(viewport=DESKTOP)
    traffic = Traffic(edge.url)
    context.on("request", traffic.record)
    context.on("requestfinished", lambda r: traffic.end(r, "finished"))
    context.on("requestfailed", lambda r: traffic.end(r, "failed"))
    return context, traffic
