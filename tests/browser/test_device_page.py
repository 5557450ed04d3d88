"""The device tier in headless Chromium against a local edge serving SmolLM2 (the default model)
from its R2 and answering with the same GGUF through llama.cpp: the page downloads the shards,
verifies each one, answers on the device with the edge's own greedy text, starts a second visit
from the browser's cache without fetching a shard, refuses a shard with a flipped byte by name,
stops clearly on a 404 or a manifest that disagrees with its blob, and falls back to the edge
when the device path is unavailable or declined. No request leaves the host."""

from __future__ import annotations

import asyncio
import re
import subprocess
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import httpx
import pytest
from playwright.async_api import Page, expect

from edgellm.ports import BlobStore, R2Conditional, R2Object, R2Range
from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP, PUBLISHED_NAME, shoot
from .pages import LOAD_TIMEOUT, MAX_TOKENS, QUESTION, OpenContext, ask_greedy, edge_answer, open_device, turn_note, wait_state

pytestmark = BROWSER_LOOP


@dataclass
class FlippingR2:
    """R2 at the binding seam, flipping one byte in the body of `key` for its first `times` reads
    (a corrupt copy in storage, or on the wire)."""

    inner: BlobStore
    key: str = ""
    times: int = 1
    missing: str = ""  # a key that answers as absent (a blob lost from the bucket)
    flipped: int = field(default=0)
    # a key whose body stops after its first chunk until `release` is set (a download in flight)
    hold: str = ""
    release: threading.Event = field(default_factory=threading.Event)

    async def head(self, key: str) -> R2Object | None:
        return None if key == self.missing else await self.inner.head(key)

    async def get(self, key: str, *, range: R2Range | None = None, only_if: R2Conditional | None = None) -> R2Object | None:
        if key == self.missing:
            return None
        obj = await self.inner.get(key, range=range, only_if=only_if)
        if obj is not None and obj.body is not None and key == self.hold:
            return replace(obj, body=_held(obj.body, self.release))
        if obj is None or obj.body is None or key != self.key or self.flipped >= self.times:
            return obj
        self.flipped += 1
        return replace(obj, body=_flip_first_byte(obj.body))

    async def put(self, key: str, data: Any, **options: Any) -> R2Object:
        return await self.inner.put(key, data, **options)

    async def delete(self, key: str) -> None:
        await self.inner.delete(key)

    async def list(self, prefix: str = "", **options: Any) -> dict[str, Any]:
        return await self.inner.list(prefix, **options)


async def _held(body: AsyncIterator[bytes], release: threading.Event) -> AsyncIterator[bytes]:
    first = True
    async for chunk in body:
        yield chunk
        if first:
            first = False
            await asyncio.to_thread(release.wait)  # the test sets it (in `finally` too): never left waiting


