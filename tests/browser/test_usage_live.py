"""The usage page's live view in headless Chromium against a real local edge: it scrapes /metrics
(`?every=` makes that quick), draws rates from the difference between two scrapes of one isolate,
and says when it cannot run. Its pure functions (the text-format parser, histogram_quantile, what
rose between two scrapes) run in Chromium too, checked against `prometheus_client`'s parser and
the core's own `Histogram.quantile`.

The page says where it is in `body[data-live]` and counts its scrapes in `body[data-live-samples]`;
hiding the tab (the Page Visibility API) stops the scrapes, which lets a test put a known set of
requests into exactly one interval."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Awaitable, Callable

import httpx
import pytest
from playwright.async_api import Page, expect
from prometheus_client.parser import text_string_to_metric_families

from edgellm.access.keys import KeyRing, new_key
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.telemetry.metrics import TIME_BUCKETS, Histogram
from edgellm_local.emulator.server import EdgeServer
from edgellm_local.emulator.usage_sqlite import SqliteUsage

from .conftest import BROWSER_LOOP, PHONE
from .test_operator_pages import BOXES, inside

pytestmark = BROWSER_LOOP

ADMIN = "usage-admin"
EVERY = 150  # ms between scrapes: tests wait on scrapes, so a short one keeps them quick
Q = {"messages": [{"role": "user", "content": "Name a colour."}], "temperature": 0, "max_tokens": 6}
LIVE = "/js/usage-live.mjs"


def watch_errors(page: Page) -> list[str]:
    """Script errors, and console errors other than a failed load (a refused or aborted request
    Chromium logs itself, which a page cannot prevent)."""
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"pageerror: {error}"))
    page.on("console", lambda message: problems.append(message.text)
            if message.type == "error" and not message.text.startswith("Failed to load resource") else None)
    return problems


async def made_key(deps: Deps, tenant: str) -> str:
    made = new_key(tenant, deps.clock.now())
    await KeyRing(deps.kv).put(made.record)
    return made.api_key


async def open_live(page: Page, edge: EdgeServer, token: str | None = ADMIN) -> None:
    await page.goto(f"{edge.url}/usage?every={EVERY}")
    if token is not None:
        await page.get_by_label("Admin token or API key").fill(token)
        await page.get_by_role("button", name="Show usage").click()


async def samples(page: Page) -> int:
    return int(await page.locator("body").get_attribute("data-live-samples") or 0)


async def wait_samples(page: Page, count: int) -> None:
    await page.wait_for_function("(n) => Number(document.body.dataset.liveSamples) >= n", arg=count)


async def set_visibility(page: Page, state: str) -> None:
    """What a browser does when the tab is hidden or shown again (headless Chromium never hides it)."""
    await page.evaluate("""(state) => {
      Object.defineProperty(document, "visibilityState", {configurable: true, get: () => state});
      Object.defineProperty(document, "hidden", {configurable: true, get: () => state === "hidden"});
      document.dispatchEvent(new Event("visibilitychange"));
    }""", state)


async def values(page: Page, chart: str, series: str) -> list[float]:
    """One series' points in a live chart, read at once (the chart is redrawn on every scrape)."""
    return await page.locator(f'#{chart} circle.point[data-series="{series}"]').evaluate_all(
        "(points) => points.map((p) => Number(p.dataset.value))")


async def card(page: Page, name: str) -> float | None:
    value = await page.locator(f'#live-cards [data-card="{name}"]').get_attribute("data-value")
    return float(value) if value else None


def tokens_by_tenant(exposition: str) -> dict[tuple[str, str], float]:
    """(tenant, "prompt" | "generated") -> tokens, as prometheus_client reads /metrics."""
    out: dict[tuple[str, str], float] = {}
    measures = {"edgellm_prompt_tokens": "prompt", "edgellm_generation_tokens": "generated"}
    for family in text_string_to_metric_families(exposition):
        if family.name in measures:
            for sample in family.samples:
                key = (sample.labels["tenant"], measures[family.name])
                out[key] = out.get(key, 0.0) + sample.value
    return out


