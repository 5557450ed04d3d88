/**
 * Two OpenAI-shaped clients with one API, so a page switches tiers with one switch:
 * `client.chat.completions.create({messages, stream, max_tokens, temperature, ...})` resolves to
 * a `chat.completion` object, or with `stream: true` to an async iterable of the
 * `chat.completion.chunk` objects the edge streams (a first chunk with the role, one per piece of
 * text, a last one with `finish_reason` and `edgellm_route`, then `usage` when
 * `stream_options.include_usage` asks for it).
 *
 * - `EdgeLLM`: `/v1/chat/completions` on this origin, streamed over SSE.
 * - `DeviceLLM`: the same model, downloaded from the edge shard by shard (device-shards.mjs),
 *   verified, and run by llama.cpp compiled to WebAssembly (`@wllama/wllama`, vendored under
 *   /vendor/wllama/, never a CDN) in its own Web Worker. wllama 3 runs llama-server's own request
 *   code, so the chat template (the GGUF's, through its Jinja engine) and the stop rules (the
 *   model's end-of-generation tokens plus the request's `stop`) are the ones the local edge's
 *   llama.cpp applies. The edge's request defaults (Workers AI's: max_tokens 256, temperature 0.6)
 *   and its control-token rule (message text never becomes a control token: a WORD JOINER breaks
 *   it, local/edgellm_local/control_tokens.py) are applied here too.
 *
 * `openTier` decides where a conversation runs: on the device when it can, at the edge otherwise,
 * with the reason (missing WebAssembly features, too little memory for the model, a failed or
 * corrupt download, or the user's choice).
 */
import { ApiError, errorFrom } from "./api-errors.mjs";
import { SSEDecoder } from "./sse.mjs";
import { DeviceError, fetchShards, readManifest, sha256Hex } from "./device-shards.mjs";

export const WLLAMA_MODULE = "/vendor/wllama/index.js";
export const WLLAMA_WASM = "/vendor/wllama/wllama.wasm";
/** The edge's defaults for what a request leaves out (Workers AI's text-generation schema). */
export const EDGE_DEFAULTS = { max_tokens: 256, temperature: 0.6 };
export const DEVICE_CONTEXT = 2048;
const MIB = 1024 * 1024;
const GIB = 1024 * MIB;
/** wllama's WebAssembly heap stops at 4 GiB (its worker asks for at most that). */
const WASM_HEAP_LIMIT = 4 * GIB;
const JOINER = "\u2060";

// --- what the device can do --------------------------------------------------------------------

// Smallest modules using one feature each (as wasm-feature-detect writes them).
const SIMD_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 5, 1, 96, 0, 1, 123, 3, 2, 1, 0, 10, 10, 1, 8, 0, 65, 0, 253, 15, 253, 98, 11]);
const EXCEPTIONS_PROBE = new Uint8Array([0, 97, 115, 109, 1, 0, 0, 0, 1, 4, 1, 96, 0, 0, 3, 2, 1, 0, 10, 8, 1, 6, 0, 6, 64, 25, 11, 11]);

function hasMemory64() {
  try {
    new WebAssembly.Memory({ address: "i64", initial: 1n });
    return true;
  } catch {
    return false;
  }
}

/**
 * What this browser lacks for the device tier (empty when nothing), and how many threads it may use.
 * @param {{threads?: number}} options
 */
export function deviceSupport({ threads } = {}) {
  const missing = [];
  if (typeof WebAssembly !== "object") missing.push("WebAssembly");
  else {
    if (!WebAssembly.validate(SIMD_PROBE)) missing.push("WebAssembly SIMD");
    if (!WebAssembly.validate(EXCEPTIONS_PROBE)) missing.push("WebAssembly exception handling");
    if (!hasMemory64()) missing.push("WebAssembly 64-bit memory");
    if (!WebAssembly.Suspending) missing.push("WebAssembly JavaScript Promise Integration (JSPI)");
  }
  if (typeof Worker === "undefined") missing.push("Web Workers");
  if (!globalThis.crypto?.subtle) missing.push("crypto.subtle (the page must be served over HTTPS)");
  const isolated = globalThis.crossOriginIsolated === true && typeof SharedArrayBuffer === "function";
  const cores = navigator.hardwareConcurrency || 1;
  const wanted = threads ?? Math.min(4, cores);
  const nThreads = isolated ? Math.max(1, wanted) : 1;
  return { missing, multiThread: isolated && nThreads > 1, threads: nThreads, crossOriginIsolated: isolated, cores };
}

