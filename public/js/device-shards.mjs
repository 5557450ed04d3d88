/**
 * A published model's weights, fetched from the edge into the browser: the manifest
 * (`/models/{name}/manifest.json`, schema `edgellm.manifest/1`), then its content-addressed shards
 * (`/models/{name}/blobs/sha256-<hex>`), a few at a time, each checked with `crypto.subtle`
 * against the SHA-256 the manifest names before it is kept or used.
 *
 * Verified shards live in Cache Storage under a key made of their digest alone
 * (`/device-shards/sha256-<hex>`), so a reload resumes where the last visit stopped, a shard two
 * model versions share is fetched once, and a new version can never be assembled from an old
 * version's bytes. A cached shard is hashed again before use: nothing reaches the model that was
 * not verified in this visit.
 *
 * A shard whose bytes do not match is refused by name and fetched again (once); a second mismatch
 * means the manifest and the edge's blob disagree, and loading stops with that message, as it does
 * on a 404. The manifest itself is checked as `edgellm pull` checks it (local/edgellm_local/manifest.py).
 *
 * When one shard fails, the downloads still in flight are aborted and `fetchShards` settles only
 * once every one of them has stopped: no progress or event callback comes after it returns or
 * throws (a page that says "stopped" is not written over by a download nobody waits for).
 */

export const SCHEMA = "edgellm.manifest/1";
export const SHARD_CACHE = "edgellm-shards-v1";
export const DEFAULT_PARALLEL = 4;
const HEX = /^[0-9a-f]{64}$/;
const NAME = /^[a-z0-9][a-z0-9._-]{0,63}$/;

/** Why the device cannot load the model; `reason` is a short code the page and tests read. */
export class DeviceError extends Error {
  /** @param {string} message @param {{reason: string, shard?: number}} detail */
  constructor(message, { reason, shard } = { reason: "error" }) {
    super(message);
    this.name = "DeviceError";
    this.reason = reason;
    this.shard = shard;
  }
}

/** `sha256-1a2b3c4d…`: how a shard is named in messages (its blob name, shortened). */
export function shardLabel(shard) {
  return `shard ${shard.index} (sha256-${shard.sha256.slice(0, 12)}…)`;
}

function bad(message) {
  return new DeviceError(`The manifest is invalid: ${message}.`, { reason: "manifest" });
}

/**
 * The manifest as validated values (a pure function): schema, name, digests, paths that are
 * exactly `blobs/sha256-<digest>`, contiguous shards adding up to the model's size.
 */
export function checkManifest(data, name) {
  if (!data || typeof data !== "object") throw bad("it is not a JSON object");
  if (data.schema !== SCHEMA) throw bad(`schema is ${JSON.stringify(data.schema)}, expected ${SCHEMA}`);
  if (typeof data.name !== "string" || !NAME.test(data.name)) throw bad("name is not a model name");
  if (name && data.name !== name) throw bad(`it describes ${JSON.stringify(data.name)}, not ${JSON.stringify(name)}`);
  const model = data.model;
  const isSize = (n) => Number.isSafeInteger(n) && n >= 0;
  if (!model || !isSize(model.size) || !HEX.test(model.sha256 || "")) throw bad("model needs a size and a sha256");
  if (!isSize(data.shard_size) || !Array.isArray(data.shards) || data.shards.length === 0) throw bad("it lists no shards");
  let offset = 0;
  const shards = data.shards.map((s, i) => {
    if (!s || s.index !== i) throw bad(`shards[${i}].index must be ${i}`);
    if (!HEX.test(s.sha256 || "")) throw bad(`shards[${i}].sha256 is not 64 lowercase hex digits`);
    if (s.path !== `blobs/sha256-${s.sha256}`) throw bad(`shards[${i}].path must be blobs/sha256-<its sha256>`);
    if (s.offset !== offset) throw bad(`shards[${i}].offset is ${s.offset}, expected ${offset}`);
    if (!isSize(s.size) || s.size === 0 || s.size > data.shard_size) throw bad(`shards[${i}].size is not in 1..shard_size`);
    offset += s.size;
    return { index: i, offset: s.offset, size: s.size, sha256: s.sha256, path: s.path };
  });
  if (offset !== model.size) throw bad(`the shards add up to ${offset} bytes but model.size is ${model.size}`);
  const files = Array.isArray(data.files) ? data.files : [];
  return { name: data.name, model: { file: model.file, size: model.size, sha256: model.sha256 }, shardSize: data.shard_size, shards, files };
}

