"""Browser fixtures: Debian's Chromium under Playwright, a local edge with SmolLM2's artifacts
published in its R2, and screenshots at desktop and phone widths.

Playwright's own browser download does not work here (nor on CI without network), so the
launch points at `/usr/bin/chromium` (`make setup-test` installs it) with the flags a headless
Chromium needs in a container.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from playwright.sync_api import Page

from edgellm.ports import BlobStore
from edgellm_local.ai import default_model_path
from edgellm_local.r2 import FileR2
from edgellm_local.server import EdgeServer

from .publishing import TokenizerFiles, publish_model, published_tokenizer

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
PUBLISHED_NAME = "smollm2-135m"
TINY_NAME = "tiny-bpe"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make setup-test` installs it (apt-get install chromium)"
    return {**browser_type_launch_args, "executable_path": CHROMIUM, "args": CHROMIUM_ARGS}


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    return {**browser_context_args, "viewport": DESKTOP}


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


@pytest.fixture
def artifact_edge(start_edge: Callable[..., EdgeServer], published_r2: BlobStore) -> EdgeServer:
    return start_edge(r2=published_r2)


def _shoot(page: Page, request: pytest.FixtureRequest, label: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    stem = f"{request.node.name}-{label}".replace("[", "-").replace("]", "")
    size = page.viewport_size or DESKTOP
    page.screenshot(path=str(SCREENSHOTS / f"{stem}-desktop.png"), full_page=True)
    page.set_viewport_size(PHONE)
    page.screenshot(path=str(SCREENSHOTS / f"{stem}-phone.png"), full_page=True)
    page.set_viewport_size(size)


@pytest.fixture
def screenshot(page: Page, request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Save the page mid-test at desktop and phone widths: `artifacts/screenshots/<test>-<label>-*.png`."""
    return lambda label: _shoot(page, request, label)


@pytest.fixture(autouse=True)
def screenshot_at_end(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every browser test leaves a screenshot of where it ended, passed or failed (CI keeps
    `artifacts/` so a failure can be seen, not just read)."""
    page = request.getfixturevalue("page") if "page" in request.fixturenames else None
    yield
    if page is not None and not page.is_closed():
        _shoot(page, request, "end")


@pytest.fixture(scope="session")
def base_url() -> None:
    """Tests open the URL of the edge they started; this replaces pytest-base-url's fixture,
    which is written in a form pytest deprecates."""
    return None
