"""The scheduler's pure parts, as tables: the cost, the load bound, the order, pools from config,
the load probe's parser and its verdict on nonsense."""

from __future__ import annotations

import json
import math

import pytest

from edgellm.config import Config
from edgellm.routing.config import PoolConfig
from edgellm.routing.fleet import PoolView, Reading, sane_reading
from edgellm.routing.probe import parse_metrics, reading_from
from edgellm.routing.scheduler import BLOCK_CHARS, Ask, ReplicaView, cost, over_bound, prefix_blocks, rendezvous, schedule


@pytest.mark.parametrize("new, queue, slowness, expected", [
    (0, 0, 1, 1),            # everything cached, idle: the floor
    (1000, 0, 1, 1001),      # a cold prompt on an idle replica
    (0, 4, 1, 5),            # cached but busy: the queue alone
    (1000, 1, 1, 2002),      # cold and busy multiply
    (100, 1, 3, 606),        # a slow replica costs its slowness
    (-5, -2, 0.5, 1),        # nonsense inputs are clamped, never negative
])
def test_cost(new: float, queue: float, slowness: float, expected: float) -> None:
    assert cost(new, queue, slowness) == expected


@pytest.mark.parametrize("queue, queues, bound, over", [
    (0, [0, 0, 0], 0.25, False),   # an idle pool never refuses
    (1, [1, 0, 0], 0.25, True),    # mean with this request 0.67: one above the rest spills
    (1, [1, 1, 0], 0.25, False),   # mean 1: at the mean is fine
    (2, [2, 1, 1], 0.25, False),   # mean 1.67, cap ceil(2.08) = 3
    (3, [3, 1, 1], 0.25, True),    # mean 2, cap 3: a fourth would be one too many
    (3, [3, 1, 1], 1.0, False),    # a looser bound lets it take one more
    (5, [5, 4, 4, 4], 0.25, False),  # mean 4.5, cap 6
    (6, [6, 4, 4, 4], 0.25, True),
    (3, [3], 0.25, False),         # a lone replica is never over its own mean
])
def test_load_bound(queue: float, queues: list[float], bound: float, over: bool) -> None:
    assert over_bound(queue, queues, bound) is over


def test_prefix_blocks_are_chained_and_only_whole_blocks() -> None:
    a = "x" * (BLOCK_CHARS * 3 + 10)
    b = "x" * (BLOCK_CHARS * 2) + "y" * BLOCK_CHARS
    assert len(prefix_blocks(a)) == 3 and len(prefix_blocks("x" * (BLOCK_CHARS - 1))) == 0
    assert prefix_blocks(a)[:2] == prefix_blocks(b)[:2] and prefix_blocks(a)[2] != prefix_blocks(b)[2]
    # chained: the same block after a different start hashes differently
    assert prefix_blocks("y" * BLOCK_CHARS + "x" * BLOCK_CHARS)[1] != prefix_blocks("x" * BLOCK_CHARS * 2)[1]


def ask(held_chars: int = 4000, tokens: float = 1000, session: str | None = None, pinned: str | None = None) -> Ask:
    return Ask(prefix_blocks("s" * held_chars), tokens, held_chars, session, pinned)


@pytest.mark.parametrize("replicas, first, reason", [
    # the one that holds the prompt, though busier
    ([ReplicaView("a", 1, held=15), ReplicaView("b", 0), ReplicaView("c", 1)], "a", "prefix"),
    # it holds it but is over the bound: spill to the cheapest other
    ([ReplicaView("a", 3, held=15), ReplicaView("b", 0), ReplicaView("c", 1)], "b", "load"),
    # nobody holds it: the least loaded
    ([ReplicaView("a", 2), ReplicaView("b", 1), ReplicaView("c", 2)], "b", "load"),
    # the holder is down: skipped
    ([ReplicaView("a", 0, held=15, down=True), ReplicaView("b", 1), ReplicaView("c", 1)], None, "load"),
    # the holder reports nonsense: unhealthy, last
    ([ReplicaView("a", 0, held=15, healthy=False), ReplicaView("b", 1), ReplicaView("c", 0)], "c", "load"),
    # a slowed holder with part of the prompt loses to a fast cold one
    ([ReplicaView("a", 0, held=2, slowness=16), ReplicaView("b", 0)], "b", "load"),
])
def test_schedule_orders_by_cost(replicas: list[ReplicaView], first: str | None, reason: str) -> None:
    picks = schedule(ask(), replicas, 0.25)
    assert {p.name for p in picks} == {r.name for r in replicas if not r.down}
    if first is not None:
        assert picks[0].name == first and picks[0].reason == reason
    assert all(r.healthy for r in replicas if r.name == picks[0].name)
    unhealthy = [r.name for r in replicas if not r.healthy and not r.down]
    assert [p.name for p in picks[len(picks) - len(unhealthy):]] == unhealthy


