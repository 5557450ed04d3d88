/** The usage page: asks /admin/usage with the caller's token and draws the charts; with the admin
 * token (or a /metrics open without one) the live view scrapes /metrics too (usage-live.mjs). */
import { errorFrom } from "./api-errors.mjs";
import { formatNumber, renderBars, renderEmpty, renderLines, seriesBy } from "./usage-charts.mjs";
import { LiveView, liveAccess, pollEvery } from "./usage-live.mjs";

const $ = (id) => document.getElementById(id);
const live = new LiveView({
  status: $("live-status"), cards: $("live-cards"),
  charts: { requests: $("live-requests"), errors: $("live-errors"), hits: $("live-hits"), ttft: $("live-ttft"), tokens: $("live-tokens") },
}, pollEvery(location.search));

// what each chart shows, for the words an empty one says
const CHARTS = { "chart-requests": "requests per day", "chart-tokens": "tokens per day", "chart-hits": "the cache hit rate",
  "chart-cost": "the cost" };

/** Every chart says `message(what it shows)` instead of an empty frame; kept for a resize. */
function emptyCharts(message) {
  drawn = () => { for (const [id, what] of Object.entries(CHARTS)) renderEmpty($(id), message(what)); };
  drawn();
}

async function usage(token, params) {
  const response = await fetch(`/admin/usage?${new URLSearchParams(params)}`, { headers: { authorization: `Bearer ${token}` } });
  if (!response.ok) throw await errorFrom(response);
  return response.json();
}

function showTotals(totals) {
  const items = [["Requests", totals.requests], ["Tokens billed", totals.prompt_tokens + totals.completion_tokens],
    ["Hit rate", `${Math.round(totals.hit_rate * 100)}%`], ["Estimated cost", `$${formatNumber(totals.cost_usd)}`],
    ["Saved by the cache", `$${formatNumber(totals.saved_usd)}`]];
  $("totals").replaceChildren(...items.map(([label, value]) => {
    const card = document.createElement("div");
    card.className = "panel total";
    card.dataset.total = label;
    const strong = document.createElement("strong");
    strong.textContent = String(value);
    card.append(strong, label);
    return card;
  }));
}

async function show(event) {
  event?.preventDefault();
  const token = $("token").value.trim();
  const days = Number($("days").value) || 30;
  const to = Date.now() / 1000, from = to - days * 86400;
  document.body.dataset.state = "loading";
  $("error").hidden = true;
  try {
    sessionStorage.setItem("edgellm-usage-token", token);
    const [daily, perTenant] = await Promise.all([
      usage(token, { from, to, group_by: "tenant,day" }), usage(token, { from, to, group_by: "tenant" })]);
    showTotals(daily.totals);
    const tokens = seriesBy(daily.data, "tenant", (r) => r.prompt_tokens + r.completion_tokens);
    const tenants = perTenant.data.map((r) => ({ ...r, label: r.tenant ?? "(none)" }));
    const none = `No usage in the last ${days} days yet: nothing to draw.`;
    drawn = () => {
      if (!daily.data.length) for (const id of ["chart-requests", "chart-tokens"]) renderEmpty($(id), none);
      else {
        renderLines($("chart-requests"), seriesBy(daily.data, "tenant", (r) => r.requests));
        renderLines($("chart-tokens"), tokens);
      }
      if (!tenants.length) for (const id of ["chart-hits", "chart-cost"]) renderEmpty($(id), none);
      else {
        renderBars($("chart-hits"), tenants.map((r) => ({ label: r.label, values: [r.hit_rate] })), ["hit rate"]);
        renderBars($("chart-cost"), tenants.map((r) => ({ label: r.label, values: [r.cost_usd, r.saved_usd] })), ["cost", "saved"]);
      }
    };
    drawn();
    document.body.dataset.state = "shown";
    watchLive(token, liveAccess({ tenant: daily.tenant }));
  } catch (error) {
    $("error").textContent = error.message;  // a 404 says how to turn the admin routes on
    $("error").hidden = false;
    // the charts drawn for an earlier token are not this one's
    emptyCharts(() => ([401, 403].includes(error.status) ? "The edge refused this token: nothing to show (the error above says why)."
      : "Nothing to show: the error above says why."));
    document.body.dataset.state = "error";
    watchLive(token, liveAccess({ status: error.status }));
  }
}

// /admin/usage has said who the token is: a tenant's key or a refused token is told so without
// a /metrics request that could only be refused
function watchLive(token, access) {
  if (access === "scrape") live.start(token);
  else live.refuse(access);
}

let drawn = null;  // redraws the charts at the page's new width (a phone turned, a window resized)
emptyCharts((what) => `Type the admin token (or a tenant's API key) above to see ${what}.`);
let resizing = 0;
window.addEventListener("resize", () => { clearTimeout(resizing); resizing = setTimeout(() => { drawn?.(); live.draw(); }, 100); });

// "admin routes are off" only when they are: /healthz says (asking /admin itself logs a 401 in the console)
async function adminRoutes() {
  let health = {};
  try { health = await (await fetch("/healthz")).json(); } catch { health = {}; }
  const off = health.admin_routes === false;
  $("admin-off").hidden = !off;
  document.body.dataset.admin = off ? "off" : "on";
  // An open /metrics (edgellm dev on loopback) is watched with no token; with no admin token to
  // type and /metrics closed, its 404 says how to turn the admin routes on
  if ((health.metrics_open === true || off) && !live.running()) live.start("");
}
adminRoutes();

$("auth").addEventListener("submit", show);
// Enabled only now: clicked before this module ran, the form submitted natively and reloaded the page, the token lost
$("auth").querySelector("button[type=submit]").disabled = false;
const remembered = sessionStorage.getItem("edgellm-usage-token");
if (remembered) { $("token").value = remembered; show(); }
else document.body.dataset.state = "idle";
