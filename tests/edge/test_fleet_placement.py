"""Where a pool's view lives on Cloudflare, where isolates share nothing: several isolates of
the Worker (each an `EdgeApp` with its own `IsolateState`) behind one server, with and without
the pool's Durable Object (the local stand-in, `emulator.durable.local_routers`), in front of
real llama.cpp replica processes."""

from __future__ import annotations

import asyncio
import os
import signal
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator

import httpx
import pytest

from bench.fleet_replicas import Replica, pool_origins
from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.http import Request, Response
from edgellm.state import IsolateState
from edgellm_local.emulator.durable import LocalDurableObjectNamespace, local_routers
from edgellm_local.emulator.http_fetch import HttpxFetch
from edgellm_local.emulator.server import EdgeApp, EdgeServer
from tests.edge.test_fleet import ADMIN, Hanging, chat, replicas, route, wait_for  # noqa: F401 (replicas: a fixture)

ISOLATE = "x-test-isolate"


@dataclass
class Isolates:
    """Isolates of one Worker behind one server: a request goes to the isolate its `x-test-isolate`
    header names. Everything else (the server's limits, draining) is the first isolate's."""

    apps: list[EdgeApp]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.apps[0], name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.apps[0](scope, receive, send)
        headers = dict(scope.get("headers") or [])
        await self.apps[int(headers.get(ISOLATE.encode(), b"0"))](scope, receive, send)


@dataclass
class SlowRouters:
    """The ROUTER binding with a fault: every call to an object is delayed by `delay_s` (a
    Durable Object far away, or overloaded), then goes through."""

    inner: LocalDurableObjectNamespace
    delay_s: float

    def get(self, name: str) -> "SlowRouters._Stub":
        return SlowRouters._Stub(self.inner.get(name), self.delay_s)

    @dataclass
    class _Stub:
        stub: Any
        delay_s: float

        async def fetch(self, request: Request) -> Response:
            await asyncio.sleep(self.delay_s)
            return await self.stub.fetch(request)


@pytest.fixture
def isolates(make_deps: Callable[..., Deps]) -> Iterator[Callable[..., list[httpx.Client]]]:
    servers: list[EdgeServer] = []
    clients: list[httpx.Client] = []

    def start(members: list[Any], count: int = 2, objects: bool = True, slow_s: float | None = None, **settings: Any) -> list[httpx.Client]:
        config = Config.from_env({"ADMIN_TOKEN": ADMIN, "OPEN_ACCESS": "true", "ORIGINS": pool_origins(members, kind=None, **settings)})
        base = replace(make_deps(config=config), fetch=HttpxFetch(), kv=None)
        apps = [EdgeApp(replace(base, state=IsolateState()), route_objects=False) for _ in range(count)]
        if objects:
            routers = local_routers(base, apps[0].wait_until)
            shared = SlowRouters(routers, slow_s) if slow_s is not None else routers
            for app in apps:
                app.deps = replace(app.deps, routers=shared)
        server = EdgeServer(Isolates(apps)).start()  # type: ignore[arg-type]
        servers.append(server)
        made = [httpx.Client(base_url=server.url, timeout=60, headers={ISOLATE: str(i)}) for i in range(count)]
        clients.extend(made)
        return made

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


def admin(client: httpx.Client) -> dict[str, Any]:
    return client.get("/admin/routing/stats", headers={"authorization": f"Bearer {ADMIN}"}).json()


def in_flight(client: httpx.Client, name: str, *, pool_object: bool) -> int:
    pools = admin(client)["pool_objects" if pool_object else "pools"]
    return next(r["in_flight"] for r in pools[0]["replicas"] if r["name"] == name)


@pytest.mark.parametrize("objects", [True, False], ids=["pool-object", "isolate-views"])
def test_a_prefix_one_isolate_warmed_is_found_by_another_only_through_the_pools_object(
        isolates: Callable[..., list[httpx.Client]], replicas: list[Replica], objects: bool) -> None:
    # strict balance (load_bound 0): a replica with a request in flight takes no more while another
    # has none, so where the second isolate's request goes shows what its decision knew
    first, second = isolates(replicas, objects=objects, router_ms=5000, load_bound=0)
    warmed = route(first.post("/v1/chat/completions", json=chat("from the first isolate")))
    holder = next(r for r in replicas if r.name == warmed["origin"])
    hanging = Hanging(first)
    os.kill(holder.process.pid, signal.SIGSTOP)
    try:
        hanging.send(chat("busy"))  # the first isolate keeps the holder busy
        wait_for(lambda: in_flight(first, holder.name, pool_object=False) == 1, "the first isolate's request in flight")
        if objects:
            wait_for(lambda: in_flight(first, holder.name, pool_object=True) == 1, "the pool's object counting it")
            moved = route(second.post("/v1/chat/completions", json=chat("from the second isolate")))
            assert moved["origin"] != holder.name and moved["reason"] == "load"  # it knows the holder is busy
            holders = {holder.name, moved["origin"]}
        else:
            # the second isolate's own view is empty: rendezvous on the prefix sends it to the same
            # replica (so the prefix is found), but it cannot see that replica is busy
            hanging.send(chat("from the second isolate"), **{ISOLATE: "1"})
            wait_for(lambda: in_flight(second, holder.name, pool_object=False) == 1, "the second isolate piling on")
    finally:
        os.kill(holder.process.pid, signal.SIGCONT)
    joined = hanging.join()
    assert all(r.status_code == 200 for r in joined), [r.text[:300] for r in joined]
    if objects:
        again = route(second.post("/v1/chat/completions", json=chat("and again from the second")))
        assert again["origin"] in holders and again["reason"] == "prefix"  # a prefix warmed through either isolate
        seen = admin(second)
        whole = {r["name"]: r for r in seen["pool_objects"][0]["replicas"]}
        mine = {r["name"]: r for r in seen["pools"][0]["replicas"]}
        assert sum(r["sent"] for r in whole.values()) == 4 and sum(r["sent"] for r in mine.values()) == 2  # the object saw both isolates
        assert all(r["in_flight"] == 0 for r in whole.values())
        assert seen["router_answers"] == 2 and seen["router_fallbacks"] == 0


def test_a_slow_pool_object_is_not_waited_for(isolates: Callable[..., list[httpx.Client]], replicas: list[Replica]) -> None:
    first, second = isolates(replicas, slow_s=0.5, router_ms=20)
    answers = [route(client.post("/v1/chat/completions", json=chat(f"q{i}"))) for i, client in enumerate([first, second, first])]
    assert all(a["origin"] in {r.name for r in replicas} for a in answers)
    assert admin(first)["router_fallbacks"] == 2 and admin(first)["router_answers"] == 0
    # the isolates' own views decided, and rendezvous on the shared prefix kept them on one replica
    assert len({a["origin"] for a in answers}) == 1