async def _flip_first_byte(body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    first = True
    async for chunk in body:
        if first and chunk:
            chunk = bytes([chunk[0] ^ 0x01]) + chunk[1:]
            first = False
        yield chunk


def manifest_of(edge: EdgeServer) -> dict[str, Any]:
    return httpx.get(f"{edge.url}/models/{PUBLISHED_NAME}/manifest.json").json()


# The module's two clients asked the same greedy request through one API, streamed and not.
BOTH_TIERS = """async ({messages, max_tokens}) => {
  const {EdgeLLM} = await import('/js/device-llm.mjs');
  const device = window.edgellmClient, edge = new EdgeLLM();
  const request = {messages, max_tokens, temperature: 0};
  const streamed = async (client, usage) => {
    const out = [];
    for await (const c of await client.chat.completions.create({...request, stream: true, ...(usage ? {stream_options: {include_usage: true}} : {})})) out.push(c);
    return out;
  };
  return {device: {usage: await streamed(device, true), plain: await streamed(device, false), whole: await device.chat.completions.create(request)},
          edge: {usage: await streamed(edge, true), plain: await streamed(edge, false), whole: await edge.chat.completions.create(request)}};
}"""


def chunk_shape(chunk: dict[str, Any]) -> tuple[Any, ...]:
    """What a client of the edge relies on in a chunk: its fields, its object, and per choice the
    fields, the delta's fields and whether it finishes; not the values that differ by tier.
    `edgellm_route` is left out: the edge puts it on its final chunk only after a mid-stream
    failover (its `x-edgellm-route` header says the rest), the device, which has no header, on its
    finish chunk always ("device"), asserted on its own."""
    choices = tuple((tuple(sorted(c)), tuple(sorted(c["delta"])), c["finish_reason"] is not None) for c in chunk["choices"])
    return tuple(sorted(set(chunk) - {"edgellm_route"})), chunk["object"], choices


def squeeze(shapes: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Consecutive text chunks as one (the two tiers split the same text into pieces differently)."""
    return [s for i, s in enumerate(shapes) if i == 0 or s != shapes[i - 1]]


async def same_chunks_from_both_tiers(page: Page) -> None:
    """`chat.completions.create` answers with the edge's chunks on the device: the same fields in
    the same order of chunks (a role, the text, a finish, `usage` only when asked), the same text."""
    got = await page.evaluate(BOTH_TIERS, {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": MAX_TOKENS})
    text = lambda chunks: "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])  # noqa: E731
    for kind in ("usage", "plain"):
        device, edge = got["device"][kind], got["edge"][kind]
        assert squeeze([chunk_shape(c) for c in device]) == squeeze([chunk_shape(c) for c in edge]), kind
        assert device[0]["choices"][0]["delta"]["role"] == "assistant" and {c["object"] for c in device} == {"chat.completion.chunk"}
        assert text(device) == text(edge) and text(device).strip(), kind
        assert [c["edgellm_route"] for c in device if "edgellm_route" in c] == ["device"], kind
    assert got["device"]["usage"][-1]["choices"] == [] and got["device"]["usage"][-1]["usage"]["completion_tokens"] > 0
    whole_device, whole_edge = got["device"]["whole"], got["edge"]["whole"]
    assert sorted(whole_device) == sorted(whole_edge) and whole_device["object"] == whole_edge["object"] == "chat.completion"
    assert sorted(whole_device["choices"][0]) == sorted(whole_edge["choices"][0])
    assert whole_device["choices"][0]["message"] == whole_edge["choices"][0]["message"]
    assert sorted(whole_device["usage"]) == sorted(whole_edge["usage"])


async def test_downloads_verifies_answers_on_device_and_resumes_from_cache(
    watched_context: OpenContext, device_edge: Callable[..., EdgeServer], request: pytest.FixtureRequest
) -> None:
    edge = device_edge()
    manifest = manifest_of(edge)
    context, traffic = await watched_context(edge)
    page = await context.new_page()
    await page.goto(f"{edge.url}/device")
    # progress while downloading: bytes of the model's size, shards counted as verified
    await expect(page.locator("#stat-bytes")).to_contain_text(" of ", timeout=LOAD_TIMEOUT)
    await shoot(page, request, "progress")
    await wait_state(page, "ready", LOAD_TIMEOUT)
    assert await page.locator("body").get_attribute("data-tier") == "device", await page.locator("#notice").text_content()
    assert await page.evaluate("crossOriginIsolated") is True, "the device page is not cross-origin isolated"
    await expect(page.locator("#stat-threads")).to_contain_text("multi-thread")
    await expect(page.locator("#stat-shards")).to_have_text(f"{len(manifest['shards'])} of {len(manifest['shards'])}")
    assert sorted(traffic.shards) == sorted(f"{edge.url}/models/{PUBLISHED_NAME}/{s['path']}" for s in manifest["shards"]), \
        "each shard is downloaded exactly once"

    answer = await ask_greedy(page, QUESTION)
    note = turn_note(page)
    assert await note.get_attribute("data-tier") == "device"
    assert int(await note.get_attribute("data-ttft") or "-1") >= 0
    assert float(await note.get_attribute("data-tps") or "0") > 0
    assert answer.strip(), "the device answered nothing"
    assert answer == edge_answer(edge, QUESTION), "greedy text differs between the device and the edge"
    await shoot(page, request, "answer")
    await same_chunks_from_both_tiers(page)
    await page.close()

    # second visit, same browser profile: every shard from Cache Storage, none fetched
    before = len(traffic.shards)
    page = await context.new_page()
    await open_device(page, edge)
    assert await page.locator("body").get_attribute("data-tier") == "device"
    await expect(page.locator("#tier-now")).to_contain_text("started from the browser cache")
    assert len(traffic.shards) == before, f"the second visit fetched {len(traffic.shards) - before} shards again"
    assert traffic.off_host() == [], f"requests left the host: {traffic.off_host()}"


async def test_a_flipped_byte_is_refused_by_name_and_fetched_again(
    watched_context: OpenContext, device_edge: Callable[..., EdgeServer], published_r2: BlobStore
) -> None:
    probe = device_edge()
    shard = manifest_of(probe)["shards"][0]
    flipping = FlippingR2(published_r2, key=f"models/{PUBLISHED_NAME}/{shard['path']}", times=1)
    edge = device_edge(flipping)
    context, traffic = await watched_context(edge)
    page = await context.new_page()
    await open_device(page, edge, "?threads=1")
    assert flipping.flipped == 1
    refused = page.locator("#events li.refused")
    await expect(refused).to_have_count(1)
    await expect(refused).to_contain_text(f"sha256-{shard['sha256'][:12]}")
    assert await page.locator("body").get_attribute("data-tier") == "device", "the refetched shard was not used"
    assert traffic.shards.count(f"{edge.url}/models/{PUBLISHED_NAME}/{shard['path']}") == 2


async def test_a_blob_that_never_matches_stops_and_the_edge_answers(
    watched_context: OpenContext, device_edge: Callable[..., EdgeServer], published_r2: BlobStore, request: pytest.FixtureRequest
) -> None:
    """Shard 1 never matches; shard 0 is still downloading when it fails for good (its body is held
    after one chunk until the page has fallen back). The page aborts that download, so nothing
    writes progress over "stopped", and the switch moves to "At the edge"."""
    probe = device_edge()
    first, shard = manifest_of(probe)["shards"][:2]
    r2 = FlippingR2(published_r2, key=f"models/{PUBLISHED_NAME}/{shard['path']}", times=99,
                    hold=f"models/{PUBLISHED_NAME}/{first['path']}")
    edge = device_edge(r2)
    context, traffic = await watched_context(edge)
    try:
        page = await context.new_page()
        await open_device(page, edge, "?threads=1")
        body = page.locator("body")
        assert await body.get_attribute("data-tier") == "edge"
        assert await body.get_attribute("data-fallback") == "corrupt"
        notice = page.locator("#notice")
        await expect(notice).to_contain_text(f"shard 1 (sha256-{shard['sha256'][:12]}")
        await expect(notice).to_contain_text("after two downloads")
        kept = "(hex) => caches.open('edgellm-shards-v1').then(c => c.match('/device-shards/sha256-' + hex)).then(r => r !== undefined)"
        assert await page.evaluate(kept, shard["sha256"]) is False, "an unverified shard was kept"
        # the held download: let it go on, and see how it ended
        r2.release.set()
        ending = await asyncio.wait_for(traffic.ended(f"{edge.url}/models/{PUBLISHED_NAME}/{first['path']}"), LOAD_TIMEOUT / 1000)
        await expect(page.locator("#stat-eta")).to_have_text("stopped")
        assert ending == "failed", "shard 0's download went on after the load had stopped"
        await expect(page.get_by_label("At the edge")).to_be_checked()
        answer = await ask_greedy(page, QUESTION)
        assert answer.strip()
        assert await turn_note(page).get_attribute("data-tier") == "edge"
        await shoot(page, request, "fallback")
    finally:
        r2.release.set()


async def test_a_missing_shard_stops_with_a_clear_message(
    watched_context: OpenContext, device_edge: Callable[..., EdgeServer], published_r2: BlobStore
) -> None:
    probe = device_edge()
    shard = manifest_of(probe)["shards"][-1]
    edge = device_edge(FlippingR2(published_r2, missing=f"models/{PUBLISHED_NAME}/{shard['path']}"))
    context, _ = await watched_context(edge)
    page = await context.new_page()
    await open_device(page, edge, "?threads=1")
    assert await page.locator("body").get_attribute("data-fallback") == "not-found"
    await expect(page.locator("#notice")).to_contain_text("answered 404")
    await expect(page.locator("#notice")).to_contain_text(f"sha256-{shard['sha256'][:12]}")


async def test_an_unpublished_model_stops_with_a_clear_message(watched_context: OpenContext, device_edge: Callable[..., EdgeServer]) -> None:
    edge = device_edge()
    context, _ = await watched_context(edge)
    page = await context.new_page()
    await open_device(page, edge, "?model=not-published")
    assert await page.locator("body").get_attribute("data-fallback") == "not-found"
    await expect(page.locator("#notice")).to_contain_text('No model "not-published" is published on this edge')


async def test_too_little_memory_falls_back_before_downloading(watched_context: OpenContext, device_edge: Callable[..., EdgeServer]) -> None:
    edge = device_edge()
    context, traffic = await watched_context(edge)
    await context.add_init_script("Object.defineProperty(Navigator.prototype, 'deviceMemory', {get: () => 0.25})")
    page = await context.new_page()
    await open_device(page, edge)
    assert await page.locator("body").get_attribute("data-fallback") == "memory"
    await expect(page.locator("#notice")).to_contain_text("this device reports 0.25 GB")
    assert traffic.shards == [], "a shard was downloaded for a device that cannot hold the model"


async def test_a_browser_without_jspi_falls_back_before_downloading(watched_context: OpenContext, device_edge: Callable[..., EdgeServer]) -> None:
    """wllama's build needs JavaScript Promise Integration (its CDN compatibility build is off):
    a browser without it is told so, and no shard is fetched for nothing."""
    edge = device_edge()
    context, traffic = await watched_context(edge)
    await context.add_init_script("delete WebAssembly.Suspending")
    page = await context.new_page()
    await open_device(page, edge)
    assert await page.locator("body").get_attribute("data-fallback") == "unsupported"
    await expect(page.locator("#notice")).to_contain_text("This browser lacks WebAssembly JavaScript Promise Integration (JSPI)")
    assert traffic.shards == [], "a shard was downloaded for a browser that cannot run the model"
    assert await ask_greedy(page, QUESTION) == edge_answer(edge, QUESTION)


async def test_the_users_choice_runs_at_the_edge(
    watched_context: OpenContext, device_edge: Callable[..., EdgeServer], request: pytest.FixtureRequest
) -> None:
    edge = device_edge()
    context, traffic = await watched_context(edge)
    page = await context.new_page()
    await open_device(page, edge, "?tier=edge")
    assert await page.locator("body").get_attribute("data-fallback") == "choice"
    assert traffic.shards == []
    answer = await ask_greedy(page, QUESTION)
    assert answer == edge_answer(edge, QUESTION)
    note = turn_note(page)
    assert await note.get_attribute("data-tier") == "edge"
    await expect(note).to_contain_text("Ran at the edge")


async def test_other_pages_are_not_cross_origin_isolated(device_edge: Callable[..., EdgeServer]) -> None:
    edge = device_edge()
    device = httpx.get(f"{edge.url}/device")
    assert device.headers["cross-origin-opener-policy"] == "same-origin"
    assert device.headers["cross-origin-embedder-policy"] == "require-corp"
    for path in ("/", "/chat", "/tokenizer", "/python", "/js/chat-page.mjs"):
        response = httpx.get(f"{edge.url}{path}")
        assert response.status_code == 200, path
        assert "cross-origin-embedder-policy" not in response.headers, path
        assert "cross-origin-opener-policy" not in response.headers, path
    wasm = httpx.head(f"{edge.url}/vendor/wllama/wllama.wasm")
    assert wasm.status_code == 200 and wasm.headers["content-type"] == "application/wasm"


async def test_wllama_is_the_pinned_release_served_from_this_site() -> None:  # async: the module marks every test for its browser loop
    """The vendored copy is the version the Makefile pins, with its licence, kept out of git, and
    the device module loads it from this site only (its CDN compatibility build is switched off)."""
    root = Path(__file__).resolve().parents[2]
    pinned = re.search(r"^WLLAMA := (\S+)$", (root / "Makefile").read_text(), re.M)
    assert pinned, "the Makefile pins no wllama version"
    vendored = root / "public" / "vendor" / "wllama"
    assert (vendored / "VERSION").read_text().strip() == pinned.group(1), "public/vendor/wllama is stale: run `make vendor-wllama`"
    assert (vendored / "LICENSE").read_bytes() == (root / "public" / "vendor" / "wllama.LICENSE").read_bytes()
    ignored = subprocess.run(["git", "check-ignore", "-q", "public/vendor/wllama/wllama.wasm"], cwd=root)
    assert ignored.returncode == 0, "the 9 MB wasm must stay out of git"
    module = (root / "public" / "js" / "device-llm.mjs").read_text()
    assert 'WLLAMA_MODULE = "/vendor/wllama/index.js"' in module and "setCompat(null)" in module
