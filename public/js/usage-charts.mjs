/**
 * Charts as SVG, from plain data: no library, no network. Pure functions build the shapes
 * (tested in Node-free browser tests through the page); `render*` writes them into an <svg>.
 */

const NS = "http://www.w3.org/2000/svg";
export const COLOURS = ["#c2410c", "#2563eb", "#16a34a", "#9333ea", "#ca8a04", "#0891b2", "#db2777", "#4b5563"];

/** Rows `{tenant, day, requests, ...}` -> {days, series: [{name, values}]} for one measure. */
export function seriesBy(rows, key, measure) {
  const days = [...new Set(rows.map((r) => r.day))].sort();
  const names = [...new Set(rows.map((r) => r[key] ?? "(none)"))].sort();
  const series = names.map((name) => ({
    name,
    values: days.map((day) => rows.filter((r) => r.day === day && (r[key] ?? "(none)") === name)
      .reduce((sum, r) => sum + measure(r), 0)),
  }));
  return { days, series };
}

/** Bars `{label, values: [..]}` grouped side by side; returns the scale's maximum, 1 when every
 * value is 0 (a chart of nothing reads 0 to 1, not 0 to 1e-12). */
export function maxOf(groups) {
  const max = Math.max(0, ...groups.flatMap((g) => g.values));
  return max > 0 ? max : 1;
}