def generation_ttft(exposition: str) -> Histogram:
    """/metrics' time to first token of generations (served_by != cache), every model summed, as
    the core's Histogram: what the page's p50 and p99 must equal when its window began at zero."""
    cumulative: dict[float, float] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name == "edgellm_time_to_first_token_seconds":
            for sample in family.samples:
                if sample.name.endswith("_bucket") and sample.labels["served_by"] != "cache":
                    le = float(sample.labels["le"])
                    cumulative[le] = cumulative.get(le, 0.0) + sample.value
    counts = [cumulative.get(bound, 0.0) for bound in (*TIME_BUCKETS, math.inf)]
    per_bucket = [int(n - (counts[i - 1] if i else 0)) for i, n in enumerate(counts)]
    return Histogram(buckets=per_bucket, count=int(counts[-1]))


def post(edge: EdgeServer, key: str | None, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    response = httpx.post(edge.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    edge.drain()
    return response


async def test_live_view_draws_the_traffic_as_metrics_counts_it(page: Page, start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps],
                                                               tmp_path: Path, screenshot: Callable[[str], Awaitable[None]]) -> None:
    deps = make_deps(config=Config(admin_token=ADMIN), usage=SqliteUsage(tmp_path / "usage.sqlite3"))
    keys = {tenant: await made_key(deps, tenant) for tenant in ("alice", "bob")}
    edge = start_edge(deps)
    problems = watch_errors(page)
    body = page.locator("body")

    await page.goto(f"{edge.url}/usage?every={EVERY}")
    await expect(body).to_have_attribute("data-live", "off")  # waits for the token
    await open_live(page, edge)
    await expect(body).to_have_attribute("data-live", "live")  # two scrapes before any traffic: the window starts at zero

    # hidden, the page stops scraping: what is sent now falls in one interval, measured on return
    await set_visibility(page, "hidden")
    await expect(body).to_have_attribute("data-live", "paused")
    taken = await samples(page)
    miss, hit = post(edge, keys["alice"], Q), post(edge, keys["alice"], Q)
    assert (miss.headers["cf-aig-cache-status"], hit.headers["cf-aig-cache-status"]) == ("MISS", "HIT")
    assert post(edge, keys["alice"], {"messages": "not a list"}).status_code == 400
    assert await samples(page) == taken  # no scrape while hidden
    await set_visibility(page, "visible")
    await wait_samples(page, taken + 1)

    assert await values(page, "live-hits", "hit ratio") == [0.5]  # one MISS and one HIT; no point where nothing was cacheable
    assert max(await values(page, "live-errors", "4xx")) > 0
    assert max(await values(page, "live-errors", "5xx")) == 0
    assert max(await values(page, "live-requests", "requests")) > 0
    p50, p99 = await values(page, "live-ttft", "p50"), await values(page, "live-ttft", "p99")
    assert len(p50) == len(p99) == 1 and 0 < p50[0] <= p99[0]  # one generation: the HIT is not among them
    now = {name: await card(page, name) for name in ("requests", "4xx", "5xx", "hit-ratio", "ttft-p50", "ttft-p99")}
    assert now["requests"] and now["requests"] > 0 and now["4xx"] and now["4xx"] > 0 and now["5xx"] == 0
    assert now["hit-ratio"] == 0.5
    assert now["ttft-p50"] is not None and now["ttft-p99"] is not None and 0 < now["ttft-p50"] <= now["ttft-p99"]
    assert now["ttft-p50"] * 1000 == pytest.approx(p50[0])
    # the window began at zero, so this interval holds every generation /metrics has counted
    counted_ttft = generation_ttft(httpx.get(edge.url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10).text)
    assert counted_ttft.count == 1
    assert (p50[0], p99[0]) == (pytest.approx(counted_ttft.quantile(0.5) * 1000), pytest.approx(counted_ttft.quantile(0.99) * 1000))

    assert post(edge, keys["bob"], Q).status_code == 200
    await expect(page.locator('#live-tokens rect.bar[data-label="bob"]')).to_have_count(2)  # prompt and generated
    exposition = httpx.get(edge.url + "/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10).text
    counted = tokens_by_tenant(exposition)
    assert {tenant for tenant, _ in counted} == {"alice", "bob"}
    for (tenant, measure), tokens in counted.items():
        assert tokens > 0
        await expect(page.locator(f'#live-tokens rect.bar[data-label="{tenant}"][data-measure="{measure}"]')).to_have_attribute(
            "data-value", f"{tokens:g}")

    # a phone: the live charts are drawn again at its width, their legends and labels inside them
    await page.set_viewport_size(PHONE)
    await page.wait_for_function("() => { const svg = document.getElementById('live-ttft'); "
                                 "return svg.viewBox.baseVal.width === svg.clientWidth && svg.clientWidth < 400; }")
    for chart in [c for c in await page.evaluate(BOXES) if c["id"].startswith("live-")]:
        assert chart["legend"], chart["id"]
        for text in chart["legend"] + chart["labels"]:
            assert inside(text["box"], chart["box"]), (chart["id"], text)
    await screenshot("live")
    assert problems == []


async def test_an_unreachable_edge_leaves_the_last_charts_stale(page: Page, start_edge: Callable[..., EdgeServer]) -> None:
    edge = start_edge(config=Config(admin_token=ADMIN, open_access=True))
    problems = watch_errors(page)
    await open_live(page, edge)
    await expect(page.locator("body")).to_have_attribute("data-live", "live")
    assert post(edge, None, Q).status_code == 200
    await wait_samples(page, await samples(page) + 1)
    drawn = await values(page, "live-requests", "requests")

    await page.route("**/metrics", lambda route: route.abort("connectionrefused"))
    await expect(page.locator("body")).to_have_attribute("data-live", "stale")
    await expect(page.locator("#live-status")).to_contain_text("Stale since")
    assert await values(page, "live-requests", "requests") == drawn  # the last charts stay
    await page.set_viewport_size(PHONE)  # and are drawn again at a phone's width, with no scrape to redraw them
    await page.wait_for_function("() => { const svg = document.getElementById('live-requests'); "
                                 "return svg.viewBox.baseVal.width === svg.clientWidth && svg.clientWidth < 400; }")
    assert await values(page, "live-requests", "requests") == drawn

    await page.unroute("**/metrics")
    await expect(page.locator("body")).to_have_attribute("data-live", "live")
    assert problems == []


@pytest.mark.parametrize("usage_store", [True, False], ids=["report-names-the-tenant", "metrics-refuses-the-key"])
async def test_a_tenant_key_is_told_the_live_view_needs_the_admin_token(page: Page, start_edge: Callable[..., EdgeServer], make_deps: Callable[..., Deps],
                                                                       tmp_path: Path, usage_store: bool) -> None:
    """With a usage store, /admin/usage names the key's tenant and the page asks /metrics nothing;
    without one, /metrics itself refuses the key as a tenant's (403, where a wrong token is a 401).
    Either way the page says why."""
    deps = make_deps(config=Config(admin_token=ADMIN), usage=SqliteUsage(tmp_path / "usage.sqlite3") if usage_store else None)
    key = await made_key(deps, "alice")
    edge = start_edge(deps)
    problems = watch_errors(page)
    scraped: list[int] = []
    page.on("response", lambda response: scraped.append(response.status) if response.url.endswith("/metrics") else None)

    await open_live(page, edge, key)
    await expect(page.locator("body")).to_have_attribute("data-live", "tenant")
    await expect(page.locator("#live-status")).to_contain_text("needs the admin token")
    assert scraped == ([] if usage_store else [403])
    assert await page.locator("#live .charts svg :is(polyline, circle, rect), #live-cards > *").count() == 0  # nothing drawn
    for chart in await page.locator("#live .charts svg").all():  # and each chart says why
        assert "needs the admin token" in (await chart.text_content() or "")

    await page.get_by_label("Admin token or API key").fill("wrong")
    await page.get_by_role("button", name="Show usage").click()
    await expect(page.locator("body")).to_have_attribute("data-live", "refused")
    await expect(page.locator("#live-status")).to_contain_text("401")
    assert problems == []


async def test_without_an_admin_token_the_live_view_runs_where_metrics_are_open(page: Page, start_edge: Callable[..., EdgeServer]) -> None:
    """No token to type: an open /metrics (`edgellm dev` on loopback) is watched at once; a closed
    one's 404 says how to turn the admin routes on."""
    problems = watch_errors(page)
    open_metrics = start_edge(config=Config(open_access=True, metrics_open=True))
    await open_live(page, open_metrics, token=None)
    await expect(page.locator("body")).to_have_attribute("data-live", "live")
    await expect(page.locator("#admin-off")).to_be_visible()

    # admin routes on, /metrics open all the same (`edgellm dev --admin-token T` on loopback): /healthz says so
    both = start_edge(config=Config(open_access=True, admin_token=ADMIN, metrics_open=True))
    await open_live(page, both, token=None)
    await expect(page.locator("body")).to_have_attribute("data-live", "live")
    await expect(page.locator("#admin-off")).to_be_hidden()

    closed = start_edge(config=Config(open_access=True))
    await open_live(page, closed, token=None)
    await expect(page.locator("body")).to_have_attribute("data-live", "admin-off")
    await expect(page.locator("#live-status")).to_contain_text("--admin-token")
    assert problems == []


# --- the pure functions, in Chromium -------------------------------------------------------------

EXPOSITION = r"""# HELP edgellm_requests_total Requests, with \\ a backslash and \n a new line in the help.
# TYPE edgellm_requests_total counter
edgellm_requests_total{route="/v1/chat/completions",tenant="say \"hi\"",status="2xx"} 3
edgellm_requests_total{route="C:\\dir\\",tenant="two\nlines",status="4xx"} 1.0 1700000000000
# a comment that is neither HELP nor TYPE

# TYPE edgellm_time_to_first_token_seconds histogram
edgellm_time_to_first_token_seconds_bucket{served_by="edge",le="0.001"} 0.0
edgellm_time_to_first_token_seconds_bucket{served_by="edge",le="+Inf"} 2.0
edgellm_time_to_first_token_seconds_count{served_by="edge"} 2.0
edgellm_time_to_first_token_seconds_sum{served_by="edge"} 1.5e-3
# TYPE edgellm_slots gauge
edgellm_slots{state="a}b,c=d"} -Inf
edgellm_slots{state="x"} +Inf
"""


async def run_live(page: Page, body: str, arg: Any = None) -> Any:
    return await page.evaluate(f"async (arg) => {{ const m = await import('{LIVE}'); {body} }}", arg)


async def test_the_parser_reads_what_prometheus_client_reads(page: Page, edge: EdgeServer) -> None:
    await page.goto(edge.url + "/")
    parsed = await run_live(page, "return m.parseExposition(arg);", EXPOSITION)
    expected = [(s.name, s.labels, s.value) for f in text_string_to_metric_families(EXPOSITION) for s in f.samples]
    assert [(s["name"], s["labels"], s["value"]) for s in parsed["samples"]] == expected
    assert parsed["samples"][1]["labels"] == {"route": "C:\\dir\\", "tenant": "two\nlines", "status": "4xx"}
    assert parsed["samples"][0]["labels"]["tenant"] == 'say "hi"'
    assert parsed["samples"][3]["labels"]["le"] == "+Inf" and [s["value"] for s in parsed["samples"][-2:]] == [-math.inf, math.inf]
    assert parsed["types"] == {"edgellm_requests_total": "counter", "edgellm_time_to_first_token_seconds": "histogram", "edgellm_slots": "gauge"}
    assert parsed["help"]["edgellm_requests_total"] == "Requests, with \\ a backslash and \n a new line in the help."
    for broken in ('edgellm_x{a="b} 1', "edgellm_x{a=b} 1", "edgellm_x", "edgellm_x one"):
        assert await run_live(page, "try { m.parseExposition(arg); return 'parsed'; } catch (e) { return e.name; }", broken) == "SyntaxError", broken


OBSERVED = [[], [0.0005], [0.02, 0.02, 0.3], [0.004] * 9 + [70.0], [0.001, 0.0025, 0.003, 0.2, 0.7, 1.1, 4.0, 12.0, 45.0], [100.0]]


@pytest.mark.parametrize("observed", OBSERVED, ids=[f"{len(o)}-observed" for o in OBSERVED])
async def test_histogram_quantile_is_the_cores(page: Page, edge: EdgeServer, observed: list[float]) -> None:
    await page.goto(edge.url + "/")
    histogram = Histogram()
    for value in observed:
        histogram.observe(value)
    buckets = [[bound, count] for bound, count in zip((*TIME_BUCKETS, math.inf), histogram.cumulative())]
    for q in (0.01, 0.5, 0.9, 0.99, 1.0):
        got = await run_live(page, "return m.histogramQuantile(arg.q, arg.buckets);", {"q": q, "buckets": buckets})
        assert got == pytest.approx(histogram.quantile(q)), q


SCRAPE = """(isolate, requests, at) => m.scrapeOf(m.parseExposition(
  `# TYPE edgellm_requests_total counter\\n` +
  `edgellm_requests_total{route="/v1/chat/completions",model="m",tenant="t",status="2xx"} ${requests}\\n` +
  `# TYPE edgellm_isolate_start_time_seconds gauge\\nedgellm_isolate_start_time_seconds ${isolate}\\n`), at)"""


async def test_a_reset_or_another_isolate_is_never_a_negative_or_huge_rate(page: Page, edge: EdgeServer) -> None:
    await page.goto(edge.url + "/")
    got = await run_live(page, f"""const scrape = {SCRAPE};
      const kept = new m.LiveWindow();
      const first = kept.add(scrape(100, 5000, 0));           // isolate A, long running
      const other = kept.add(scrape(200, 3, 10_000));         // B answers: new to this page
      const back = kept.add(scrape(100, 5006, 20_000));       // A again: 6 more in 20 s
      return {{
        isolateChange: m.increase(scrape(100, 5000, 0), scrape(200, 3, 10_000)),
        first, other, intervals: kept.intervals.length, perMinute: m.figuresOf(kept.intervals).requestsPerMinute,
        backFrom: back.from,
        reset: m.figuresOf([m.increase(scrape(100, 50, 0), scrape(100, 4, 60_000))]).requestsPerMinute,
      }};""")
    assert got["isolateChange"] is None and got["first"] is None and got["other"] is None
    assert got["intervals"] == 1 and got["backFrom"] == 0  # A against A, across B
    assert got["perMinute"] == pytest.approx(6 * 60 / 20)  # never (3 - 5000) nor 5003 in 10 s
    assert got["reset"] == 4  # a counter lower than before restarted: it rose by its new value, not -46


INTERVAL = """# TYPE edgellm_requests_total counter
edgellm_requests_total{route="/v1/chat/completions",model="m",tenant="a",status="2xx"} 4
edgellm_requests_total{route="/v1/chat/completions",model="m",tenant="a",status="4xx"} 2
edgellm_requests_total{route="/v1/completions",model="m",tenant="b",status="5xx"} 1
edgellm_requests_total{route="/metrics",model="",tenant="",status="2xx"} 50
# TYPE edgellm_cache_hits_total counter
edgellm_cache_hits_total 3
# TYPE edgellm_cache_misses_total counter
edgellm_cache_misses_total 1
# TYPE edgellm_cache_semantic_hits_total counter
edgellm_cache_semantic_hits_total 1
# TYPE edgellm_prompt_tokens_total counter
edgellm_prompt_tokens_total{model="m",tenant="a"} 10
edgellm_prompt_tokens_total{model="m",tenant="b"} 5
edgellm_prompt_tokens_total{model="m",tenant="c"} 0
# TYPE edgellm_generation_tokens_total counter
edgellm_generation_tokens_total{model="m",tenant="a"} 4
edgellm_generation_tokens_total{model="m2",tenant="a"} 6
# TYPE edgellm_time_to_first_token_seconds histogram
edgellm_time_to_first_token_seconds_bucket{model="m",served_by="cache",le="0.001"} 3
edgellm_time_to_first_token_seconds_bucket{model="m",served_by="cache",le="+Inf"} 3
edgellm_time_to_first_token_seconds_bucket{model="m",served_by="edge",le="0.01"} 0
edgellm_time_to_first_token_seconds_bucket{model="m",served_by="edge",le="0.025"} 1
edgellm_time_to_first_token_seconds_bucket{model="m",served_by="edge",le="+Inf"} 1
# TYPE edgellm_num_requests_running gauge
edgellm_num_requests_running 7
# TYPE edgellm_isolate_start_time_seconds gauge
edgellm_isolate_start_time_seconds 100
"""
QUIET = """# TYPE edgellm_requests_total counter
edgellm_requests_total{route="/metrics",model="",tenant="",status="2xx"} 50
# TYPE edgellm_isolate_start_time_seconds gauge
edgellm_isolate_start_time_seconds 100
"""


async def test_what_half_a_minute_of_counters_reads_as(page: Page, edge: EdgeServer) -> None:
    """From zero to INTERVAL in 30 s: rates per minute without the scrapes of /metrics, the hit ratio
    of cacheable requests, TTFT of generations only (the cache's 1 ms would be the p50 otherwise),
    tokens by tenant across models (a tenant with none is no bar); a gauge is no rate. Nothing cacheable, no generation: no
    ratio and no TTFT, rather than a 0 that reads as "every request missed"."""
    body = """const at = (text, ms) => m.scrapeOf(m.parseExposition(text), ms);
      const start = `# TYPE edgellm_isolate_start_time_seconds gauge\nedgellm_isolate_start_time_seconds 100\n`;
      return [m.figuresOf([m.increase(at(start, 0), at(arg, 30_000))]), [...at(arg, 0).values.keys()].some((k) => k.includes("running"))];"""
    await page.goto(edge.url + "/")
    figures, gauge_kept = await run_live(page, body, INTERVAL)
    assert not gauge_kept
    assert (figures["requests"], figures["requestsPerMinute"], figures["clientErrorsPerMinute"], figures["serverErrorsPerMinute"]) == (7, 14, 4, 2)
    assert (figures["hitRatio"], figures["semanticHitRatio"]) == (0.75, 0.25)
    assert figures["ttftP50"] == pytest.approx(0.0175) and figures["ttftP99"] == pytest.approx(0.01 + 0.015 * 0.99)
    assert figures["tokens"] == [{"tenant": "a", "prompt": 10, "generated": 10}, {"tenant": "b", "prompt": 5, "generated": 0}]
    quiet = (await run_live(page, body, QUIET))[0]
    assert quiet["requestsPerMinute"] == 0 and quiet["hitRatio"] is None and quiet["ttftP50"] is None and quiet["tokens"] == []


@pytest.mark.parametrize(("search", "every"), [("", 5000), ("?every=200", 200), ("?every=5", 100), ("?every=soon", 5000), ("?every=-1", 5000)])
async def test_every_sets_how_often_it_scrapes(page: Page, edge: EdgeServer, search: str, every: int) -> None:
    await page.goto(edge.url + "/")
    assert await run_live(page, "return m.pollEvery(arg);", search) == every
