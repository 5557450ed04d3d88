/**
 * The on-device chat page: downloads the chosen published model from the edge (progress, speed,
 * time left, shards verified, how many came from the browser cache), loads it into llama.cpp in
 * WebAssembly, and chats with it; or chats with the edge when the device cannot, saying why.
 *
 * `document.body.dataset` says where the page is, for dev tools and the browser tests:
 * `state` (starting, loading, ready, streaming, done, error), `tier` (device, edge) and
 * `fallback` (why the edge answers: unsupported, memory, corrupt, not-found, network, manifest,
 * load, choice). Query parameters: `model`, `tier=edge`, `threads`, `parallel`.
 */
import { formatBytes, openTier } from "./device-llm.mjs";
import { clearShardCache } from "./device-shards.mjs";
import { listPublishedModels } from "./artifacts.mjs";

const DEFAULT_MODEL = "smollm2-135m";
const $ = (id) => document.getElementById(id);
const ui = {
  tierRadios: [...document.querySelectorAll('input[name="tier"]')], model: $("model"), clear: $("clear-cache"),
  tierNow: $("tier-now"), notice: $("notice"), download: $("download"), progress: $("progress"),
  progressText: $("progress-text"), bytes: $("stat-bytes"), rate: $("stat-rate"), eta: $("stat-eta"),
  shards: $("stat-shards"), cached: $("stat-cached"), threads: $("stat-threads"), events: $("events"),
  transcript: $("transcript"), status: $("status"), error: $("error"), form: $("ask"), prompt: $("prompt"),
  maxTokens: $("max-tokens"), deterministic: $("deterministic"), send: $("send"), stop: $("stop"), newChat: $("new-chat"),
  ran: $("stat-ran"), ttft: $("stat-ttft"), tps: $("stat-tps"), tokens: $("stat-tokens"),
};
const params = new URLSearchParams(location.search);
const state = { client: null, tier: null, messages: [], controller: null, loading: null };

function setState(name) {
  document.body.dataset.state = name;
}