/** Read and check a model's manifest from the edge (revalidated every visit: it can be republished). */
export async function readManifest(name, { signal, fetchImpl = fetch } = {}) {
  const url = `/models/${encodeURIComponent(name)}/manifest.json`;
  let response;
  try {
    response = await fetchImpl(url, { cache: "no-cache", signal });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new DeviceError(`The edge could not be reached for ${url}: ${error.message}.`, { reason: "network" });
  }
  if (response.status === 404) throw new DeviceError(`No model ${JSON.stringify(name)} is published on this edge (${url} answered 404).`, { reason: "not-found" });
  if (!response.ok) throw new DeviceError(`${url} answered ${response.status}.`, { reason: "network" });
  let data;
  try {
    data = await response.json();
  } catch {
    throw bad("it is not valid JSON");
  }
  return checkManifest(data, name);
}

/** Lowercase hex SHA-256 of the bytes. */
export async function sha256Hex(bytes) {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

/** The Cache Storage key of a shard: its digest only, so versions never mix. */
export function cacheKey(shard) {
  return new URL(`/device-shards/sha256-${shard.sha256}`, location.origin).href;
}

/**
 * Download speed and time left from the bytes that came over the network (a pure class: the
 * clock is passed in). Cached bytes count towards progress but not towards the rate.
 */
export class ProgressMeter {
  constructor(total, now = () => performance.now()) {
    this.total = total;
    this.now = now;
    this.started = now();
    this.cached = 0;
    this.network = 0;
    this.samples = [[this.started, 0]];
  }

  add(bytes, fromCache) {
    if (fromCache) this.cached += bytes;
    else {
      this.network += bytes;
      this.samples.push([this.now(), this.network]);
      if (this.samples.length > 64) this.samples.shift();
    }
  }

  /** Bytes per second over the last few seconds of network transfer (null before any). */
  rate() {
    const [t1, b1] = this.samples[this.samples.length - 1];
    const windowStart = this.samples.find(([t]) => t1 - t <= 3000) || this.samples[0];
    const [t0, b0] = windowStart === this.samples[this.samples.length - 1] ? this.samples[0] : windowStart;
    const seconds = (t1 - t0) / 1000;
    return seconds > 0.05 && b1 > b0 ? (b1 - b0) / seconds : null;
  }

  snapshot(extra = {}) {
    const loaded = this.cached + this.network;
    const rate = this.rate();
    const left = this.total - loaded;
    return { loaded, total: this.total, cached: this.cached, network: this.network, rate, secondsLeft: rate ? left / rate : null, ...extra };
  }
}

async function openCache() {
  try {
    return typeof caches === "undefined" ? null : await caches.open(SHARD_CACHE);
  } catch {
    return null; // storage blocked (private mode, quota): the download still works, it just cannot resume
  }
}

/** Read a response body, reporting each chunk, into one buffer of the expected size. */
async function readBody(response, size, onBytes) {
  const reader = response.body.getReader();
  const bytes = new Uint8Array(size);
  let at = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (at + value.byteLength > size) {
      await reader.cancel();
      return null; // longer than the manifest says: not this shard
    }
    bytes.set(value, at);
    at += value.byteLength;
    onBytes(value.byteLength);
  }
  return at === size ? bytes : null;
}

/**
 * Every shard of `manifest`, verified, in order, as Blobs (`new Blob(result)` is the GGUF).
 *
 * @param {ReturnType<typeof checkManifest>} manifest
 * @param {{parallel?: number, signal?: AbortSignal, onProgress?: (p: object) => void,
 *          onEvent?: (e: {kind: string, shard: object, message?: string}) => void, fetchImpl?: typeof fetch}} options
 * @returns {Promise<{blobs: Blob[], fromCache: number, fromNetwork: number, refused: string[]}>}
 */
