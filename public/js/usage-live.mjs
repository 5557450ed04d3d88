/**
 * The usage page's live view: it scrapes the edge's Prometheus counters (`GET /metrics`) every few
 * seconds and draws rates from the difference between two scrapes.
 *
 * Counters only ever rise within one isolate, so a rate is (later - earlier) / time between them.
 * On Cloudflare each scrape reaches one isolate, and the next may reach another whose counters say
 * nothing about this interval: an interval is only ever measured between two scrapes of the same
 * isolate (`edgellm_isolate_start_time_seconds` names it). The pure functions come first (tested
 * in Chromium through the page); `LiveView` at the end does the polling and the drawing.
 */
import { errorFrom } from "./api-errors.mjs";
import { formatNumber, renderBars, renderEmpty, renderLines } from "./usage-charts.mjs";

export const ISOLATE_START = "edgellm_isolate_start_time_seconds";
export const DEFAULT_EVERY_MS = 5000;
const MIN_EVERY_MS = 100;  // ?every= below this would be a scrape loop, not a poll
export const WINDOW_MS = 15 * 60 * 1000;
const MAX_INTERVALS = 720;  // a window's points at most, whatever ?every= says
export const CURRENT_MS = 60 * 1000;  // the cards: the last minute of the window
const SCRAPE_TIMEOUT_MS = 10 * 1000;  // an edge that takes longer is not answering: the charts go stale
const SCRAPES_ROUTE = "/metrics";  // the scrapes themselves (this page's included) are not traffic

// --- the Prometheus text format (0.0.4) ---------------------------------------------------------

const NAME = /[a-zA-Z_:][a-zA-Z0-9_:]*/y;
const LABEL_NAME = /[a-zA-Z_][a-zA-Z0-9_]*/y;

/** A sample value as the format spells it: `+Inf`, `-Inf`, `NaN`, or a Go float. */
export function parseValue(text) {
  if (text === "+Inf" || text === "Inf") return Infinity;
  if (text === "-Inf") return -Infinity;
  if (text === "NaN") return NaN;
  const value = Number(text);
  if (text === undefined || text.trim() === "" || Number.isNaN(value)) throw new SyntaxError(`not a sample value: ${JSON.stringify(text)}`);
  return value;
}

function skipBlanks(line, i) {
  while (line[i] === " " || line[i] === "\t") i += 1;
  return i;
}

function after(line, i, char) {
  if (line[i] !== char) throw new SyntaxError(`expected ${char} at ${i + 1} in: ${line}`);
  return skipBlanks(line, i + 1);
}

/** `"a\"b"` from index i (its opening quote): the value, unescaped, and where it ends. Only
 * `\\`, `\"` and `\n` are escapes; any other backslash stays as written (as Prometheus reads it). */
function labelValue(line, i) {
  if (line[i] !== '"') throw new SyntaxError(`expected a quoted label value at ${i + 1} in: ${line}`);
  let value = "";
  for (i += 1; i < line.length && line[i] !== '"'; i += 1) {
    if (line[i] !== "\\") { value += line[i]; continue; }
    const next = line[i + 1];
    if (next === "\\" || next === '"') { value += next; i += 1; }
    else if (next === "n") { value += "\n"; i += 1; }
    else value += "\\";
  }
  if (line[i] !== '"') throw new SyntaxError(`unterminated label value in: ${line}`);
  return { value, end: skipBlanks(line, i + 1) };
}

/** One sample line: `name{label="value",...} value [timestamp]`. */
export function parseSample(line) {
  let i = skipBlanks(line, 0);
  NAME.lastIndex = i;
  const name = NAME.exec(line)?.[0];
  if (!name) throw new SyntaxError(`not a sample: ${line}`);
  i = skipBlanks(line, NAME.lastIndex);
  const labels = {};
  if (line[i] === "{") {
    i = skipBlanks(line, i + 1);
    while (line[i] !== "}") {
      LABEL_NAME.lastIndex = i;
      const label = LABEL_NAME.exec(line)?.[0];
      if (!label) throw new SyntaxError(`expected a label name at ${i + 1} in: ${line}`);
      const { value, end } = labelValue(line, after(line, skipBlanks(line, LABEL_NAME.lastIndex), "="));
      labels[label] = value;
      if (line[end] === ",") i = skipBlanks(line, end + 1);  // a trailing comma is allowed
      else if (line[end] === "}") i = end;
      else throw new SyntaxError(`expected , or } at ${end + 1} in: ${line}`);
    }
    i = skipBlanks(line, i + 1);
  }
  const [valueText] = line.slice(i).trim().split(/[ \t]+/);  // a timestamp may follow: the scrape's own time is used
  return { name, labels, value: parseValue(valueText) };
}

