"""The pool's routing object as Cloudflare hosts it: `entry.Router` over the REAL Workers Python
SDK (`workers-runtime-sdk`), reached through the Worker's adapter (`WorkersDurableObjectNamespace`)
exactly as a request asks it, with only what lies under the SDK stood in (`fake_pyodide`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgellm.config import Config
from edgellm.deps import Deps
from edgellm.routing.fleet import PoolView
from edgellm.routing.router import ask_router, report
from edgellm.routing.pools import Choice
from edgellm.routing.scheduler import Ask, prefix_blocks
from edgellm.state import IsolateState
from tests.support import fake_pyodide as fp

ORIGINS = json.dumps([{"pool": "gpu", "replicas": ["http://10.0.0.1:8080", "http://10.0.0.2:8080", "http://10.0.0.3:8080"]}])


@pytest.fixture
def runtime() -> Any:
    with fp.installed() as rt:
        import entry

        yield rt, entry


class Background:
    def __init__(self) -> None:
        self.work: list[Any] = []

    def __call__(self, awaitable: Any) -> None:
        self.work.append(awaitable)

    async def settle(self) -> None:
        while self.work:
            await self.work.pop(0)


def isolate(namespace: Any, background: Background) -> tuple[Deps, PoolView]:
    """A Worker isolate of its own: its own state, the ROUTER binding as the SDK hands it over."""
    from workers.rpc import _DurableObjectNamespaceWrapper

    from edgellm.runtime.pyodide_durable import WorkersDurableObjectNamespace

    config = Config.from_env({"ORIGINS": ORIGINS, "OPEN_ACCESS": "true"})
    deps = Deps(config=config, ai=None, routers=WorkersDurableObjectNamespace(_DurableObjectNamespaceWrapper(namespace)), wait_until=background,  # type: ignore[arg-type]
                state=IsolateState(config=config))
    return deps, PoolView(config.routing.pools["gpu"])


async def test_two_isolates_share_the_pools_view_through_the_router_object(runtime: Any) -> None:
    rt, entry = runtime
    env = fp.JsEnv(AI=object(), ORIGINS=ORIGINS, OPEN_ACCESS="true")
    namespace = fp.DurableObjectNamespace(entry.Router, env)
    background = Background()
    (first, first_view), (second, second_view) = isolate(namespace, background), isolate(namespace, background)
    ask = Ask(prefix_blocks("a shared system prompt " * 200), 1150, 4600)  # a prefix worth more than a queued answer
    picks, lease = await ask_router(first, first_view, ask)
    holder = picks[0].name
    assert {p.name for p in picks} == {"gpu-1", "gpu-2", "gpu-3"}
    origin = first.config.routing.origin(holder)
    report(first, Choice(origin, "load", first_view, ask, lease), ok=True, ttft_s=0.1, itl_s=0.01)  # answered: held there
    await background.settle()
    again, second_lease = await ask_router(second, second_view, ask)
    assert again[0].name == holder and again[0].reason == "prefix" and second_lease != lease  # learned from the first isolate
    third, third_lease = await ask_router(first, first_view, ask)
    assert third[0].name == holder
    # two in flight on the holder: a fourth ask spills, whichever isolate makes it
    fourth, fourth_lease = await ask_router(second, second_view, ask)
    assert fourth[0].name != holder
    for done_lease in (second_lease, third_lease):  # the answers end: the object's in-flight comes down
        report(first, Choice(origin, "prefix", first_view, ask, done_lease), ok=True, ttft_s=0.1, itl_s=0.01)
    await background.settle()
    view = namespace.instance("gpu").router.views["gpu"]
    assert view.replicas[holder].sent == 3 and view.replicas[holder].in_flight == 0
    assert first.state.routing.counters.router_answers == 2 and second.state.routing.counters.router_answers == 2


async def test_an_isolate_tells_the_object_a_turn_continues_its_conversation(runtime: Any) -> None:
    """A later turn of a session the object never saw goes where any view would send it (the
    fewest queued, ties by its application's rendezvous), not to a replica the object measured
    faster, as a first turn does; that holds only if the isolate's ask says the turn continues."""
    from edgellm.routing.scheduler import rendezvous

    rt, entry = runtime
    namespace = fp.DurableObjectNamespace(entry.Router, fp.JsEnv(AI=object(), ORIGINS=ORIGINS, OPEN_ACCESS="true"))
    background = Background()
    deps, view = isolate(namespace, background)
    names = ("gpu-1", "gpu-2", "gpu-3")
    served = []
    for i in range(3):  # one answer on each replica, in flight at once, then their speeds
        warm = Ask(prefix_blocks(f"warm {i} " * 200), 250, 1000)
        picks, lease = await ask_router(deps, view, warm)
        served.append((deps.config.routing.origin(picks[0].name), warm, lease))
    assert {origin.name for origin, _, _ in served} == set(names)
    faster = served[0][0].name
    for origin, warm, lease in served:
        report(deps, Choice(origin, "load", view, warm, lease), ok=True, ttft_s=0.1, itl_s=0.005 if origin.name == faster else 0.03)
    await background.settle()
    text = next(f"app {i} " * 200 for i in range(100)
                if max(names, key=lambda n: rendezvous(prefix_blocks(f"app {i} " * 200)[0], n)) != faster)
    later = Ask(prefix_blocks(text), 250, 1000, "s1", continues=True)
    ranked_first = max(names, key=lambda n: rendezvous(later.blocks[0], n))
    assert (await ask_router(deps, view, later))[0][0].name == ranked_first
    first = Ask(prefix_blocks(text), 250, 1000, "s2")
    assert (await ask_router(deps, view, first))[0][0].name == faster


class FailingRouters:
    """The ROUTER binding with a fault: every call to an object fails (an overloaded object)."""

    calls = 0

    def get(self, name: str) -> "FailingRouters":
        return self

    async def fetch(self, request: Any) -> Any:
        FailingRouters.calls += 1
        raise RuntimeError("overloaded")


async def test_an_object_that_keeps_failing_is_left_out_of_the_request_path() -> None:
    config = Config.from_env({"ORIGINS": ORIGINS, "OPEN_ACCESS": "true"})
    background = Background()
    deps = Deps(config=config, ai=None, routers=FailingRouters(), wait_until=background, state=IsolateState(config=config))  # type: ignore[arg-type]
    view = PoolView(config.routing.pools["gpu"])
    ask = Ask(prefix_blocks("x" * 600), 150, 600)
    assert [await ask_router(deps, view, ask) for _ in range(5)] == [None] * 5
    counters = deps.state.routing.counters
    assert (counters.router_fallbacks, counters.router_skips) == (3, 2) and view.router_breaker.state == "open"
    await background.settle()  # the give-up reports fail too, and are only logged
