"""The Python page in headless Chromium: Pyodide and every wheel come from the edge (no request
leaves it), the example's `requests` (patched by pyodide-http) fetches the tokenizer and config
and asks `/v1/chat/completions`, and the answer is printed; edited code runs again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable
from urllib.parse import urlsplit

from playwright.async_api import Page, Request, expect

from edgellm.ports import BlobStore
from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP, PUBLISHED_NAME

ROOT = Path(__file__).resolve().parents[2]
pytestmark = BROWSER_LOOP
BOOT_TIMEOUT = 180_000  # Pyodide compiles 8 MB of WebAssembly; the shared machine may be busy


async def test_the_example_runs_python_against_the_edge_with_no_off_host_request(
    page: Page, start_edge: Callable[..., EdgeServer], published_r2: BlobStore
) -> None:
    edge = start_edge(r2=published_r2)
    requests: list[Request] = []
    page.on("request", lambda request: requests.append(request))
    await page.goto(f"{edge.url}/python")

    output = page.locator("#output")
    await expect(output).to_have_attribute("data-runs", "1", timeout=BOOT_TIMEOUT)
    text = await output.text_content() or ""
    assert f"{PUBLISHED_NAME}: 49,152 tokens in the vocabulary" in text, text
    answer = next(line for line in text.splitlines() if line.startswith("A: "))
    assert len(answer) > len("A: ") + 1, text
    assert "cache: MISS" in text and "Traceback" not in text

    hosts = {urlsplit(r.url).netloc for r in requests if not r.url.startswith(("data:", "blob:"))}
    assert hosts == {urlsplit(edge.url).netloc}, hosts
    paths = {urlsplit(r.url).path for r in requests}
    wheels = json.loads((ROOT / "public" / "vendor" / "wheels" / "index.json").read_text())
    assert {f"/vendor/wheels/{w}" for w in wheels} <= paths and "/vendor/pyodide/pyodide.asm.wasm" in paths
    assert {f"/models/{PUBLISHED_NAME}/tokenizer.json", f"/models/{PUBLISHED_NAME}/config.json", "/v1/chat/completions"} <= paths

    # edit and rerun: the same deterministic question again is answered from the cache
    code = page.get_by_label("Python")
    await code.fill(await code.input_value() + '\nprint("edited:", 6 * 7)\n')
    await page.get_by_role("button", name="Run").click()
    await expect(output).to_have_attribute("data-runs", "2", timeout=60_000)
    rerun = await output.text_content() or ""
    assert "edited: 42" in rerun and "cache: HIT" in rerun
    assert next(line for line in rerun.splitlines() if line.startswith("A: ")) == answer


async def test_an_exception_is_shown_and_the_page_keeps_working(page: Page, start_edge: Callable[..., EdgeServer], published_r2: BlobStore) -> None:
    edge = start_edge(r2=published_r2)
    await page.goto(f"{edge.url}/python")
    output = page.locator("#output")
    await expect(output).to_have_attribute("data-runs", "1", timeout=BOOT_TIMEOUT)
    await page.get_by_label("Python").fill('import requests\nrequests.get(f"{EDGE}/models/nothing/config.json").raise_for_status()')
    await page.get_by_role("button", name="Run").click()
    await expect(page.locator("#status")).to_have_text("The code raised an exception (shown below).", timeout=60_000)
    assert "HTTPError: 404" in (await output.text_content() or "")
    await page.get_by_role("button", name="Reset the example").click()
    await page.get_by_role("button", name="Run").click()
    await expect(output).to_have_attribute("data-runs", "2", timeout=60_000)