def test_a_session_sticks_unless_its_replica_is_over_the_bound_or_unhealthy() -> None:
    a = ask(session="s1", pinned="c")
    assert schedule(a, [ReplicaView("a", 0, held=15), ReplicaView("b", 0), ReplicaView("c", 1)], 0.25)[0].name == "a"  # c over the bound
    assert schedule(a, [ReplicaView("a", 1, held=15), ReplicaView("b", 1), ReplicaView("c", 1)], 0.25)[0] .reason == "session"
    assert schedule(a, [ReplicaView("a", 0), ReplicaView("b", 0), ReplicaView("c", 0, healthy=False)], 0.25)[0].name != "c"


def test_the_baselines() -> None:
    replicas = [ReplicaView("a", 2), ReplicaView("b", 0), ReplicaView("c", 1)]
    assert [schedule(ask(), replicas, 0.25, "round-robin", turn)[0].name for turn in range(4)] == ["a", "b", "c", "a"]
    assert [p.name for p in schedule(ask(), replicas, 0.25, "least-in-flight")] == ["b", "c", "a"]
    by_session = schedule(ask(session="u1"), replicas, 0.25, "session")
    assert by_session[0].name == max("abc", key=lambda n: rendezvous("u1", n)) and by_session[0].reason == "session"


def test_new_prefixes_go_where_rendezvous_says_in_every_isolate() -> None:
    idle = [ReplicaView(n, 0) for n in "abcdefgh"]
    for app in range(20):
        a = Ask(prefix_blocks(f"app {app} " * 200), 500, 1600)
        assert schedule(a, idle, 0.25)[0].name == max("abcdefgh", key=lambda n: rendezvous(a.blocks[0], n))


def test_a_view_remembers_prefixes_sessions_and_in_flight() -> None:
    view = PoolView(PoolConfig("gpu", ("a", "b", "c")))
    first = ask(session="u")
    pick = view.choose(first, 0.0)[0]
    view.dispatched(pick.name, first, pick.reason)
    again = view.choose(ask(), 0.0)
    assert again[0].name == pick.name and again[0].reason == "prefix"
    view.finished(pick.name, 1.0, ok=True, ttft_s=0.2, itl_s=0.05)
    assert view.replicas[pick.name].in_flight == 0 and view.sessions["u"] == pick.name
    assert view.choose(ask(held_chars=100, session="u"), 1.0)[0].reason == "session"


def test_a_replicas_breaker_takes_it_out_of_the_pool() -> None:
    view = PoolView(PoolConfig("gpu", ("a", "b")))
    for t in range(5):
        view.dispatched("a", ask(), "load")
        view.finished("a", float(t), ok=False)
    assert [p.name for p in view.choose(ask(), 5.0)] == ["b"]


@pytest.mark.parametrize("running, waiting, kv, ok", [
    (1, 2, 0.5, True), (0, 0, None, True),
    (-1, 0, None, False), (math.nan, 0, None, False), (0, math.inf, None, False), (1e12, 0, None, False),
    (1, 1, 3.0, False), ("1", 0, None, False), (True, 0, None, False),
])
def test_nonsense_load_is_unhealthy(running: object, waiting: object, kv: object, ok: bool) -> None:
    assert sane_reading(0.0, running, waiting, kv).ok is ok


def test_a_stale_load_is_ignored_and_a_lie_stands_until_a_sane_report() -> None:
    view = PoolView(PoolConfig("gpu", ("a", "b"), probe_age_ms=1000))
    view.replicas["a"].reading = Reading(0.0, False, why="lied")
    assert not view.views((), 0.5)[0].healthy and not view.views((), 60.0)[0].healthy
    view.replicas["a"].reading = Reading(60.0, True, running=1, waiting=0)
    assert view.views((), 60.5)[0].healthy
    view.replicas["b"].reading = Reading(0.0, True, running=9, waiting=3)
    assert view.views((), 0.5)[1].queue == 12 and view.views((), 2.0)[1].queue == 0


LLAMA = """# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 2
llamacpp:requests_deferred 1
llamacpp:kv_cache_usage_ratio 0.25
"""
VLLM = """vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="n",engine="0"} 1.0
vllm:num_requests_waiting{model_name="m",engine="0"} 2.0
vllm:kv_cache_usage_perc{model_name="m",engine="0"} 0.5
"""


@pytest.mark.parametrize("text, kind, expected", [
    (LLAMA, "llama.cpp", (True, 2, 1, 0.25)),
    (VLLM, "vllm", (True, 4, 2, 0.5)),
    ("edgellm_num_requests_running 1.0\nedgellm_num_requests_waiting 0.0\n", "edgellm", (True, 1, 0, None)),
    ("llamacpp:requests_processing -3\nllamacpp:requests_deferred 0\n", "llama.cpp", (False, 0, 0, None)),
    ("llamacpp:requests_processing NaN\nllamacpp:requests_deferred 0\n", "llama.cpp", (False, 0, 0, None)),
    ("llamacpp:requests_processing 1\nllamacpp:requests_deferred 1e30\n", "llama.cpp", (False, 0, 0, None)),
    ("llamacpp:requests_processing zero\nllamacpp:requests_deferred 0\n", "llama.cpp", (False, 0, 0, None)),
    ("<html>not metrics</html>", "llama.cpp", (False, 0, 0, None)),
])
def test_reading_metrics(text: str, kind: str, expected: tuple[bool, float, float, float | None]) -> None:
    reading = reading_from(text, kind, 0.0)
    assert (reading.ok, reading.running, reading.waiting, reading.kv_usage) == expected
    assert parse_metrics("# only comments\n", kind) == {}


