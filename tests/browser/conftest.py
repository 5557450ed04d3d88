"""Browser fixtures: Debian's Chromium under Playwright's async API, a local edge with SmolLM2's
artifacts published in its R2, and screenshots at desktop and phone widths.

Playwright's own browser download does not work here (nor on CI without network), so the
launch points at `/usr/bin/chromium` (`make setup-test` installs it) with the flags a headless
Chromium needs in a container.

The async API, on pytest-asyncio's session loop (every browser test module sets
`pytestmark = BROWSER_LOOP`), runs that loop only while a browser test or fixture runs. Playwright's
sync API instead keeps a loop running on the main thread from the first browser test to the end of
the session, which breaks `asyncio.run` in every test after it: test order no longer matters.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
from playwright.async_api import Browser, BrowserContext, Page, async_playwright

from edgellm.config import Config
from edgellm.ports import BlobStore
from edgellm_local.llama.binding import LlamaCppAI
from edgellm_local.llama.model_file import default_model_path
from edgellm_local.llama.runner import LlamaCppRunner
from edgellm_local.emulator.r2 import FileR2
from edgellm_local.emulator.server import EdgeServer

from .pages import DESKTOP, PHONE, Traffic, new_context
from .publishing import TokenizerFiles, publish_model, published_tokenizer

BROWSER_LOOP = pytest.mark.asyncio(loop_scope="session")  # one loop for the browser and its pages

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
# EDGELLM_SCREENSHOTS moves them (e.g. to a folder outside the checkout, to look at them).
SCREENSHOTS = Path(os.environ.get("EDGELLM_SCREENSHOTS") or Path(__file__).resolve().parents[2] / "artifacts" / "screenshots")
PUBLISHED_NAME = "smollm2-135m"
TINY_NAME = "tiny-bpe"


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make setup-test` installs it (apt-get install chromium)"
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        await browser.close()


@pytest_asyncio.fixture(loop_scope="session")
async def page(browser: Browser, request: pytest.FixtureRequest) -> AsyncIterator[Page]:
    """A page in a fresh browser context (no cache or storage shared between tests). Every test
    leaves a screenshot of where it ended, passed or failed (CI keeps `artifacts/` so a failure
    can be seen, not just read)."""
    context = await browser.new_context(viewport=DESKTOP)
    page = await context.new_page()
    try:
        yield page
        if not page.is_closed():
            await shoot(page, request, "end")
    finally:
        await context.close()


@pytest.fixture(scope="session")
def published_r2(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> BlobStore:
    """One R2 with SmolLM2 and the tiny test model published by `edgellm publish`, shared by the
    session (publishing 98 MB once is enough; each test still gets its own browser context, so
    browser caches never leak between tests)."""
    r2 = FileR2(tmp_path_factory.mktemp("published-r2"))
    publish_model(r2, PUBLISHED_NAME, default_model_path())
    publish_model(r2, TINY_NAME, tiny_model)
    return r2


@pytest.fixture(scope="session")
def smollm2_files(published_r2: BlobStore) -> TokenizerFiles:
    return published_tokenizer(published_r2, PUBLISHED_NAME)


@pytest.fixture(scope="session")
def tiny_files(published_r2: BlobStore) -> TokenizerFiles:
    return published_tokenizer(published_r2, TINY_NAME)


@pytest.fixture(scope="module")
def smollm2_runner() -> LlamaCppRunner:
    """The GGUF the device downloads, behind the edge too: the same model on both tiers."""
    return LlamaCppRunner(default_model_path(), n_ctx=2048, n_parallel=1, threads=2).load()


@pytest.fixture
def device_edge(start_edge: Callable[..., EdgeServer], published_r2: BlobStore, smollm2_runner: LlamaCppRunner) -> Callable[..., EdgeServer]:
    """Start an edge serving SmolLM2's published artifacts (from `r2`, default the session's) and
    answering with the same GGUF, in open mode without a KV (every answer generated)."""
    def start(r2: BlobStore | None = None) -> EdgeServer:
        config = Config(open_access=True)
        return start_edge(r2=r2 or published_r2, kv=None, config=config, ai=LlamaCppAI.for_config(config, smollm2_runner))

    return start


@pytest_asyncio.fixture(loop_scope="session")
async def watched_context(browser: Browser) -> AsyncIterator[Callable[[EdgeServer], Awaitable[tuple[BrowserContext, Traffic]]]]:
    """Open fresh browser contexts whose requests are recorded (`pages.Traffic`); every one is
    closed when the test ends, passed or failed."""
    opened: list[BrowserContext] = []

    async def open_context(edge: EdgeServer) -> tuple[BrowserContext, Traffic]:
        context, traffic = await new_context(browser, edge)
        opened.append(context)
        return context, traffic

    try:
        yield open_context
    finally:
        for context in opened:
            await context.close()


@pytest.fixture
def artifact_edge(start_edge: Callable[..., EdgeServer], published_r2: BlobStore) -> EdgeServer:
    return start_edge(r2=published_r2)


async def shoot(page: Page, request: pytest.FixtureRequest, label: str) -> None:
    """Save `page` at desktop and phone widths: `artifacts/screenshots/<test>-<label>-*.png`."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    stem = f"{request.node.name}-{label}".replace("[", "-").replace("]", "")
    size = page.viewport_size or DESKTOP
    await page.screenshot(path=str(SCREENSHOTS / f"{stem}-desktop.png"), full_page=True)
    await page.set_viewport_size(PHONE)
    await page.screenshot(path=str(SCREENSHOTS / f"{stem}-phone.png"), full_page=True)
    await page.set_viewport_size(size)


@pytest.fixture
def screenshot(page: Page, request: pytest.FixtureRequest) -> Callable[[str], Awaitable[None]]:
    """Save the page mid-test at desktop and phone widths: `artifacts/screenshots/<test>-<label>-*.png`."""
    return lambda label: shoot(page, request, label)