/** A `# HELP` text: `\\` and `\n` are its only escapes. */
function unescapeHelp(text) {
  return text.replace(/\\(\\|n)/g, (_, c) => (c === "n" ? "\n" : "\\"));
}

/** The text format (0.0.4) -> {samples: [{name, labels, value}], types: {family: type}, help: {family: text}}.
 * Other comments and blank lines are skipped. */
export function parseExposition(text) {
  const samples = [], types = {}, help = {};
  for (const raw of text.split("\n")) {
    const line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
    if (!line.trim()) continue;
    if (line.trimStart().startsWith("#")) {
      const meta = /^\s*#\s*(HELP|TYPE)[ \t]+([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*(.*)$/.exec(line);
      if (meta?.[1] === "TYPE") types[meta[2]] = meta[3].trim();
      else if (meta?.[1] === "HELP") help[meta[2]] = unescapeHelp(meta[3]);
      continue;
    }
    samples.push(parseSample(line));
  }
  return { samples, types, help };
}

// --- scrapes, and what rose between two of them ------------------------------------------------

const SUFFIXES = ["_bucket", "_count", "_sum", "_total"];

/** The type a sample's family declared (`edgellm_x_bucket` belongs to `edgellm_x`); "untyped" when none. */
export function familyType(name, types) {
  if (types[name]) return types[name];
  const suffix = SUFFIXES.find((s) => name.endsWith(s));
  return (suffix && types[name.slice(0, -suffix.length)]) || "untyped";
}

function seriesKey(name, labels) {
  return `${name}${JSON.stringify(Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))}`;
}

/** A scrape as the window keeps it: when it was taken (ms), which isolate answered, and each
 * counter's and histogram's series (gauges move both ways: a difference of two means nothing). */
export function scrapeOf(parsed, at) {
  const values = new Map();
  let isolate = null;
  for (const sample of parsed.samples) {
    if (sample.name === ISOLATE_START) isolate = sample.value;
    else if (["counter", "histogram", "summary"].includes(familyType(sample.name, parsed.types))) {
      values.set(seriesKey(sample.name, sample.labels), sample);
    }
  }
  return { at, isolate, values };
}

/** What each series rose by from `earlier` to `later`: null unless both are scrapes of the same
 * isolate (another isolate's counters say nothing about this interval). A value lower than before
 * means the counter restarted from zero, as Prometheus' rate() reads a reset: it rose by its
 * whole new value, never by a negative amount. A series new since `earlier` rose from zero.
 * Series that did not rise are kept: an empty bucket is still the lower bound of the next one. */
export function increase(earlier, later) {
  if (!earlier || !later || earlier.isolate !== later.isolate || !(later.at > earlier.at)) return null;
  const rose = [];
  for (const [key, sample] of later.values) {
    const before = earlier.values.get(key)?.value ?? 0;
    const by = sample.value >= before ? sample.value - before : sample.value;
    rose.push({ name: sample.name, labels: sample.labels, value: by });
  }
  return { from: earlier.at, to: later.at, isolate: later.isolate, rose };
}

/** The q-quantile of a histogram's cumulative buckets `[[le, count], ...]` (ascending, +Inf last),
 * as Prometheus' `histogram_quantile` estimates it (and `Histogram.quantile` in the core): the
 * rank q * count falls in one bucket, and the value is interpolated linearly inside it (the first
 * bucket starts at 0). A rank in the +Inf bucket is the highest finite bound; null when nothing
 * was observed. */
export function histogramQuantile(q, buckets) {
  if (!buckets.length) return null;
  let running = 0;  // a count lower than the bucket below it is made equal, as Prometheus does
  const cumulative = buckets.map(([le, count]) => [le, (running = Math.max(running, count))]);
  const total = cumulative[cumulative.length - 1][1];
  if (!(total > 0)) return null;
  const finite = cumulative.filter(([le]) => Number.isFinite(le));
  const highest = finite.length ? finite[finite.length - 1][0] : null;
  const rank = q * total;
  let lower = 0, below = 0;
  for (const [le, count] of cumulative) {
    if (count > below && count >= rank) {
      if (!Number.isFinite(le)) return highest;
      return lower + (le - lower) * ((rank - below) / (count - below));
    }
    below = count;
    lower = le;
  }
  return highest;
}

const sum = (values) => values.reduce((a, b) => a + b, 0);

/** The figures of one or more intervals taken together: per-minute rates over their summed time,
 * the hit ratio, TTFT quantiles and tokens per tenant. A figure with nothing to measure is null
 * (no cacheable request: no hit ratio; no generation: no TTFT), never a zero. */