function seconds(s) {
  if (s == null || !Number.isFinite(s)) return "—";
  if (s < 1) return "under a second";
  if (s < 90) return `${Math.round(s)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

function showProgress(p) {
  const fraction = p.total ? p.loaded / p.total : 0;
  ui.progress.value = fraction;
  ui.progress.textContent = `${Math.round(fraction * 100)}%`;
  ui.bytes.textContent = `${formatBytes(p.loaded)} of ${formatBytes(p.total)}`;
  ui.rate.textContent = p.rate ? `${formatBytes(p.rate)}/s` : "—";
  ui.eta.textContent = p.loaded >= p.total ? "done" : seconds(p.secondsLeft);
  ui.shards.textContent = `${p.shardsDone} of ${p.shardsTotal}`;
  ui.cached.textContent = p.cacheAvailable ? formatBytes(p.cached) : "no cache (storage unavailable)";
  ui.progressText.textContent = `${Math.round(fraction * 100)}% · ${ui.bytes.textContent}${p.rate ? ` at ${ui.rate.textContent}` : ""}`;
}

function logEvent(event) {
  if (event.kind === "verified") return;
  const li = document.createElement("li");
  li.className = event.kind;
  li.dataset.shard = String(event.shard.index);
  li.textContent = event.message;
  ui.events.append(li);
}

function showTier(tier, text) {
  document.body.dataset.tier = tier;
  ui.tierNow.dataset.tier = tier;
  ui.tierNow.textContent = text;
}

function showNotice(title, detail) {
  ui.notice.replaceChildren();
  const strong = document.createElement("strong");
  strong.textContent = title;
  const p = document.createElement("span");
  p.textContent = detail;
  ui.notice.append(strong, p);
  ui.notice.hidden = false;
}

/** Load the device tier (or not) for the chosen model; the edge answers whenever it cannot. */
async function choose(prefer) {
  state.loading?.abort();
  const controller = (state.loading = new AbortController());
  await state.client?.close?.();
  state.client = null;
  ui.send.disabled = true;
  ui.notice.hidden = true;
  ui.events.replaceChildren();
  ui.error.textContent = "";
  setState("loading");
  delete document.body.dataset.fallback;
  const model = ui.model.value || DEFAULT_MODEL;
  if (prefer === "device") {
    ui.download.hidden = false;
    showTier("loading", `Preparing ${model} for this device…`);
    ui.status.textContent = "Reading the model's manifest from the edge…";
  }
  let result;
  try {
    result = await openTier(model, {
      prefer,
      threads: params.has("threads") ? Number(params.get("threads")) : undefined,
      parallel: params.has("parallel") ? Number(params.get("parallel")) : undefined,
      signal: controller.signal,
      onProgress: showProgress, // never called once openTier settles (device-shards.mjs), so "stopped" stays
      onEvent: logEvent,
      onStage: (stage) => {
        ui.status.textContent = { manifest: "Reading the model's manifest from the edge…",
          download: "Downloading and verifying the shards…", load: "Loading the model into llama.cpp (WebAssembly)…" }[stage];
      },
    });
  } catch (error) {
    if (error.name === "AbortError") return;
    throw error;
  }
  if (controller.signal.aborted) return;
  state.client = result.client;
  state.tier = result.tier;
  window.edgellmDevice = result.tier === "device" ? result.client.info : null; // for dev tools and bench/bench_device.py
  window.edgellmClient = result.client;
  if (result.tier === "device") {
    const i = result.client.info;
    ui.threads.textContent = `${i.threads}${i.multiThread ? " (multi-thread build)" : " (single thread)"}`;
    const from = i.fromNetwork === 0 ? "started from the browser cache" : i.fromCache ? `${i.fromCache} shards from the browser cache, ${i.fromNetwork} downloaded` : "downloaded";
    showTier("device", `Answers run on this device: ${i.model}, ${formatBytes(i.bytes)}, ${from}, all ${i.shards} shards verified.`);
    ui.status.textContent = `Ready in ${((i.downloadMs + i.loadMs) / 1000).toFixed(1)} s (download and verify ${(i.downloadMs / 1000).toFixed(1)} s, load ${(i.loadMs / 1000).toFixed(1)} s).`;
  } else {
    document.body.dataset.fallback = result.code;
    ui.eta.textContent = ui.rate.textContent = "stopped";
    ui.download.hidden = result.code === "choice" || ui.events.childElementCount === 0 && result.code !== "corrupt";
    showTier("edge", "Answers run at the edge (/v1/chat/completions).");
    // the switch shows where answers run (choosing "On this device" again retries), as on /chat
    for (const radio of ui.tierRadios) radio.checked = radio.value === "edge";
    if (result.code === "choice") ui.notice.hidden = true;
    else showNotice("This device cannot run the model, so the edge answers.", result.reason);
    ui.status.textContent = "";
  }
  setState("ready");
  ui.send.disabled = false;
}

function bubble(role, text = "") {
  const article = document.createElement("article");
  article.className = `message ${role}`;
  const label = document.createElement("span");
  label.className = "role";
  label.textContent = role === "user" ? "You" : "Assistant";
  const content = document.createElement("div");
  content.className = "content";
  content.textContent = text;
  article.append(label, content);
  ui.transcript.append(article);
  return article;
}

async function send(text) {
  if (!state.client) return;
  ui.error.textContent = "";
  state.messages.push({ role: "user", content: text });
  bubble("user", text);
  const article = bubble("assistant");
  article.setAttribute("aria-busy", "true");
  article.dataset.tier = state.tier;
  const content = article.querySelector(".content");
  const controller = (state.controller = new AbortController());
  ui.send.disabled = true;
  ui.stop.disabled = false;
  setState("streaming");
  const started = performance.now();
  let first = null;
  let last = null;
  let usage = null;
  let finish = null;
  let route = null;
  let pieces = 0;
  try {
    const request = { messages: state.messages.map(({ role, content: c }) => ({ role, content: c })), stream: true,
      stream_options: { include_usage: true }, max_tokens: Number(ui.maxTokens.value) || undefined, signal: controller.signal };
    if (ui.deterministic.checked) request.temperature = 0;
    const stream = await state.client.chat.completions.create(request);
    for await (const chunk of stream) {
      const choice = chunk.choices?.[0];
      const piece = choice?.delta?.content;
      if (piece) {
        const now = performance.now();
        first ??= now;
        last = now;
        pieces++;
        content.textContent += piece;
        ui.ttft.textContent = `${Math.round(first - started)} ms`;
      }
      if (choice?.finish_reason) finish = choice.finish_reason;
      if (chunk.edgellm_route) route = chunk.edgellm_route;
      if (chunk.usage) usage = chunk.usage;
    }
    state.messages.push({ role: "assistant", content: content.textContent });
    setState("done");
  } catch (error) {
    if (error.name === "AbortError") {
      setState("stopped");
    } else {
      ui.error.textContent = error.message || String(error);
      state.messages.pop();
      setState("error");
    }
  } finally {
    article.removeAttribute("aria-busy");
    state.controller = null;
    ui.stop.disabled = true;
    ui.send.disabled = false;
  }
  const tokens = usage?.completion_tokens || pieces;
  const tps = first !== null && last > first && tokens > 1 ? (tokens - 1) / ((last - first) / 1000) : null;
  const ttft = first === null ? null : Math.round(first - started);
  const where = state.tier === "device" ? "on this device" : `at the edge${route ? ` (${route})` : ""}`;
  ui.ran.textContent = where;
  ui.tps.textContent = tps ? tps.toFixed(1) : "—";
  ui.tokens.textContent = usage ? `${usage.prompt_tokens} in, ${usage.completion_tokens} out` : String(pieces);
  const note = document.createElement("span");
  note.className = "note turn-stats";
  note.dataset.tier = state.tier;
  if (ttft !== null) note.dataset.ttft = String(ttft);
  if (tps) note.dataset.tps = tps.toFixed(2);
  if (finish) note.dataset.finish = finish;
  const tier = document.createElement("span");
  tier.className = "tier";
  tier.textContent = `Ran ${where}`;
  note.append(tier, [ttft === null ? null : ` · first token ${ttft} ms`, tps ? ` · ${tps.toFixed(1)} tokens/s` : null, ` · ${tokens} tokens`].filter(Boolean).join(""));
  article.append(note);
}

async function fillModels() {
  const wanted = params.get("model") || DEFAULT_MODEL;
  let names = [];
  try {
    names = (await listPublishedModels()).map((m) => m.name);
  } catch { /* the manifest read reports the real problem */ }
  if (!names.includes(wanted)) names.unshift(wanted);
  for (const name of names) {
    const option = document.createElement("option");
    option.value = option.textContent = name;
    ui.model.append(option);
  }
  ui.model.value = wanted;
}

function preferred() {
  return ui.tierRadios.find((r) => r.checked)?.value || "device";
}

ui.form.addEventListener("submit", (event) => {
  event.preventDefault();
  const text = ui.prompt.value.trim();
  if (!text || ui.send.disabled) return;
  ui.prompt.value = "";
  send(text);
});
ui.prompt.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    ui.form.requestSubmit();
  }
});
ui.stop.addEventListener("click", () => state.controller?.abort());
ui.newChat.addEventListener("click", () => {
  state.controller?.abort();
  state.messages = [];
  ui.transcript.replaceChildren();
});
for (const radio of ui.tierRadios) radio.addEventListener("change", () => radio.checked && choose(radio.value).catch(fail));
ui.model.addEventListener("change", () => choose(preferred()).catch(fail));
ui.clear.addEventListener("click", async () => {
  await clearShardCache();
  ui.status.textContent = "The downloaded model was deleted from this browser; the next load downloads it again.";
});

function fail(error) {
  ui.error.textContent = error.message || String(error);
  setState("error");
}

(async () => {
  await fillModels();
  const prefer = params.get("tier") === "edge" ? "edge" : "device";
  for (const radio of ui.tierRadios) radio.checked = radio.value === prefer;
  await choose(prefer);
})().catch(fail);