function el(name, attrs, text) {
  const node = document.createElementNS(NS, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = text;
  return node;
}

// 11px monospace (usage.css): a character is ~0.6 em wide
const CHAR_WIDTH = 6.7, SWATCH = 14, GAP = 16, ROW = 15;

/** Legend items laid out in rows that fit `width` (a name too long for one row is cut with "…"),
 * so every series keeps its legend at any width, a phone's included. */
export function legendLayout(names, width, left = 8, right = 8) {
  const room = Math.max(40, width - left - right);
  const items = [];
  let x = left, row = 0;
  for (const name of names) {
    const fits = Math.max(1, Math.floor((room - SWATCH) / CHAR_WIDTH));
    const text = name.length > fits ? `${name.slice(0, Math.max(1, fits - 1))}…` : name;
    const w = SWATCH + text.length * CHAR_WIDTH;
    if (x > left && x + w > left + room) { x = left; row += 1; }
    items.push({ name, text, x, row, width: w });
    x += w + GAP;
  }
  return { items, rows: names.length ? row + 1 : 0 };
}

function frame(svg, names) {
  svg.replaceChildren();
  delete svg.dataset.empty;
  const width = svg.clientWidth || 400, height = svg.clientHeight || 220;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const layout = legendLayout(names, width);
  return { width, height, left: 48, right: 8, top: 8, bottom: 22 + layout.rows * ROW, layout };
}

function legend(svg, f) {
  const g = el("g", { class: "legend" });
  const first = f.height - f.layout.rows * ROW;
  f.layout.items.forEach((item, i) => {
    const y = first + item.row * ROW;
    const text = el("text", { x: item.x + SWATCH, y: y + 9 }, item.text);
    if (item.text !== item.name) text.append(el("title", {}, item.name));
    g.append(el("rect", { x: item.x, y, width: 10, height: 10, fill: COLOURS[i % COLOURS.length] }), text);
  });
  svg.append(g);
}

/** A value a line has no point for: an interval with nothing to measure. */
const isGap = (v) => v === null || v === undefined || Number.isNaN(v);

/** Indices of the non-null values, in runs: a line breaks where a value is null. */
export function runsOf(values) {
  const runs = [];
  let run = [];
  values.forEach((v, i) => {
    if (isGap(v)) { if (run.length) runs.push(run); run = []; }
    else run.push(i);
  });
  if (run.length) runs.push(run);
  return runs;
}

/** One line per series over the x labels `days` (days, or times of day); `at` (numbers, such as
 * timestamps) spaces the points by time instead of evenly, so a pause shows as one. A null value
 * is a gap, no point and a break in the line: an interval with nothing to measure is not a zero.
 * Points carry data-value for tests and tooltips. `max` fixes the scale's top (a ratio's 1),
 * `format` writes its figures. */
export function renderLines(svg, { days, series, at }, { max, format = formatNumber } = {}) {
  const f = frame(svg, series.map((s) => s.name));
  const top = max ?? maxOf(series.map((s) => ({ values: s.values.filter((v) => !isGap(v)) })));
  const w = f.width - f.left - f.right, h = f.height - f.top - f.bottom;
  const span = at && at.length > 1 ? at[at.length - 1] - at[0] : 0;
  const x = (i) => f.left + (span > 0 ? ((at[i] - at[0]) * w) / span : days.length > 1 ? (i * w) / (days.length - 1) : w / 2);
  const y = (v) => f.top + h - (Math.min(v, top) / top) * h;
  svg.append(el("line", { class: "axis", x1: f.left, y1: f.top + h, x2: f.width - f.right, y2: f.top + h }),
             el("text", { x: 2, y: f.top + 10 }, format(top)), el("text", { x: 2, y: f.top + h }, format(0)));
  days.forEach((day, i) => {  // first and last label, anchored so neither runs off the chart
    if (i !== 0 && i !== days.length - 1) return;
    const anchor = days.length === 1 ? "middle" : i === 0 ? "start" : "end";
    svg.append(el("text", { x: x(i), y: f.top + h + 14, "text-anchor": anchor }, day));
  });
  series.forEach((s, k) => {
    const colour = COLOURS[k % COLOURS.length];
    for (const run of runsOf(s.values)) {
      svg.append(el("polyline", { fill: "none", stroke: colour, "stroke-width": 2,
        points: run.map((i) => `${x(i)},${y(s.values[i])}`).join(" "), "data-series": s.name }));
    }
    s.values.forEach((v, i) => {
      if (isGap(v)) return;
      const point = el("circle", { cx: x(i), cy: y(v), r: 3, fill: colour, class: "point",
        "data-series": s.name, "data-day": days[i], "data-value": v });
      if (at) point.setAttribute("data-at", String(at[i]));
      point.append(el("title", {}, `${s.name} ${format(v)} · ${days[i]}`));
      svg.append(point);
    });
  });
  legend(svg, f);
}

/** Grouped bars: one group per label, one bar per measure. */
export function renderBars(svg, groups, measures) {
  const f = frame(svg, measures);
  const max = maxOf(groups), w = f.width - f.left - f.right, h = f.height - f.top - f.bottom;
  const slot = w / Math.max(1, groups.length), bar = (slot * 0.7) / Math.max(1, measures.length);
  svg.append(el("line", { class: "axis", x1: f.left, y1: f.top + h, x2: f.width - f.right, y2: f.top + h }),
             el("text", { x: 2, y: f.top + 10 }, formatNumber(max)), el("text", { x: 2, y: f.top + h }, "0"));
  groups.forEach((g, i) => {
    const x0 = f.left + i * slot + slot * 0.15;
    g.values.forEach((v, k) => {
      const height = (v / max) * h;
      svg.append(el("rect", { x: x0 + k * bar, y: f.top + h - height, width: Math.max(1, bar - 2), height,
        fill: COLOURS[k % COLOURS.length], class: "bar", "data-label": g.label, "data-measure": measures[k], "data-value": v }));
    });
    const fits = Math.max(1, Math.floor((slot * 0.85) / CHAR_WIDTH));  // a label no wider than its group
    const label = el("text", { x: x0, y: f.top + h + 14, class: "label" }, g.label.length > fits ? `${g.label.slice(0, Math.max(1, fits - 1))}…` : g.label);
    if (g.label.length > fits) label.append(el("title", {}, g.label));
    svg.append(label);
  });
  legend(svg, f);
}

/** `text` cut into lines of at most `fits` characters, at spaces where it can be. */
export function wrapWords(text, fits) {
  const lines = [];
  let line = "";
  for (const word of text.split(/\s+/).filter(Boolean)) {
    for (let rest = word; rest; ) {
      const piece = rest.slice(0, fits);
      rest = rest.slice(piece.length);
      if (!line) line = piece;
      else if (line.length + 1 + piece.length <= fits) line += ` ${piece}`;
      else { lines.push(line); line = piece; }
    }
  }
  if (line) lines.push(line);
  return lines;
}

/** A chart with nothing to draw says why, in words inside its frame (an empty frame reads as a
 * broken page): what would show it, or that there is nothing yet. */
export function renderEmpty(svg, message) {
  const f = frame(svg, []);
  const lines = wrapWords(message, Math.max(8, Math.floor((f.width - 16) / CHAR_WIDTH)));
  const first = f.height / 2 - ((lines.length - 1) * ROW) / 2;
  const text = el("text", { class: "empty", x: f.width / 2, y: first, "text-anchor": "middle" });
  lines.forEach((line, i) => text.append(el("tspan", { x: f.width / 2, y: first + i * ROW }, line)));
  svg.dataset.empty = message;
  svg.append(text);
}

/** A figure as people read it: 1.2k, 3.4M, and small amounts (a cost of $0.0038) with two
 * significant digits in plain decimals, never `3.8e-3`. */
export function formatNumber(v) {
  if (v >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (v >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  if (v > 0 && v < 0.01) {
    const digits = Math.min(20, 1 - Math.floor(Math.log10(v)));
    return v.toFixed(digits).replace(/0+$/, "");
  }
  return String(Math.round(v * 100) / 100);
}