export function figuresOf(intervals) {
  const seconds = sum(intervals.map((i) => (i.to - i.from) / 1000));
  const perMinute = (n) => (seconds > 0 ? (n * 60) / seconds : null);
  let requests = 0, clientErrors = 0, serverErrors = 0, hits = 0, misses = 0, semanticHits = 0;
  const ttft = new Map(), tokens = new Map();
  const tenantTokens = (tenant) => {
    const name = tenant || "(none)";
    if (!tokens.has(name)) tokens.set(name, { tenant: name, prompt: 0, generated: 0 });
    return tokens.get(name);
  };
  for (const { name, labels, value } of intervals.flatMap((i) => i.rose)) {
    if (name === "edgellm_requests_total" && labels.route !== SCRAPES_ROUTE) {
      requests += value;
      if (labels.status === "4xx") clientErrors += value;
      if (labels.status === "5xx") serverErrors += value;
    } else if (name === "edgellm_cache_hits_total") hits += value;
    else if (name === "edgellm_cache_misses_total") misses += value;
    else if (name === "edgellm_cache_semantic_hits_total") semanticHits += value;
    else if (name === "edgellm_prompt_tokens_total") tenantTokens(labels.tenant).prompt += value;
    else if (name === "edgellm_generation_tokens_total") tenantTokens(labels.tenant).generated += value;
    else if (name === "edgellm_time_to_first_token_seconds_bucket" && labels.served_by !== "cache") {
      // generations only: a HIT's ~1 ms would pull the median of a mixed interval to the floor
      const le = parseValue(labels.le);
      ttft.set(le, (ttft.get(le) ?? 0) + value);
    }
  }
  const buckets = [...ttft].sort(([a], [b]) => a - b);
  const cacheable = hits + misses;
  return {
    seconds, requests,
    requestsPerMinute: perMinute(requests), clientErrorsPerMinute: perMinute(clientErrors), serverErrorsPerMinute: perMinute(serverErrors),
    hitRatio: cacheable ? hits / cacheable : null, semanticHitRatio: cacheable ? semanticHits / cacheable : null,
    ttftP50: histogramQuantile(0.5, buckets), ttftP99: histogramQuantile(0.99, buckets),
    tokens: [...tokens.values()].filter((t) => t.prompt + t.generated > 0)  // a tenant idle all window is no bar
      .sort((a, b) => (a.tenant < b.tenant ? -1 : a.tenant > b.tenant ? 1 : 0)),
  };
}

/** The rolling window: the last scrape of each isolate seen, and the intervals measured between
 * two scrapes of one isolate, for the last `spanMs` (and `maxIntervals` at most). An isolate's next
 * scrape is measured against its own last one, however many other isolates answered between. */
export class LiveWindow {
  constructor({ spanMs = WINDOW_MS, maxIntervals = MAX_INTERVALS } = {}) {
    this.spanMs = spanMs;
    this.maxIntervals = maxIntervals;
    this.lastByIsolate = new Map();
    this.intervals = [];
    this.scrapes = 0;
  }

  /** Keep `scrape`; returns the interval it closes, or null (the first scrape of an isolate). */
  add(scrape) {
    this.scrapes += 1;
    const interval = increase(this.lastByIsolate.get(scrape.isolate), scrape);
    this.lastByIsolate.set(scrape.isolate, scrape);
    if (interval) this.intervals.push(interval);
    const since = scrape.at - this.spanMs;
    // an interval begun before the window would average time the window does not show
    this.intervals = this.intervals.filter((i) => i.from >= since).slice(-this.maxIntervals);
    for (const [isolate, last] of this.lastByIsolate) if (last.at < since) this.lastByIsolate.delete(isolate);
    return interval;
  }

  /** The intervals that ended in the last `ms` before the newest one's end. */
  recent(ms) {
    const newest = this.intervals.at(-1)?.to ?? 0;
    return this.intervals.filter((i) => i.to > newest - ms);
  }
}

/** `?every=<ms>`: how often to scrape (at least 100 ms); the default otherwise. */
export function pollEvery(search) {
  const asked = Number(new URLSearchParams(search).get("every"));
  return Number.isFinite(asked) && asked > 0 ? Math.max(MIN_EVERY_MS, asked) : DEFAULT_EVERY_MS;
}

/** Whether to scrape with `token`, from what /admin/usage said about it: a tenant's key (its report
 * names the tenant) or a refused token would only be refused by /metrics too. */
export function liveAccess({ tenant, status } = {}) {
  if (tenant) return "tenant";
  if (status === 401) return "refused";
  return "scrape";
}