export async function fetchShards(manifest, { parallel = DEFAULT_PARALLEL, signal, onProgress = () => {}, onEvent = () => {}, fetchImpl = fetch } = {}) {
  const cache = await openCache();
  // the caller's signal, or a failure of another shard: either stops every download in flight
  const failed = new AbortController();
  const downloads = signal ? AbortSignal.any([signal, failed.signal]) : failed.signal;
  const meter = new ProgressMeter(manifest.model.size);
  const blobs = new Array(manifest.shards.length);
  const counts = { fromCache: 0, fromNetwork: 0, verified: 0, refused: [] };
  const report = () => onProgress(meter.snapshot({ shardsDone: counts.verified, shardsTotal: manifest.shards.length, cacheAvailable: !!cache }));

  async function fromCache(shard) {
    if (!cache) return null;
    const hit = await cache.match(cacheKey(shard));
    if (!hit) return null;
    const bytes = new Uint8Array(await hit.arrayBuffer());
    if (bytes.byteLength === shard.size && (await sha256Hex(bytes)) === shard.sha256) return bytes;
    await cache.delete(cacheKey(shard)); // damaged on disk: fetch it again
    onEvent({ kind: "cache-refused", shard, message: `${shardLabel(shard)} in the browser cache did not match its hash; fetching it again` });
    return null;
  }

  async function fromNetwork(shard) {
    const url = `/models/${encodeURIComponent(manifest.name)}/${shard.path}`;
    for (let attempt = 1; attempt <= 2; attempt++) {
      let response;
      try {
        response = await fetchImpl(url, { cache: "no-store", signal: downloads });
      } catch (error) {
        if (error.name === "AbortError") throw error;
        throw new DeviceError(`Downloading ${shardLabel(shard)} failed: ${error.message}.`, { reason: "network", shard: shard.index });
      }
      if (response.status === 404) {
        throw new DeviceError(`The edge has no ${shardLabel(shard)} (${url} answered 404): the model is not fully published.`, { reason: "not-found", shard: shard.index });
      }
      if (!response.ok) throw new DeviceError(`Downloading ${shardLabel(shard)} failed: the edge answered ${response.status}.`, { reason: "network", shard: shard.index });
      let counted = 0;
      const bytes = await readBody(response, shard.size, (n) => { counted += n; meter.add(n, false); report(); });
      const ok = bytes !== null && (await sha256Hex(bytes)) === shard.sha256;
      if (ok) return bytes;
      meter.network -= counted; // the refused bytes are not progress
      const label = `sha256-${shard.sha256}`;
      counts.refused.push(label);
      onEvent({ kind: "refused", shard, message: `Refused ${shardLabel(shard)}: its bytes do not match the manifest's SHA-256${attempt === 1 ? "; fetching it again" : ""}.` });
      report();
    }
    throw new DeviceError(
      `${shardLabel(shard)} does not match the SHA-256 in the manifest after two downloads: the manifest and the edge's blob disagree. Nothing unverified was given to the model.`,
      { reason: "corrupt", shard: shard.index },
    );
  }

  async function one(shard) {
    let bytes = await fromCache(shard);
    if (bytes) {
      counts.fromCache++;
      meter.add(shard.size, true);
    } else {
      bytes = await fromNetwork(shard);
      counts.fromNetwork++;
      if (cache) {
        try {
          await cache.put(cacheKey(shard), new Response(bytes, { headers: { "content-type": "application/octet-stream", "content-length": String(shard.size) } }));
        } catch {
          onEvent({ kind: "cache-full", shard, message: `${shardLabel(shard)} could not be kept in the browser cache (storage full?)` });
        }
      }
    }
    blobs[shard.index] = new Blob([bytes]);
    counts.verified++;
    onEvent({ kind: "verified", shard });
    report();
  }

  report();
  const queue = [...manifest.shards];
  let firstError = null; // the failure that stopped the rest (theirs are the AbortErrors it caused)
  const workers = Array.from({ length: Math.max(1, Math.min(parallel, queue.length)) }, async () => {
    while (queue.length && !failed.signal.aborted) {
      if (signal?.aborted) throw signal.reason ?? new DOMException("Aborted", "AbortError");
      const shard = queue.shift();
      try {
        await one(shard);
      } catch (error) {
        if (!failed.signal.aborted) firstError = error;
        failed.abort();
        throw error;
      }
    }
  });
  await Promise.allSettled(workers);
  if (firstError) throw firstError;
  if (signal?.aborted) throw signal.reason ?? new DOMException("Aborted", "AbortError");
  return { blobs, fromCache: counts.fromCache, fromNetwork: counts.fromNetwork, refused: counts.refused };
}

/** Forget every cached shard (the page's "Clear downloaded model"). */
export async function clearShardCache() {
  if (typeof caches !== "undefined") await caches.delete(SHARD_CACHE);
}
