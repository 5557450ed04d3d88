/**
 * The chat page: a conversation streamed from the edge, with the numbers that show what the edge
 * did (time to first token, tokens per second, which model answered, whether the cache did).
 *
 * `document.body.dataset.state` says where the page is (idle, streaming, done, stopped, error),
 * for people using dev tools and for the browser tests.
 *
 * A conversation is a session (`x-session-affinity`, a new one per "New chat"): the edge keeps
 * its prompt cached between turns, and each answer notes its time to first token and how many
 * prompt tokens the model reused (`usage.prompt_tokens_details.cached_tokens`).
 *
 * One switch says where answers run: "Edge" or "This device" (device-llm.mjs: the published
 * model's shards downloaded from the edge, verified, and run by llama.cpp in WebAssembly). Both
 * are the same OpenAI-shaped client, so `ask` does not know which it talks to; each answer says
 * where it ran. This page is not cross-origin isolated (COOP/COEP would be a second, stricter
 * policy for a page that needs none of it), so the device runs here on one thread: the
 * conversation stays on screen when the switch flips, and /device offers the multi-thread build.
 * When the device cannot run the model the edge answers and the notice says why (the module's
 * fallback reasons: `body[data-fallback]`).
 */
import { EdgeLLM, formatBytes, openTier } from "./device-llm.mjs";

const $ = (id) => document.getElementById(id);
const ui = {
  form: $("ask"), prompt: $("prompt"), model: $("model"), temperature: $("temperature"),
  temperatureValue: $("temperature-value"), maxTokens: $("max-tokens"), deterministic: $("deterministic"),
  send: $("send"), stop: $("stop"), newChat: $("new-chat"), askAgain: $("ask-again"), transcript: $("transcript"),
  status: $("status"), error: $("error"),
  ttft: $("stat-ttft"), tps: $("stat-tps"), tokens: $("stat-tokens"), statModel: $("stat-model"),
  cache: $("stat-cache"), finish: $("stat-finish"), cached: $("stat-cached"),
  tierRadios: [...document.querySelectorAll('input[name="tier"]')], tierNow: $("tier-now"), tierNotice: $("tier-notice"),
};
/** The model the device tier runs: the edge's default, as published in its R2. */
const DEVICE_MODEL = "smollm2-135m";

/** The conversation so far and the stream in flight (one at a time). */
const state = { messages: [], controller: null, lastQuestion: null, savedTemperature: null, session: newSession(),
  client: new EdgeLLM(), tier: "edge", loading: null };

function newSession() {
  return `chat-${crypto.randomUUID ? crypto.randomUUID() : Math.random().toString(36).slice(2)}`;
}

/** The turn's figures under its answer: time to first token and prompt tokens reused. */
function turnNote(article, m) {
  const ttft = m.first === null ? null : Math.round(m.first - m.started);
  const details = m.usage?.prompt_tokens_details;
  const cached = details ? details.cached_tokens : null;
  const span = document.createElement("span");
  span.className = "note turn-stats";
  if (ttft !== null) span.dataset.ttft = String(ttft);
  if (cached !== null) span.dataset.cached = String(cached);
  // a HIT replays a stored answer: the model computed nothing, so its KV-cache figure (from the
  // generation that was stored) would contradict the HIT beside it
  span.dataset.tier = m.tier;
  const parts = [m.tier === "device" ? "ran on this device" : "ran at the edge", ttft === null ? null : `first token ${ttft} ms`,
    m.cached ? "answer replayed from the edge's cache: no prompt tokens computed"
      : cached === null ? null : `${cached} of ${m.usage.prompt_tokens} prompt tokens cached`];
  span.textContent = parts.filter(Boolean).join(" · ");
  article.append(span);
}