/** Why a scrape failed, as the page says it: `stop` when asking again cannot help. /metrics
 * refuses a tenant's API key with 403 and any other token with 401. */
export function troubleOf(error) {
  switch (error?.status) {
    case 401: return { state: "refused", stop: true, message: "The edge refused this token (401): the live view needs the admin token." };
    case 403: return { state: "tenant", stop: true, message: "The live view needs the admin token: an API key cannot read /metrics." };
    case 404: return { state: "admin-off", stop: true, message: `The live view cannot read /metrics: ${error.message}` };
    default: return { state: "stale", stop: false, message: error?.message || String(error) };
  }
}

export const clockTime = (ms) => new Date(ms).toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false });
const showRate = (v) => (v === null ? "–" : formatNumber(v));
const showRatio = (v) => (v === null ? "–" : `${Math.round(v * 100)}%`);
const millis = (seconds) => (seconds === null ? null : seconds * 1000);
const showSeconds = (seconds) => (seconds === null ? "–" : `${formatNumber(seconds * 1000)} ms`);

// --- the view: polling and drawing ---------------------------------------------------------------

/** Scrapes /metrics every `every` ms while the tab is shown, keeps a `LiveWindow` and draws it into
 * the live section. `document.body.dataset.live` says its state (off, waiting, live, paused, stale,
 * refused, tenant, admin-off) and `dataset.liveSamples` counts the scrapes taken: what tests wait on. */
export class LiveView {
  constructor(elements, every = DEFAULT_EVERY_MS) {
    this.el = elements;
    this.every = every;
    this.token = null;
    this.run = 0;  // each start() is a new run: an answer from an older one is dropped
    this.timer = null;
    this.scraping = null;  // the run whose scrape is under way
    this.window = new LiveWindow();
    this.lastGood = null;
    document.addEventListener("visibilitychange", () => this.visibilityChanged());
    this.setState("off", "Type the admin token above to watch /metrics live.");
    this.clear("The admin token, typed above, shows this live.");
  }

  /** Scrape with `token` ("" for a /metrics that is open), unless already watching with it, or
   * watching an open /metrics (which a token changes nothing about). */
  start(token) {
    if (this.running() && (this.token === token || this.token === "")) return;
    this.stop();
    this.token = token;
    this.run += 1;
    this.window = new LiveWindow();
    this.lastGood = null;
    document.body.dataset.liveSamples = "0";
    this.clear("Waiting for two scrapes of /metrics: a rate is the difference between them.");
    this.setState("waiting", "Scraping /metrics…");
    this.tick(this.run);
  }

  /** Say why the live view does not run, without asking /metrics. */
  refuse(access) {
    this.stop();
    const trouble = troubleOf({ status: access === "tenant" ? 403 : 401 });
    this.clear(trouble.message);
    this.setState(trouble.state, trouble.message);
  }

  stop() {
    clearTimeout(this.timer);
    this.timer = null;
    this.token = null;
    this.run += 1;
  }

  running() {
    return this.token !== null;
  }

  async tick(run) {
    this.timer = null;
    if (run !== this.run) return;
    if (document.visibilityState === "hidden") { this.pause(); return; }
    this.scraping = run;
    try {
      const response = await fetch("/metrics", { headers: this.token ? { authorization: `Bearer ${this.token}` } : {}, cache: "no-store",
        signal: AbortSignal.timeout(Math.max(SCRAPE_TIMEOUT_MS, this.every)) });
      if (!response.ok) throw await errorFrom(response);
      const text = await response.text();
      if (run !== this.run) return;
      this.took(scrapeOf(parseExposition(text), Date.now()));
    } catch (error) {
      if (run !== this.run) return;
      if (this.failed(error)) return;
    } finally {
      if (this.scraping === run) this.scraping = null;
    }
    if (run !== this.run) return;
    if (document.visibilityState === "hidden") { this.pause(); return; }  // hidden while the scrape ran
    this.timer = setTimeout(() => this.tick(run), this.every);
  }

  pause() {
    this.setState("paused", `Paused while this tab is hidden${this.lastGood ? `; last scrape at ${clockTime(this.lastGood)}` : ""}.`);
  }

  visibilityChanged() {
    if (!this.running()) return;
    if (document.visibilityState === "hidden") {
      clearTimeout(this.timer);
      this.timer = null;
      if (this.scraping !== this.run) this.pause();  // else the scrape under way pauses when it ends
    } else if (this.scraping !== this.run && this.timer === null) {
      this.tick(this.run);  // at once: the interval since the last scrape covers the hidden time
    }
  }