/**
 * Memory the model needs on the device, from its manifest: the weights (held once in the
 * WebAssembly heap), a KV cache and compute buffers (estimated as a quarter of the weights, for
 * a small context), and the runtime itself (about 160 MiB). An estimate, stated as one.
 */
export function memoryNeed(manifest) {
  return Math.round(manifest.model.size * 1.25 + 160 * MIB);
}

/**
 * Memory a page may use: half of what the device reports (`navigator.deviceMemory`, in GiB,
 * Chromium only), never more than wllama's 4 GiB heap. Null when the browser does not say.
 */
export function memoryBudget(deviceMemoryGiB = navigator.deviceMemory) {
  if (typeof deviceMemoryGiB !== "number" || !(deviceMemoryGiB > 0)) return null;
  return Math.min(WASM_HEAP_LIMIT, (deviceMemoryGiB * GIB) / 2);
}

export function formatBytes(n) {
  if (n == null) return "—";
  if (n < 1024) return `${n} B`;
  if (n < MIB) return `${(n / 1024).toFixed(1)} KB`;
  if (n < GIB) return `${(n / MIB).toFixed(1)} MB`;
  return `${(n / GIB).toFixed(2)} GB`;
}

// --- the chunks both tiers return ---------------------------------------------------------------

/** Break every control token's text in message content (as the edge does before its template). */
export function defuseMessages(messages, specials) {
  if (!specials.length) return messages;
  const defuse = (text) => specials.reduce((t, s) => t.split(s).join(s[0] + JOINER + s.slice(1)), text);
  return messages.map((m) => {
    if (typeof m.content === "string") return { ...m, content: defuse(m.content) };
    if (Array.isArray(m.content)) return { ...m, content: m.content.map((p) => (p && typeof p.text === "string" ? { ...p, text: defuse(p.text) } : p)) };
    return m;
  });
}

function newId() {
  return `chatcmpl-${crypto.randomUUID ? crypto.randomUUID().replaceAll("-", "") : Math.random().toString(36).slice(2)}`;
}

/** Turns wllama's (llama-server's) stream into the edge's chunk sequence. */
async function* edgeShapedChunks(source, { model, includeUsage }) {
  const id = newId();
  const created = Math.floor(Date.now() / 1000);
  const chunk = (choice, extra = {}) => ({ id, object: "chat.completion.chunk", created, model, system_fingerprint: null,
    choices: choice ? [choice] : [], ...(includeUsage ? { usage: null } : {}), ...extra });
  yield chunk({ index: 0, delta: { role: "assistant", content: "" }, logprobs: null, finish_reason: null });
  let finish = null;
  let usage = null;
  for await (const part of source) {
    const choice = part.choices?.[0];
    const text = choice?.delta?.content;
    if (text) yield chunk({ index: 0, delta: { content: text }, logprobs: null, finish_reason: null });
    if (choice?.finish_reason) finish = choice.finish_reason;
    if (part.usage) usage = part.usage;
  }
  yield chunk({ index: 0, delta: {}, logprobs: null, finish_reason: finish || "stop" }, { edgellm_route: "device" });
  if (includeUsage) {
    const u = usage || {};
    const cached = u.prompt_tokens_details?.cached_tokens;
    // the prompt tokens llama.cpp reused from its cache, in the edge's field (it sends it when its runner knows)
    const details = Number.isInteger(cached) ? { prompt_tokens_details: { cached_tokens: cached } } : {};
    yield chunk(null, { usage: { prompt_tokens: u.prompt_tokens ?? 0, completion_tokens: u.completion_tokens ?? 0, total_tokens: u.total_tokens ?? 0, ...details } });
  }
}

/** The whole answer from a chunk stream, as `chat.completion`. */
async function collect(chunks) {
  let first = null;
  let text = "";
  let finish = null;
  let usage = null;
  let route = null;
  for await (const c of chunks) {
    first ??= c;
    const choice = c.choices?.[0];
    if (choice?.delta?.content) text += choice.delta.content;
    if (choice?.finish_reason) finish = choice.finish_reason;
    if (c.usage) usage = c.usage;
    if (c.edgellm_route) route = c.edgellm_route;
  }
  return { id: first?.id, object: "chat.completion", created: first?.created, model: first?.model, system_fingerprint: null,
    choices: [{ index: 0, message: { role: "assistant", content: text }, logprobs: null, finish_reason: finish }],
    usage, edgellm_route: route };
}