def origins(*items: object) -> dict[str, str]:
    return {"ORIGINS": json.dumps(list(items))}


def test_pools_from_config() -> None:
    routing = Config.from_env(origins(
        {"pool": "gpu", "kind": "llama.cpp", "policy": "least-in-flight", "load_bound": 0.5, "primary": True,
         "models": {"@cf/a": "a"}, "replicas": ["http://10.0.0.1:8080", {"name": "gpu-b", "url": "http://10.0.0.2:8080", "region": "eu"}]},
        {"name": "solo", "url": "http://10.0.0.9"},
        {"name": "x1", "url": "http://10.0.1.1", "pool": "cpu"}, {"name": "x2", "url": "http://10.0.1.2", "pool": "cpu"},
    )).routing
    assert [o.name for o in routing.origins] == ["gpu-1", "gpu-b", "solo", "x1", "x2"]
    gpu1, gpub = routing.origins[:2]
    assert (gpu1.pool, gpu1.kind, gpu1.models, gpub.region) == ("gpu", "llama.cpp", {"@cf/a": "a"}, "EU")
    assert routing.pools["gpu"] == PoolConfig("gpu", ("gpu-1", "gpu-b"), "least-in-flight", 0.5, True)
    assert routing.pools["cpu"].replicas == ("x1", "x2") and routing.pools["cpu"].policy == "scheduler"
    assert routing.pool_of(routing.origins[2]) is None


@pytest.mark.parametrize("items, says", [
    ([{"pool": "gpu", "replicas": ["http://a:1", "http://a:1/v1"]}], "lists the replica http://a:1/v1 twice"),
    ([{"name": "a", "url": "http://a:1"}, {"name": "a", "url": "http://b:1"}], "lists 'a' twice"),
    ([{"pool": "gpu", "replicas": []}], "pool 'gpu' has no replica"),
    ([{"pool": "gpu", "models": {"m": "m"}, "replicas": ["http://a:1"]},
      {"pool": "cpu", "models": {"n": "n"}, "replicas": ["http://a:1"]}], "with different models"),
    ([{"pool": "gpu", "policy": "random", "replicas": ["http://a:1"]}], "policy must be one of"),
    ([{"pool": "gpu", "load_bound": "lots", "replicas": ["http://a:1"]}], "load_bound must be"),
    ([{"pool": "gpu", "kind": "tgi", "replicas": ["http://a:1"]}], "kind must be one of"),
])
def test_pool_mistakes_are_refused_at_start(items: list[object], says: str) -> None:
    with pytest.raises(ValueError, match="ORIGINS") as refused:
        Config.from_env(origins(*items))
    assert says in str(refused.value)


def test_deploy_check_names_a_pool_mistake() -> None:
    from edgellm_local.deploy_check import check_vars

    bad = check_vars({"vars": {"ORIGINS": json.dumps([{"pool": "gpu", "replicas": ["http://a:1", "http://a:1"]}])}})
    assert not bad[0].ok and "pool 'gpu' lists the replica http://a:1/v1 twice" in bad[0].detail
    good = check_vars({"vars": {"ORIGINS": json.dumps([{"pool": "gpu", "replicas": ["http://a:1", "http://b:1"]}])}})
    assert good[0].ok


async def test_an_answer_closed_before_its_first_step_still_comes_off_the_replica() -> None:
    """A client gone before the first event: the stream is closed unread, and the replica's
    in-flight count comes down anyway (no verdict for its breaker), as does the source's."""
    from edgellm.config import Config as _Config
    from edgellm.deps import Deps
    from edgellm.generation import Finish, Token, Usage
    from edgellm.routing.pools import Choice, followed

    closed = []

    async def answer():  # type: ignore[no-untyped-def]
        try:
            yield Token("a")
            yield Finish("stop", Usage(3, 1, cached_tokens=2))
        finally:
            closed.append(True)

    config = _Config.from_env(origins({"pool": "gpu", "replicas": ["http://a:1", "http://b:1"]}))
    deps = Deps(config=config, ai=None)  # type: ignore[arg-type]
    view = PoolView(config.routing.pools["gpu"])
    a = ask()
    for read in (False, True):
        view.dispatched("gpu-1", a, "load")
        stream = followed(deps, Choice(config.routing.origins[0], "load", view, a), answer(), 0.0)
        if read:
            assert [type(e).__name__ async for e in stream] == ["Token", "Finish"]
        await stream.aclose()
        assert view.replicas["gpu-1"].in_flight == 0
    assert view.replicas["gpu-1"].breaker.state == "closed" and view.replicas["gpu-1"].cached_tokens == 2
