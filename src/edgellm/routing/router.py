"""The pool's view in one place on Cloudflare: a `RouterObject` Durable Object per pool.

Isolates share nothing: each Worker isolate sees only the requests it sent itself, so its view
of a pool's in flight and held prefixes is partial (`pools`). With the `ROUTER` binding, a
request first asks its pool's object "where should this go" (`POST /pick`): the object keeps the
whole pool's view (every isolate's dispatches, the replicas' own reports, which it probes in the
background when they are older than `probe_age_ms`) and runs the same `scheduler` over it. The
request waits at most the pool's `router_ms` for the answer; past that, or on any error, it
decides from its own isolate's view (rendezvous on the prefix keeps isolates that fall back
agreeing on a new prefix's replica). An object that misses its deadline three times in ten
seconds is not asked for the next ten (a breaker per isolate and pool, `PoolView.router_breaker`):
an object past its throughput (Cloudflare: a soft limit of 1,000 requests a second per object)
is then not kept busy by requests that will not wait for it, nor do they each wait `router_ms`. When the answer ends, `POST /done` tells the object (in the
background, `wait_until`), so its in-flight counts come down. An entry whose `/done` never
arrives (an isolate evicted mid-answer) expires after the replica's `total_ms`.

    Worker ──POST /pick {pool, blocks, tokens, chars, session, id}──▶ RouterObject(pool)
           ◀── {"picks": [[name, reason], ...]} ── (within router_ms, else the isolate's view)
    ... the answer streams from the replica ...
    Worker ──POST /done {id, name, ok, ttft_s, itl_s, total_s, cached_tokens, prompt_tokens}──▶ (waitUntil)
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from ..deps import Deps
from ..http import Request, Response, json_response
from .fleet import Expected, PoolView
from .probe import refresh
from .scheduler import Ask, Pick

ROUTER_HOST = "https://router.internal"


@dataclass
class RouterObject:
    """One pool's view, hosted in a Durable Object (`Router` in src/entry.py; locally
    `emulator.durable.local_routers`). `deps` are the object's own bindings (its `fetch` probes
    the replicas). Each request names its pool (`"pool"`), so the object needs no name of its own;
    the Worker reaches one object per pool (`idFromName(pool)`)."""

    deps: Deps
    views: dict[str, PoolView] = field(default_factory=dict)
    # request id -> (replica, when, what the view expected the replica to reuse)
    leases: dict[str, tuple[str, float, Expected]] = field(default_factory=dict)
    probing: dict[str, asyncio.Future[Any]] = field(default_factory=dict)

    def _view(self, name: str) -> PoolView | None:
        pool = self.deps.config.routing.pools.get(name)
        if pool is None:
            return None
        view = self.views.get(name)
        if view is None or view.config != pool:
            view = self.views[name] = PoolView(pool, self.deps.config.routing.breaker, first_tokens=False)
        return view

    async def fetch(self, request: Request) -> Response:
        try:
            data = json.loads(request.body or b"{}")
        except ValueError:
            return json_response({"error": "not JSON"}, 400)
        if not isinstance(data, dict):
            return json_response({"error": "not a JSON object"}, 400)
        view = self._view(str(data.get("pool", "")))
        if view is None:
            return json_response({"error": f"no pool {data.get('pool')!r}"}, 404)
        now = self.deps.clock.now()
        self._expire(view, now)
        if request.path == "/pick":
            self._refresh_in_background(view)
            try:
                ask = Ask(tuple(int(b) for b in data.get("blocks", ())), float(data.get("tokens", 0)), int(data.get("chars", 0)),
                          str(data["session"]) if data.get("session") else None, continues=data.get("continues") is True)
            except (TypeError, ValueError):
                return json_response({"error": "not an ask"}, 400)
            picks = view.choose(ask, now)
            if picks:
                expected = view.dispatched(picks[0].name, ask, picks[0].reason, now)
                self.leases[str(data.get("id", ""))] = (picks[0].name, now, expected)
            return json_response({"picks": [[p.name, p.reason] for p in picks]})
        if request.path == "/done":
            lease = self.leases.pop(str(data.get("id", "")), None)
            name = data.get("name")
            if lease is not None and (name is None or lease[0] == name):  # name None: the Worker gave up waiting
                view.finished(lease[0], now, data.get("ok"), data.get("ttft_s"), data.get("itl_s"),
                              data.get("cached_tokens"), data.get("prompt_tokens"), data.get("total_s"), expected=lease[2])
            elif name in view.replicas and data.get("ok") is False:  # a failover's failure: the breaker still hears it
                view.replicas[name].breaker.failure(now)
            return json_response({"ok": True})
        if request.path == "/stats":
            return json_response({**view.to_json(now), "scope": "pool"})
        return json_response({"error": "unknown path"}, 404)

    def _expire(self, view: PoolView, now: float) -> None:
        routing = self.deps.config.routing
        for key, (name, at, expected) in list(self.leases.items()):
            origin = routing.origin(name)
            if origin is None or now - at > origin.total_ms / 1000:
                del self.leases[key]
                if name in view.replicas:
                    view.finished(name, now, None, expected=expected)

    def _refresh_in_background(self, view: PoolView) -> None:
        """The object probes stale replicas on its own time: a pick never waits for a probe."""
        name = view.config.name
        running = self.probing.get(name)
        if running is not None and not running.done():
            return
        members = [o for o in self.deps.config.routing.origins if o.pool == name]
        self.probing[name] = task = asyncio.ensure_future(refresh(self.deps, view, members))
        self.deps.wait_until(task)


async def ask_router(deps: Deps, view: PoolView, ask: Ask) -> tuple[list[Pick], str] | None:
    """The pool's object's order for `ask` and the lease its first pick is counted under, or None
    (no object bound, or no answer within the pool's `router_ms`): then the isolate's own view
    decides. The isolate's view hears the dispatch either way (`pools.dispatched`)."""
    routers = getattr(deps, "routers", None)
    if routers is None:
        return None
    counters = deps.state.routing.counters
    breaker = view.router_breaker
    now = deps.clock.now()
    if breaker.admit(now) == "skip":  # it has been missing its deadline: not asked until the cool-down ends
        counters.router_skips += 1
        return None
    lease = deps.state.ids.hex(8)
    body = json.dumps({"pool": view.config.name, "blocks": [str(b) for b in ask.blocks], "tokens": ask.prompt_tokens, "chars": ask.prompt_chars,
                       "session": ask.session, "continues": ask.continues, "id": lease}).encode()
    try:
        async with asyncio.timeout(view.config.router_ms / 1000):
            response = await routers.get(view.config.name).fetch(
                Request("POST", ROUTER_HOST + "/pick", {"content-type": "application/json"}, body))
            data = json.loads(response.body) if isinstance(response.body, (bytes, bytearray)) else None
    except Exception:  # a timeout, the object failing, its answer not JSON: the isolate decides
        counters.router_fallbacks += 1
        breaker.failure(deps.clock.now())
        deps.wait_until(_done(deps, view.config.name, {"pool": view.config.name, "id": lease, "name": None, "ok": None}))
        return None
    picks = data.get("picks") if isinstance(data, dict) else None
    if not isinstance(picks, list) or not all(isinstance(p, list) and len(p) == 2 and p[0] in view.replicas for p in picks):
        counters.router_fallbacks += 1
        breaker.failure(deps.clock.now())
        return None
    counters.router_answers += 1
    breaker.success(deps.clock.now())
    return [Pick(str(name), str(reason), 0.0) for name, reason in picks], lease


def report(deps: Deps, choice: Any, **outcome: Any) -> None:
    """Tell the pool's object how a replica it was asked about did (in the background)."""
    routers = getattr(deps, "routers", None)
    lease = getattr(choice, "lease", None)
    if routers is None or choice.view is None or lease is None:
        return
    pool = choice.view.config.name
    deps.wait_until(_done(deps, pool, {"pool": pool, "id": lease, "name": choice.origin.name, **outcome}))


async def _done(deps: Deps, pool: str, data: dict[str, Any]) -> None:
    try:
        response = await deps.routers.get(pool).fetch(  # type: ignore[attr-defined]
            Request("POST", ROUTER_HOST + "/done", {"content-type": "application/json"}, json.dumps(data).encode()))
        body = response.body
        if not isinstance(body, (bytes, bytearray)):
            from ..stream import close_source

            await close_source(body)
    except Exception as exc:  # the object lost one report: its lease expires on its own
        deps.log.warning("the router of pool %s did not take a report: %s", pool, exc)
