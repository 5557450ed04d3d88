/**
 * Model artifacts from the edge (`GET /models`, `/models/{name}/tokenizer.json`, ...) and how the
 * browser's HTTP cache answered for each file.
 *
 * The edge serves tokenizer files with a strong ETag and "revalidate" caching, so a reload should
 * cost one small 304, not the whole file again. `fetch` hides that (a revalidated response reads
 * as 200 with the cached body, and Chromium's `responseStatus` says 200 too), so the answer comes
 * from Resource Timing's `transferSize`, which the spec fixes to hide header sizes: 0 when no
 * request went out, 300 when the cached body was revalidated (a 304), body size + 300 when the
 * body came over the network.
 */
import { errorFrom } from "./api-errors.mjs";

/** Resource Timing's stand-in for the size of response headers (Resource Timing Level 2). */
const HEADER_ESTIMATE = 300;

/** @typedef {{kind: "network"|"revalidated"|"cache"|"unknown", status: number|null, transferSize: number|null, bodySize: number|null}} Delivery */

/**
 * How one response was delivered, from its PerformanceResourceTiming entry (a pure function).
 * @param {{responseStatus?: number, transferSize?: number, encodedBodySize?: number} | undefined} entry
 * @returns {Delivery}
 */
export function classifyDelivery(entry) {
  if (!entry) return { kind: "unknown", status: null, transferSize: null, bodySize: null };
  const transferSize = entry.transferSize ?? null;
  const bodySize = entry.encodedBodySize ?? null;
  let kind = "network";
  if (entry.responseStatus === 304) kind = "revalidated";
  else if (transferSize === 0 && bodySize > 0) kind = "cache";
  else if (transferSize > 0 && bodySize > 0 && transferSize < bodySize + HEADER_ESTIMATE) kind = "revalidated";
  const status = kind === "revalidated" ? 304 : kind === "network" ? entry.responseStatus || 200 : null;
  return { kind, status, transferSize, bodySize };
}

/** A headline and a detail line for a delivery: ["304 revalidated", "1.49 MB from the browser cache · ETag ..."]. */
export function describeDelivery(delivery, etag) {
  const size = (n) => (n == null ? "?" : n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KB` : `${(n / 1048576).toFixed(2)} MB`);
  const tag = etag ? ` · ETag ${etag.replace(/^(W\/)?"(.{8}).+"$/, '$1"$2…"')}` : "";
  switch (delivery.kind) {
    case "revalidated": return ["304 revalidated", `${size(delivery.bodySize)} from the browser cache${tag}`];
    case "cache": return ["from the browser cache", `no request sent${tag}`];
    case "network": return [`${delivery.status} downloaded`, `${size(delivery.bodySize)} over the network${tag}`];
    default: return ["loaded", tag.slice(3)];
  }
}

/** The latest Resource Timing entry for `url`, waiting briefly: entries are queued after the body ends. */
async function timingEntry(url) {
  for (let attempt = 0; attempt < 20; attempt++) {
    const entries = performance.getEntriesByName(url, "resource");
    if (entries.length) return entries[entries.length - 1];
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  return undefined;
}

/**
 * Fetch a JSON artifact, always revalidating with the server (`cache: "no-cache"` sends the
 * cached ETag as If-None-Match), and report how it was delivered.
 * @returns {Promise<{data: any, delivery: Delivery, etag: string|null} | null>} null on 404 when `optional`
 */
export async function fetchJsonArtifact(path, { optional = false } = {}) {
  const url = new URL(path, location.href).href;
  const response = await fetch(url, { cache: "no-cache" });
  if (optional && response.status === 404) return null;
  if (!response.ok) throw await errorFrom(response);
  const data = await response.json();
  const delivery = classifyDelivery(await timingEntry(url));
  return { data, delivery, etag: response.headers.get("etag") };
}

/** The models the edge publishes: `GET /models` -> `[{name, manifest}]`. */
export async function listPublishedModels() {
  const response = await fetch("/models", { cache: "no-cache", headers: { accept: "application/json" } });
  if (!response.ok) throw await errorFrom(response);
  const body = await response.json();
  return Array.isArray(body.data) ? body.data : [];
}