  took(scrape) {
    this.window.add(scrape);
    this.lastGood = scrape.at;
    this.draw();
    document.body.dataset.liveSamples = String(this.window.scrapes);  // after drawing: a test that sees it sees the charts too
    const seconds = this.every / 1000;
    if (this.window.intervals.length) {
      const isolate = scrape.isolate === null ? "(unknown)" : clockTime(scrape.isolate * 1000);
      this.setState("live", `Scraping every ${formatNumber(seconds)} s; last at ${clockTime(scrape.at)}, from the isolate started at ${isolate}.`);
    } else if (this.window.scrapes === 1) {
      this.setState("waiting", `First scrape at ${clockTime(scrape.at)}; the rates start with the next one, in ${formatNumber(seconds)} s.`);
    } else {  // on Cloudflare, isolates that each answered once: a rate needs one to answer twice
      this.setState("waiting", `${this.window.scrapes} scrapes, no isolate twice yet: the rates start when one answers again.`);
    }
  }

  /** True when the view stopped for good (a refused token); false to keep polling. */
  failed(error) {
    const trouble = troubleOf(error);
    if (trouble.stop) {
      this.stop();
      if (!this.window.intervals.length) this.clear(trouble.message);  // else the charts keep what was measured
      this.setState(trouble.state, trouble.message);
      return true;
    }
    const since = this.lastGood ? `Stale since ${clockTime(this.lastGood)}: ` : "";
    this.setState("stale", `${since}the edge did not answer /metrics (${trouble.message}); trying again every ${formatNumber(this.every / 1000)} s.`);
    return false;
  }

  setState(state, message) {
    document.body.dataset.live = state;
    this.el.status.textContent = message;
  }

  /** No cards, and each chart says `message` (why it has nothing to show) in its frame. */
  clear(message) {
    this.el.cards.replaceChildren();
    for (const svg of Object.values(this.el.charts)) renderEmpty(svg, message);
  }

  /** Redraws the charts at the page's width (also on resize). */
  draw() {
    const intervals = this.window.intervals;
    if (!intervals.length) return;
    const points = intervals.map((i) => figuresOf([i]));
    const at = intervals.map((i) => i.to);
    const times = at.map(clockTime);
    const line = (name, measure) => ({ name, values: points.map(measure) });
    const { charts } = this.el;
    renderLines(charts.requests, { days: times, at, series: [line("requests", (p) => p.requestsPerMinute)] });
    renderLines(charts.errors, { days: times, at, series: [line("5xx", (p) => p.serverErrorsPerMinute), line("4xx", (p) => p.clientErrorsPerMinute)] });
    renderLines(charts.hits, { days: times, at, series: [line("hit ratio", (p) => p.hitRatio), line("semantic", (p) => p.semanticHitRatio)] },
      { max: 1, format: showRatio });
    renderLines(charts.ttft, { days: times, at, series: [line("p50", (p) => millis(p.ttftP50)), line("p99", (p) => millis(p.ttftP99))] },
      { format: (v) => `${formatNumber(v)} ms` });
    const tokens = figuresOf(intervals).tokens;
    if (tokens.length) renderBars(charts.tokens, tokens.map((t) => ({ label: t.tenant, values: [t.prompt, t.generated] })), ["prompt", "generated"]);
    else renderEmpty(charts.tokens, "No tokens prompted or generated in the window yet.");
    this.showCards(figuresOf(this.window.recent(CURRENT_MS)));
  }

  /** The last minute's figures; a dash, with a tooltip saying why, where there was nothing to measure. */
  showCards(now) {
    const noGeneration = "no generation in the last minute", noCacheable = "no cacheable request in the last minute";
    const cards = [["requests", "Requests / min", now.requestsPerMinute, showRate], ["5xx", "5xx / min", now.serverErrorsPerMinute, showRate],
      ["4xx", "4xx / min", now.clientErrorsPerMinute, showRate], ["hit-ratio", "Hit ratio", now.hitRatio, showRatio, noCacheable],
      ["ttft-p50", "TTFT p50", now.ttftP50, showSeconds, noGeneration], ["ttft-p99", "TTFT p99", now.ttftP99, showSeconds, noGeneration]];
    this.el.cards.replaceChildren(...cards.map(([key, label, value, format, whyNone]) => {
      const card = document.createElement("div");
      card.className = "panel total";
      card.dataset.card = key;
      card.dataset.value = value === null ? "" : String(value);
      if (value === null && whyNone) card.title = whyNone;
      const strong = document.createElement("strong");
      strong.textContent = format(value);
      card.append(strong, label);
      return card;
    }));
  }
}