// --- the edge ------------------------------------------------------------------------------------

/** `/v1/chat/completions` on this origin. */
export class EdgeLLM {
  tier = "edge";

  constructor({ headers = {} } = {}) {
    this.headers = headers;
    this.chat = { completions: { create: (request) => this.#create(request) } };
  }

  /** `headers` (per request: a session's `x-session-affinity`) and `onResponse` (the response,
   * before its body: its cache and model headers) are the edge's own; the device ignores them. */
  async #create({ signal, headers = {}, onResponse, ...request }) {
    const stream = !!request.stream;
    const body = { ...request, stream: true, stream_options: { include_usage: true, ...(request.stream_options || {}) } };
    const response = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: { "content-type": "application/json", accept: "text/event-stream", ...this.headers, ...headers },
      body: JSON.stringify(body),
      signal,
    });
    if (!response.ok) throw await errorFrom(response);
    onResponse?.(response);
    const chunks = sseChunks(response, request.stream_options?.include_usage === true || !stream);
    return stream ? chunks : collect(chunks);
  }
}

async function* sseChunks(response, includeUsage) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  const decoder = new SSEDecoder();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      for (const data of done ? decoder.flush() : decoder.feed(value)) {
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new ApiError(chunk.error.message || "The stream failed.", response.status);
        if (!includeUsage && chunk.choices?.length === 0 && chunk.usage) continue; // asked for by us, not by the caller
        if (!includeUsage) delete chunk.usage;
        yield chunk;
      }
      if (done) throw new ApiError("The stream ended before the answer was complete.", response.status);
    }
  } finally {
    reader.releaseLock();
    response.body.cancel().catch(() => {});
  }
}

// --- the device ----------------------------------------------------------------------------------

/** Control tokens' texts from the model's tokenizer_config.json (checked against the manifest's hash). */
async function controlTokens(manifest, signal) {
  const entry = manifest.files.find((f) => f.path === "tokenizer_config.json");
  if (!entry) return [];
  const response = await fetch(`/models/${encodeURIComponent(manifest.name)}/tokenizer_config.json`, { cache: "no-cache", signal });
  if (!response.ok) return [];
  const bytes = new Uint8Array(await response.arrayBuffer());
  if ((await sha256Hex(bytes)) !== entry.sha256) {
    throw new DeviceError("tokenizer_config.json does not match the SHA-256 in the manifest.", { reason: "corrupt" });
  }
  const config = JSON.parse(new TextDecoder().decode(bytes));
  const decoder = config.added_tokens_decoder || {};
  return Object.values(decoder).filter((t) => t && t.special && typeof t.content === "string" && t.content.length > 1).map((t) => t.content);
}

/** The model run by llama.cpp in WebAssembly, in a Web Worker; `open` downloads and loads it. */
export class DeviceLLM {
  tier = "device";

