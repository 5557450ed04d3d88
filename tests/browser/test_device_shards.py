"""The device tier's download module (public/js/device-shards.mjs) in Chromium itself, on shards
made in the page and served by an injected `fetch` (no model needed): at most `parallel`
downloads at once, every shard verified and in order, a flipped byte refused by name and
fetched again, a damaged cache entry refused, and manifests that break the layout rejected."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page

from edgellm_local.emulator.server import EdgeServer

from .conftest import BROWSER_LOOP

pytestmark = BROWSER_LOOP

# Builds a manifest of `count` random shards, and a fetch that serves them with a delay, counting
# how many are in flight and flipping one byte of the shards listed in `flip` on their first read.
HARNESS = """async ({count, size, parallel, flip, damageCache}) => {
  const m = await import('/js/device-shards.mjs');
  const shards = [], bodies = new Map();
  for (let i = 0; i < count; i++) {
    const bytes = crypto.getRandomValues(new Uint8Array(size));
    const sha256 = await m.sha256Hex(bytes);
    shards.push({index: i, offset: i * size, size, sha256, path: `blobs/sha256-${sha256}`});
    bodies.set(`/models/test-model/blobs/sha256-${sha256}`, bytes);
  }
  const whole = new Uint8Array(count * size);
  shards.forEach((s, i) => whole.set(bodies.get(`/models/test-model/${s.path}`), i * size));
  const manifest = m.checkManifest({schema: m.SCHEMA, name: 'test-model',
    model: {file: 'm.gguf', size: count * size, sha256: await m.sha256Hex(whole)}, shard_size: size, shards, files: []}, 'test-model');
  let inFlight = 0, most = 0;
  const requests = [], flipped = new Set();
  const fetchImpl = async (url) => {
    requests.push(url);
    inFlight++; most = Math.max(most, inFlight);
    await new Promise((r) => setTimeout(r, 20));
    inFlight--;
    const index = shards.findIndex((s) => url.endsWith(s.path));
    let body = bodies.get(url);
    if (flip.includes(index) && !flipped.has(index)) {
      flipped.add(index);
      body = body.slice(); body[7] ^= 1;
    }
    return new Response(body);
  };
  await m.clearShardCache();
  if (damageCache !== null) {
    const cache = await caches.open(m.SHARD_CACHE);
    const bad = bodies.get(`/models/test-model/${shards[damageCache].path}`).slice(); bad[0] ^= 1;
    await cache.put(m.cacheKey(shards[damageCache]), new Response(bad));
  }
  const events = [];
  const result = await m.fetchShards(manifest, {parallel, fetchImpl, onEvent: (e) => events.push({kind: e.kind, shard: e.shard.index, message: e.message || ''})});
  const joined = new Uint8Array(await new Blob(result.blobs).arrayBuffer());
  const again = await m.fetchShards(manifest, {parallel, fetchImpl});
  return {most, requests: requests.length, events, refused: result.refused, sameBytes: (await m.sha256Hex(joined)) === manifest.model.sha256,
          shaOf: shards.map((s) => s.sha256), second: {fromCache: again.fromCache, fromNetwork: again.fromNetwork}};
}"""


async def run(page: Page, **options: Any) -> dict[str, Any]:
    defaults = {"count": 10, "size": 4096, "parallel": 3, "flip": [], "damageCache": None}
    return await page.evaluate(HARNESS, {**defaults, **options})


@pytest_asyncio.fixture(loop_scope="session")
async def module_page(page: Page, edge: EdgeServer) -> Page:
    await page.goto(f"{edge.url}/")
    return page


async def test_downloads_are_bounded_verified_in_order_and_cached(module_page: Page) -> None:
    result = await run(module_page, parallel=3)
    assert result["most"] == 3, "not bounded at `parallel` (or not parallel at all)"
    assert result["requests"] == 10 and result["refused"] == []
    assert result["sameBytes"], "the shards joined are not the model"
    assert result["second"] == {"fromCache": 10, "fromNetwork": 0}


async def test_a_flipped_byte_is_refused_by_name_and_fetched_again(module_page: Page) -> None:
    result = await run(module_page, flip=[4])
    assert result["refused"] == [f"sha256-{result['shaOf'][4]}"]
    assert [e["shard"] for e in result["events"] if e["kind"] == "refused"] == [4]
    assert result["requests"] == 11 and result["sameBytes"]


async def test_a_damaged_cache_entry_is_refused_and_downloaded(module_page: Page) -> None:
    result = await run(module_page, damageCache=2)
    assert [e["shard"] for e in result["events"] if e["kind"] == "cache-refused"] == [2]
    assert result["sameBytes"]


BAD_MANIFESTS = [
    ("wrong schema", {"schema": "other/1"}, "schema"),
    ("another model", {"name": "other-model"}, "describes"),
    ("path not its digest", {"shards": [{"index": 0, "offset": 0, "size": 10, "sha256": "a" * 64, "path": "blobs/sha256-" + "b" * 64}]}, "path"),
    ("gap between shards", {"shards": [{"index": 0, "offset": 0, "size": 5, "sha256": "a" * 64, "path": "blobs/sha256-" + "a" * 64},
                                       {"index": 1, "offset": 6, "size": 5, "sha256": "b" * 64, "path": "blobs/sha256-" + "b" * 64}]}, "offset"),
    ("sizes do not add up", {"model": {"file": "m.gguf", "size": 11, "sha256": "c" * 64}}, "add up"),
]


@pytest.mark.parametrize("label,change,words", BAD_MANIFESTS, ids=[c[0] for c in BAD_MANIFESTS])
async def test_a_manifest_breaking_the_layout_is_rejected(module_page: Page, label: str, change: dict[str, Any], words: str) -> None:
    good = {"schema": "edgellm.manifest/1", "name": "test-model", "model": {"file": "m.gguf", "size": 10, "sha256": "c" * 64},
            "shard_size": 10, "shards": [{"index": 0, "offset": 0, "size": 10, "sha256": "a" * 64, "path": "blobs/sha256-" + "a" * 64}], "files": []}
    message = await module_page.evaluate("""async (data) => {
      const m = await import('/js/device-shards.mjs');
      try { m.checkManifest(data, 'test-model'); return null; } catch (e) { return e.reason + ': ' + e.message; }
    }""", {**good, **change})
    assert message is not None, f"{label}: accepted"
    assert message.startswith("manifest: The manifest is invalid") and words in message, message


# A first visit cut off mid-download (the network fails for the shards from `cutAt` on, as a reload
# or a dropped connection would), then a second visit: the shards verified before the cut come
# from Cache Storage, only the rest are fetched.
RESUME = """async ({count, size, cutAt}) => {
  const m = await import('/js/device-shards.mjs');
  const shards = [], bodies = new Map(), whole = new Uint8Array(count * size);
  for (let i = 0; i < count; i++) {
    const bytes = crypto.getRandomValues(new Uint8Array(size));
    const sha256 = await m.sha256Hex(bytes);
    shards.push({index: i, offset: i * size, size, sha256, path: `blobs/sha256-${sha256}`});
    bodies.set(`/models/test-model/blobs/sha256-${sha256}`, bytes);
    whole.set(bytes, i * size);
  }
  const manifest = m.checkManifest({schema: m.SCHEMA, name: 'test-model',
    model: {file: 'm.gguf', size: count * size, sha256: await m.sha256Hex(whole)}, shard_size: size, shards, files: []}, 'test-model');
  await m.clearShardCache();
  const serve = (cut) => async (url) => {
    const index = shards.findIndex((s) => url.endsWith(s.path));
    if (cut && index >= cutAt) throw new TypeError('Failed to fetch');
    return new Response(bodies.get(url));
  };
  let first = null;
  try { await m.fetchShards(manifest, {parallel: 1, fetchImpl: serve(true)}); } catch (e) { first = e.reason; }
  const cache = await caches.open(m.SHARD_CACHE);
  const kept = [];
  for (const s of shards) if (await cache.match(m.cacheKey(s))) kept.push(s.index);
  const requests = [];
  const fetchImpl = serve(false);
  const second = await m.fetchShards(manifest, {parallel: 1, fetchImpl: (url) => { requests.push(shards.findIndex((s) => url.endsWith(s.path))); return fetchImpl(url); }});
  const joined = new Uint8Array(await new Blob(second.blobs).arrayBuffer());
  return {first, kept, requests, fromCache: second.fromCache, fromNetwork: second.fromNetwork, sameBytes: (await m.sha256Hex(joined)) === manifest.model.sha256};
}"""


async def test_a_download_cut_off_resumes_with_only_the_missing_shards(module_page: Page) -> None:
    result = await module_page.evaluate(RESUME, {"count": 8, "size": 4096, "cutAt": 5})
    assert result["first"] == "network", "the cut-off visit did not stop with a network error"
    assert result["kept"] == [0, 1, 2, 3, 4], "the shards verified before the cut were not kept"
    assert result["requests"] == [5, 6, 7], "the second visit fetched verified shards again (or missed some)"
    assert (result["fromCache"], result["fromNetwork"]) == (5, 3) and result["sameBytes"]


async def test_without_cache_storage_the_shards_are_kept_in_memory(module_page: Page) -> None:
    """Storage blocked (private windows, a denied quota, an opaque origin): `caches.open` throws.
    The download still completes from memory, and progress says the cache is unavailable."""
    result = await module_page.evaluate("""async () => {
      const m = await import('/js/device-shards.mjs');
      const bytes = crypto.getRandomValues(new Uint8Array(4096));
      const sha256 = await m.sha256Hex(bytes);
      const manifest = m.checkManifest({schema: m.SCHEMA, name: 'test-model', model: {file: 'm.gguf', size: 4096, sha256},
        shard_size: 4096, shards: [{index: 0, offset: 0, size: 4096, sha256, path: `blobs/sha256-${sha256}`}], files: []}, 'test-model');
      const realOpen = CacheStorage.prototype.open;
      CacheStorage.prototype.open = () => Promise.reject(new DOMException('blocked', 'SecurityError'));
      try {
        const progress = [];
        const result = await m.fetchShards(manifest, {fetchImpl: async () => new Response(bytes), onProgress: (p) => progress.push(p.cacheAvailable)});
        return {fromNetwork: result.fromNetwork, size: result.blobs[0].size, cacheAvailable: [...new Set(progress)]};
      } finally { CacheStorage.prototype.open = realOpen; }
    }""")
    assert result == {"fromNetwork": 1, "size": 4096, "cacheAvailable": [False]}


# Shard 0 is missing (404) while shard 1 is mid-download: its body has sent one chunk and sends the
# rest only when its request is aborted (the bytes were already on their way, or the shard was
# being hashed, when the other failed). `fetchShards` must abort it and settle only after it has
# stopped, so no progress or event callback comes after the caller was told the load failed.
# If the abort never comes, shard 1's body ends anyway on the first task after the 404 was handed
# over (the abort, when there is one, runs in the microtasks before it): a broken build fails the
# asserts instead of hanging.
STOP_ON_FAILURE = """async () => {
  const m = await import('/js/device-shards.mjs');
  const size = 4096, shards = [], bodies = [];
  for (let i = 0; i < 2; i++) {
    const bytes = crypto.getRandomValues(new Uint8Array(size));
    const sha256 = await m.sha256Hex(bytes);
    shards.push({index: i, offset: i * size, size, sha256, path: `blobs/sha256-${sha256}`});
    bodies.push(bytes);
  }
  const manifest = m.checkManifest({schema: m.SCHEMA, name: 'test-model',
    model: {file: 'm.gguf', size: 2 * size, sha256: 'c'.repeat(64)}, shard_size: size, shards, files: []}, 'test-model');
  await m.clearShardCache();
  let aborted = false, settled = false, late = 0, firstChunkSent, shard1Verified;
  const firstChunk = new Promise((r) => (firstChunkSent = r));
  const verified = new Promise((r) => (shard1Verified = r));
  let rest;
  const fetchImpl = async (url, init) => {
    if (url.endsWith(shards[0].path)) {
      await firstChunk;
      setTimeout(() => rest(), 0);
      return new Response('missing', {status: 404});
    }
    return new Response(new ReadableStream({start(controller) {
      controller.enqueue(bodies[1].slice(0, 1024)); firstChunkSent();
      let sent = false;
      rest = () => { if (!sent) { sent = true; controller.enqueue(bodies[1].slice(1024)); controller.close(); } };
      init?.signal?.addEventListener('abort', () => { aborted = true; rest(); });
    }}));
  };
  const count = () => { if (settled) late++; };
  let reason = null;
  try {
    await m.fetchShards(manifest, {parallel: 2, fetchImpl, onProgress: count,
      onEvent: (e) => { count(); if (e.kind === 'verified' && e.shard.index === 1) shard1Verified(); }});
  } catch (e) { reason = e.reason; }
  settled = true;
  await verified; // the in-flight shard's worker has run to its end (before or after settling)
  return {reason, aborted, late};
}"""


async def test_a_failed_shard_stops_the_downloads_in_flight_before_the_caller_hears(module_page: Page) -> None:
    result = await module_page.evaluate(STOP_ON_FAILURE)
    assert result["reason"] == "not-found", result
    assert result["aborted"], "the download in flight went on after another shard failed"
    assert result["late"] == 0, f"{result['late']} progress/event callbacks came after fetchShards had failed"