function setState(name) {
  document.body.dataset.state = name;
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

function note(article, text) {
  const span = document.createElement("span");
  span.className = "note";
  span.textContent = text;
  article.append(span);
}

function resetStats() {
  for (const dd of [ui.ttft, ui.tps, ui.tokens, ui.statModel, ui.cache, ui.finish, ui.cached].filter(Boolean)) dd.textContent = "—";
  delete ui.cache.dataset.status;
}

function temperature() {
  return ui.deterministic.checked ? 0 : Number(ui.temperature.value);
}

function syncTemperature() {
  // the slider itself shows what is sent: 0 while deterministic, the user's value back after
  if (ui.deterministic.checked && state.savedTemperature === null) {
    state.savedTemperature = ui.temperature.value;
    ui.temperature.value = "0";
  } else if (!ui.deterministic.checked && state.savedTemperature !== null) {
    ui.temperature.value = state.savedTemperature;
    state.savedTemperature = null;
  }
  ui.temperature.disabled = ui.deterministic.checked;
  ui.temperatureValue.textContent = temperature().toFixed(1);
}

function setStreaming(on) {
  ui.send.disabled = on || state.loading !== null;
  ui.stop.disabled = !on;
  ui.askAgain.disabled = on || !state.lastQuestion;
}

function request() {
  const body = { messages: state.messages.map(({ role, content }) => ({ role, content })), temperature: temperature() };
  const maxTokens = ui.maxTokens.value.trim();
  if (maxTokens !== "") body.max_tokens = Number(maxTokens);
  if (ui.model.value) body.model = ui.model.value;
  return body;
}

/** Live figures for the answer in flight; `tokens` prefers the API's usage over counted chunks. */
function meter() {
  const started = performance.now();
  const m = { first: null, last: null, chunks: 0, usage: null, cached: false, started, tier: state.tier };
  m.delta = () => {
    const now = performance.now();
    if (m.first === null) {
      m.first = now;
      ui.ttft.textContent = `${Math.round(now - started)} ms`;
    }
    m.last = now;
    m.chunks += 1;
    m.show();
  };
  m.show = () => {
    const tokens = m.usage ? m.usage.completion_tokens : m.chunks;
    ui.tokens.textContent = String(tokens);
    const seconds = m.first === null ? 0 : (m.last - m.first) / 1000;
    // the first token's time is time-to-first-token; the rate counts the tokens after it
    const rate = (tokens - 1) / seconds;
    if (m.cached) ui.tps.textContent = "— (cached: replayed, not generated)";
    else ui.tps.textContent = tokens > 1 && seconds > 0 ? (rate >= 100 ? Math.round(rate).toString() : rate.toFixed(1)) : "—";
  };
  return m;
}

async function ask(text) {
  ui.error.textContent = "";
  resetStats();
  state.messages.push({ role: "user", content: text });
  state.lastQuestion = text;
  bubble("user", text);
  const answer = bubble("assistant");
  const content = answer.querySelector(".content");
  answer.setAttribute("aria-busy", "true");
  const controller = new AbortController();
  state.controller = controller;
  setStreaming(true);
  setState("streaming");
  ui.status.textContent = "Waiting for the first token…";
  const m = meter();
  let reply = "";
  const client = state.client;
  answer.dataset.tier = m.tier;
  if (m.tier === "device") ui.cache.textContent = "— (ran on this device)";
  try {
    const stream = await client.chat.completions.create({
      ...request(), stream: true, stream_options: { include_usage: true }, signal: controller.signal,
      headers: { "x-session-affinity": state.session },
      onResponse(response) {
        const cacheStatus = response.headers.get("cf-aig-cache-status");
        const age = response.headers.get("age");
        ui.statModel.textContent = response.headers.get("x-edgellm-model") || "—";
        ui.cache.textContent = cacheStatus ? cacheStatus + (age ? ` (age ${age} s)` : "") : "not reported";
        if (cacheStatus) ui.cache.dataset.status = cacheStatus;
        m.cached = cacheStatus === "HIT";
      },
    });
    let model = null;
    for await (const chunk of stream) {
      if (chunk.model && chunk.model !== model) ui.statModel.textContent = model = chunk.model;
      const choice = chunk.choices?.[0];
      const delta = choice?.delta?.content;
      if (delta) {
        if (m.first === null) ui.status.textContent = "Streaming…";
        content.append(delta); // a text node per chunk: nothing re-parsed, nothing re-laid-out above it
        reply += delta;
        m.delta();
      }
      if (choice?.finish_reason) ui.finish.textContent = choice.finish_reason;
      if (chunk.usage) {
        m.usage = chunk.usage;
        m.show();
        const details = chunk.usage.prompt_tokens_details;
        if (ui.cached && m.cached) ui.cached.textContent = "— (HIT: nothing computed)";
        else if (ui.cached && details) ui.cached.textContent = `${details.cached_tokens} of ${chunk.usage.prompt_tokens}`;
      }
    }
    turnNote(answer, m);
    state.messages.push({ role: "assistant", content: reply });
    ui.status.textContent = m.cached
      ? `Answer complete: ${ui.tokens.textContent} tokens, from the edge's cache (HIT).`
      : `Answer complete: ${ui.tokens.textContent} tokens.`;
    setState("done");
  } catch (error) {
    if (error.name === "AbortError") {
      state.messages.push({ role: "assistant", content: reply });
      ui.finish.textContent = "stopped";
      ui.status.textContent = `Stopped after ${m.chunks} tokens.`;
      note(answer, "Stopped.");
      setState("stopped");
    } else {
      state.messages.pop(); // the failed question stays on screen but not in the conversation sent next
      ui.error.textContent = error.message;
      ui.status.textContent = "";
      note(answer, m.tier === "device" ? "No answer: the device reported an error." : "No answer: the edge reported an error.");
      setState("error");
    }
  } finally {
    answer.removeAttribute("aria-busy");
    if (state.controller === controller) state.controller = null;
    const stopHadFocus = document.activeElement === ui.stop;
    setStreaming(false);
    if (stopHadFocus) ui.prompt.focus(); // a disabled button drops keyboard focus to <body>
  }
}

async function loadModels() {
  try {
    const response = await fetch("/v1/models");
    if (!response.ok) return;
    const { data } = await response.json();
    for (const model of data || []) {
      if (model.edgellm?.kind === "embedding") continue;  // it makes vectors, not chat answers
      ui.model.append(new Option(model.id, model.id));
    }
  } catch { /* the default model still works */ }
}

function newChat() {
  state.controller?.abort();
  state.messages = [];
  state.session = newSession();
  ui.transcript.replaceChildren();
  ui.error.textContent = "";
  ui.status.textContent = "New chat.";
  resetStats();
  setState("idle");
  ui.prompt.focus();
}

function showTier(tier, text) {
  state.tier = tier;
  document.body.dataset.tier = tier;
  ui.tierNow.dataset.tier = tier;
  ui.tierNow.textContent = text;
  ui.model.disabled = tier === "device"; // the device runs its one published model
  for (const radio of ui.tierRadios) radio.checked = radio.value === tier;
}

function tierNotice(title, detail) {
  const strong = document.createElement("strong");
  strong.textContent = title;
  const span = document.createElement("span");
  span.textContent = detail;
  ui.tierNotice.replaceChildren(strong, span);
  ui.tierNotice.hidden = false;
}

/** Flip the switch: load the device tier (or not); the edge answers whenever it cannot. */
async function chooseTier(prefer) {
  state.loading?.abort();
  const loading = (state.loading = new AbortController());
  state.controller?.abort();
  setState("loading");
  setStreaming(false);
  ui.tierNotice.hidden = true;
  delete document.body.dataset.fallback;
  const previous = state.client;
  state.client = new EdgeLLM();
  await previous?.close?.();
  showTier("edge", "Answers run at the edge (/v1/chat/completions).");
  if (prefer === "device") {
    ui.tierNow.dataset.tier = "loading";
    ui.tierNow.textContent = `Preparing ${DEVICE_MODEL} for this device…`;
    for (const radio of ui.tierRadios) radio.checked = radio.value === "device";
  }
  try {
    const result = await openTier(DEVICE_MODEL, {
      prefer,
      signal: loading.signal,
      onStage: (stage) => {
        ui.status.textContent = { manifest: "Reading the model's manifest from the edge…",
          download: "Downloading and verifying the shards…", load: "Loading the model into llama.cpp (WebAssembly)…" }[stage];
      },
      onProgress: (p) => {
        ui.status.textContent = `Downloading and verifying the shards: ${formatBytes(p.loaded)} of ${formatBytes(p.total)}, ${p.shardsDone} of ${p.shardsTotal} verified.`;
      },
    });
    if (loading.signal.aborted) return void result.client.close?.();
    state.client = result.client;
    if (result.tier === "device") {
      const i = result.client.info;
      const threads = i.multiThread ? `${i.threads} threads` : "single thread";
      showTier("device", `Answers run on this device: ${i.model} in WebAssembly (${threads}; /device runs the multi-thread build), all ${i.shards} shards verified.`);
      ui.status.textContent = `This device is ready (download and verify ${(i.downloadMs / 1000).toFixed(1)} s, load ${(i.loadMs / 1000).toFixed(1)} s).`;
    } else {
      // the switch shows where answers run; choosing "This device" again retries
      showTier("edge", "Answers run at the edge (/v1/chat/completions).");
      if (result.code !== "choice") {
        document.body.dataset.fallback = result.code;
        tierNotice("This device cannot run the model, so the edge answers.", result.reason);
      }
      ui.status.textContent = "";
    }
  } catch (error) {
    if (error.name === "AbortError") return;
    ui.error.textContent = error.message || String(error);
  } finally {
    if (state.loading === loading) {
      state.loading = null;
      setStreaming(false);
      setState("idle");
    }
  }
}

function start() {
  ui.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = ui.prompt.value.trim();
    if (!text || state.controller || state.loading) return;
    ui.prompt.value = "";
    ask(text);
  });
  ui.prompt.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      ui.form.requestSubmit();
    }
  });
  ui.stop.addEventListener("click", () => state.controller?.abort());
  ui.newChat.addEventListener("click", newChat);
  ui.askAgain.addEventListener("click", () => {
    const question = state.lastQuestion;
    if (!question || state.controller || state.loading) return;
    newChat();
    ask(question);
  });
  ui.deterministic.addEventListener("change", syncTemperature);
  ui.temperature.addEventListener("input", syncTemperature);
  for (const radio of ui.tierRadios) radio.addEventListener("change", () => radio.checked && chooseTier(radio.value));
  syncTemperature();
  showTier("edge", ui.tierNow.textContent);
  loadModels();
  setState("idle");
}

start();