  constructor(wllama, manifest, specials, info) {
    this.wllama = wllama;
    this.manifest = manifest;
    this.specials = specials;
    this.info = info;
    this.chat = { completions: { create: (request) => this.#create(request) } };
    this.busy = Promise.resolve();
  }

  /**
   * Download (or resume from the cache), verify and load `name`.
   * @param {string} name
   * @param {{threads?: number, parallel?: number, signal?: AbortSignal, onProgress?: Function, onEvent?: Function, onStage?: Function}} options
   */
  static async open(name, { threads, parallel, signal, onProgress, onEvent, onStage = () => {} } = {}) {
    const support = deviceSupport({ threads });
    if (support.missing.length) {
      throw new DeviceError(`This browser lacks ${support.missing.join(", ")}.`, { reason: "unsupported" });
    }
    onStage("manifest");
    const manifest = await readManifest(name, { signal });
    const need = memoryNeed(manifest);
    const budget = memoryBudget();
    if (budget !== null && need > budget) {
      throw new DeviceError(
        `The model needs about ${formatBytes(need)} of memory; this device reports ${navigator.deviceMemory} GB, and a page may use about ${formatBytes(budget)}.`,
        { reason: "memory" },
      );
    }
    const started = performance.now();
    onStage("download");
    // either failing stops the other, and both have stopped before `open` settles (no late progress)
    const stop = new AbortController();
    const both = signal ? AbortSignal.any([signal, stop.signal]) : stop.signal;
    let firstError = null;
    const jobs = [fetchShards(manifest, { parallel, signal: both, onProgress, onEvent }), controlTokens(manifest, both)]
      .map((job) => job.catch((error) => {
        if (!stop.signal.aborted) firstError = error;
        stop.abort();
        throw error;
      }));
    const [got, tokens] = await Promise.allSettled(jobs);
    if (firstError) throw firstError;
    const [shards, specials] = [got.value, tokens.value];
    const downloaded = performance.now();
    onStage("load");
    const { Wllama } = await import(WLLAMA_MODULE);
    const wllama = new Wllama({ default: new URL(WLLAMA_WASM, location.href).href }, { suppressNativeLog: true, allowOffline: true });
    wllama.setCompat(null); // its compatibility build is only on a CDN: without JSPI the device tier is refused above instead
    try {
      // one Blob of verified bytes (the shards are byte ranges of one GGUF, not gguf-split files)
      await wllama.loadModel([new Blob(shards.blobs)], { n_threads: support.threads, n_ctx: DEVICE_CONTEXT, n_gpu_layers: 0, n_parallel: 1, jinja: true });
    } catch (error) {
      await wllama.exit().catch(() => {});
      throw new DeviceError(`llama.cpp could not load the model in this browser: ${error.message || error}.`, { reason: "load" });
    }
    const loaded = performance.now();
    return new DeviceLLM(wllama, manifest, specials, {
      model: manifest.name, bytes: manifest.model.size, shards: manifest.shards.length,
      fromCache: shards.fromCache, fromNetwork: shards.fromNetwork, refused: shards.refused,
      threads: wllama.getNumThreads ? wllama.getNumThreads() : support.threads,
      multiThread: wllama.isMultithread ? wllama.isMultithread() : support.multiThread,
      crossOriginIsolated: support.crossOriginIsolated,
      downloadMs: downloaded - started, loadMs: loaded - downloaded, memoryNeed: need, memoryBudget: budget,
    });
  }

  async #create({ signal, messages, stream, stream_options: streamOptions, headers, onResponse, ...rest }) {
    const request = { ...EDGE_DEFAULTS, ...Object.fromEntries(Object.entries(rest).filter(([, v]) => v != null)) };
    delete request.model;
    const body = { ...request, messages: defuseMessages(messages, this.specials), stream: true,
      stream_options: { include_usage: true }, abortSignal: signal };
    // one generation at a time: the worker runs llama.cpp's single loop
    const previous = this.busy;
    let release;
    this.busy = new Promise((resolve) => (release = resolve));
    await previous;
    let source;
    try {
      source = await this.wllama.createChatCompletion(body);
    } catch (error) {
      release();
      throw new ApiError(`The device could not start the answer: ${error.message || error}`, 500);
    }
    const model = this.manifest.name;
    const includeUsage = streamOptions?.include_usage === true || !stream;
    async function* guarded() {
      try {
        yield* edgeShapedChunks(source, { model, includeUsage });
      } finally {
        release();
      }
    }
    return stream ? guarded() : collect(guarded());
  }

  async close() {
    await this.wllama.exit().catch(() => {});
  }
}

/**
 * The client a conversation uses: the device when asked and able, else the edge, with why.
 * @returns {Promise<{client: DeviceLLM|EdgeLLM, tier: "device"|"edge", reason: string|null, code: string|null}>}
 */
export async function openTier(name, { prefer = "device", ...options } = {}) {
  if (prefer !== "device") return { client: new EdgeLLM(), tier: "edge", reason: "You chose to run answers at the edge.", code: "choice" };
  try {
    return { client: await DeviceLLM.open(name, options), tier: "device", reason: null, code: null };
  } catch (error) {
    if (error.name === "AbortError") throw error;
    const code = error instanceof DeviceError ? error.reason : "load";
    return { client: new EdgeLLM(), tier: "edge", reason: error.message || String(error), code, error };
  }
}
