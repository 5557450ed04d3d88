"""The scheduler's pure parts, as tables: the predicted TTFT and the rates it reads, the load
bound, the order, pools from config, the load probe's parser and its verdict on nonsense."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import replace

import pytest

from edgellm.config import Config
from edgellm.routing.config import PoolConfig
from edgellm.routing.fleet import PoolView, Reading, sane_reading
from edgellm.routing.probe import parse_metrics, reading_from
from edgellm.routing.scheduler import (BLOCK_CHARS, FORGET_S, PRIOR_ANSWER_TOKENS, PRIOR_PREFILL_S, Ask, Pick, Rates, ReplicaView, imposed, load_cap, median,
                                      over_bound, predicted_ttft, prefix_blocks, queued_ahead, queued_size, rates, rendezvous, schedule, slowdowns)


@pytest.mark.parametrize("new, queue, mean_new, slowdown, expected", [
    (0, 0, 500, 1, 0.001),       # everything cached, idle: the one token always recomputed
    (999, 0, 500, 1, 1.0),       # a cold prompt on an idle replica: its prefill
    (0, 2, 99, 1, 0.799),        # cached but busy: the prefill (0.1 s each) and answers (0.3 s each) queued ahead
    (999, 1, 0, 1, 1.3),         # cold and busy add up; what is queued was all cached
    (99, 1, 100, 3, 1.5),        # a slowed replica: everything at a third of the speed
    (-5, -2, -9, -1, 0.0),       # nonsense inputs are clamped, never negative
])
def test_predicted_ttft(new: float, queue: float, mean_new: float, slowdown: float, expected: float) -> None:
    assert predicted_ttft(new, queue, queue * mean_new, 0.001, 0.3, slowdown) == pytest.approx(expected)


@pytest.mark.parametrize("measured, expected", [
    ([None, None], [1.0, 1.0]),                   # nothing measured: no slowdown
    ([1.0, 1.4, 0.7], [1.0, 1.0, 1.0]),           # within 1.5x of the median: none
    ([1.0, None, 3.0], [0.75, 1.0, 1.0]),         # unmeasured: none; against the median of two (2), 3 is within, 1 beyond
    ([1.0, 1.0, 3.0], [1.0, 1.0, 2.0]),           # 3x the median counts as 2x: only the excess
    ([1.0, 1.0, 0.3], [1.0, 1.0, 0.45]),          # faster beyond the tolerance counts too
    ([1.0, 1.0, 1000.0], [1.0, 1.0, 16 / 1.5]),   # a wild figure is capped
    ([1.0, math.nan, -2.0, 0.0], [1.0, 1.0, 1.0, 1.0]),  # nonsense is unmeasured
])
def test_slowdowns_read_noise_as_none(measured: list[float | None], expected: list[float]) -> None:
    assert slowdowns(measured) == pytest.approx(expected)


def test_rates_fall_back_on_the_prior_and_on_each_other() -> None:
    blank = rates([ReplicaView("a"), ReplicaView("b")])
    assert (blank.prefill_s, blank.answer_s) == (PRIOR_PREFILL_S, PRIOR_PREFILL_S * PRIOR_ANSWER_TOKENS)
    assert blank.slowdown == {"a": 1.0, "b": 1.0}
    answered = rates([ReplicaView("a", answer_s=0.512), ReplicaView("b")])
    assert (answered.prefill_s, answered.answer_s) == (0.002, 0.512)  # the answer measured, the prefill from the prior's ratio
    both = rates([ReplicaView("a", prefill_s=0.004), ReplicaView("b", prefill_s=0.002, answer_s=0.3), ReplicaView("c", prefill_s=0.009)])
    assert (both.prefill_s, both.answer_s) == (0.004, 0.3)


def test_what_is_queued_on_an_unmeasured_replica_is_sized_as_this_request_there() -> None:
    assert queued_size(ReplicaView("a", mean_new=40), 1000) == 40
    assert queued_size(ReplicaView("a"), 60) == 60 and queued_size(ReplicaView("a", mean_new=math.nan), 60) == 60


HELD = 15  # of the 4,000-character prompt's 15 blocks: nearly all of its 1,000 tokens
MEASURED = {"prefill_s": 0.001, "answer_s": 0.3, "decode_s": 0.03}


def first(replicas: list[ReplicaView], a: Ask | None = None) -> str:
    return schedule(a or ask(), replicas, 1.0)[0].name


@pytest.mark.parametrize("holder, others, wins", [
    # equal speeds: the held prefix wins, idle or with answers of its prompt ahead (1 s of prefill saved)
    (dict(queue=0, mean_new=40), dict(queue=0, mean_new=1000), True),
    (dict(queue=1, mean_new=40), dict(queue=0, mean_new=1000), True),
    (dict(queue=2, mean_new=40), dict(queue=1, mean_new=1000), True),
    # noise: the holder measured 1.4x slower (or the others 1.4x faster) still wins
    (dict(queue=1, mean_new=40, decode_s=0.042), dict(queue=0, mean_new=1000), True),
    (dict(queue=1, mean_new=40), dict(queue=0, mean_new=1000, decode_s=0.022), True),
    # slowed 6x (counts 4x): two queued there cost more than prefilling the whole prompt elsewhere
    # behind one cold request (within the bound: the prediction moves it, not the bound)
    (dict(queue=2, mean_new=40, decode_s=0.18), dict(queue=1, mean_new=1000), False),
    # slowed 6x and idle: the prompt it holds is still the quicker first token (a prediction, not a penalty)
    (dict(queue=0, mean_new=40, decode_s=0.18), dict(queue=0, mean_new=1000), True),
    # what is queued there was cold: a full prefill ahead, prefilling elsewhere is quicker
    (dict(queue=1, mean_new=1000), dict(queue=0, mean_new=1000), False),
])
def test_a_held_prefix_against_queue_and_speed(holder: dict[str, float], others: dict[str, float], wins: bool) -> None:
    replicas = [ReplicaView("a", held=HELD, **{**MEASURED, **holder})] + [ReplicaView(n, **{**MEASURED, **others}) for n in "bc"]
    assert (first(replicas) == "a") is wins


def test_noisy_rates_never_flip_a_decision() -> None:
    """Speeds and sizes wandering within the tolerance (as on a shared machine) give the same order."""
    rng = __import__("random").Random(3)
    for trial in range(300):
        queues = [rng.randrange(3) for _ in range(3)]
        held = [rng.choice((0, 2, HELD)) for _ in range(3)]
        calm = [ReplicaView(n, q, h, 0.001, 0.3, 0.03, 300) for n, q, h in zip("abc", queues, held)]
        noisy = [ReplicaView(n, q, h, 0.001 * rng.uniform(0.8, 1.2), 0.3 * rng.uniform(0.8, 1.2), 0.03 * rng.uniform(0.8, 1.2), 300)
                 for n, q, h in zip("abc", queues, held)]
        assert [p.name for p in schedule(ask(), calm, 1.0)] == [p.name for p in schedule(ask(), noisy, 1.0)], trial


def _serve(view: PoolView, name: str, a: Ask, now: float, ttft: float, total: float, cached: int) -> None:
    view.finished(name, now, True, ttft, total / 16, cached, int(a.prompt_tokens), total, expected=view.dispatched(name, a, "load", 0.0))


def test_a_slowed_replica_loses_its_share_of_held_prompts() -> None:
    """Eight applications' prompts spread over three replicas, requests arriving about as fast as
    one replica serves them; then one replica runs 6x slower: its share of new requests falls,
    though it holds the prompts they carry (under a loose load bound, which alone would let it
    keep them: the prediction, not the bound, moves them)."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c"), load_bound=3.0))
    apps = [Ask(prefix_blocks((f"application {app} " * 300)[:4000]), 1000, 4000) for app in range(8)]
    speed = {"a": 1.0, "b": 1.0, "c": 1.0}
    running: list[tuple[float, str]] = []  # (end, replica): what is in flight, as the view counts it
    share = {"before": [], "after": []}
    now = 0.0
    for i in range(400):
        if i == 200:
            speed["c"] = 6.0
        now += 0.12
        for end, name in sorted(running):
            if end <= now:
                running.remove((end, name))
                view.replicas[name].in_flight -= 1
        a = apps[(i * 5) % 8]
        pick = view.choose(a, now)[0]
        held = view.replicas[pick.name].holds(a.blocks, now)
        cached = min(1000, held * BLOCK_CHARS // 4)
        ttft = ((1000 - cached) * 0.001 + 0.01) * speed[pick.name] * (1 + view.replicas[pick.name].in_flight)
        total = ttft + 0.2 * speed[pick.name]
        _serve(view, pick.name, a, now, ttft, total, cached)
        view.replicas[pick.name].in_flight += 1  # still running until `now + total`
        running.append((now + total, pick.name))
        share["before" if i < 200 else "after"].append(pick.name)
    late = share["after"][50:]  # once the slowdown was measured
    assert share["before"].count("c") >= len(share["before"]) // 5
    assert late.count("c") <= len(late) // 6


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


def ask(held_chars: int = 4000, tokens: float = 1000, session: str | None = None, pinned: str | None = None, continues: bool = False) -> Ask:
    return Ask(prefix_blocks("s" * held_chars), tokens, held_chars, session, pinned, continues)


def app_ask(app: int, session: str | None = None, continues: bool = False) -> Ask:
    """A 1,000-token prompt of application `app`: its own system prompt, so its own first block."""
    text = (f"application {app}: " * 300)[:4000]
    return Ask(prefix_blocks(text), 1000, len(text), session, None, continues)


def first_of(a: Ask, names: str = "abc") -> str:
    """The replica the prompt's first block ranks first."""
    return max(names, key=lambda n: rendezvous(a.blocks[0], n))


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
    ([ReplicaView("a", 0, held=2, decode_s=0.48), ReplicaView("b", 0, decode_s=0.03), ReplicaView("c", 0, decode_s=0.03)], "b", "load"),
])
def test_schedule_orders_by_cost(replicas: list[ReplicaView], first: str | None, reason: str) -> None:
    picks = schedule(ask(), replicas, 0.25)
    assert {p.name for p in picks} == {r.name for r in replicas if not r.down}
    if first is not None:
        assert picks[0].name == first and picks[0].reason == reason
    assert all(r.healthy for r in replicas if r.name == picks[0].name)
    unhealthy = [r.name for r in replicas if not r.healthy and not r.down]
    assert [p.name for p in picks[len(picks) - len(unhealthy):]] == unhealthy


def test_a_session_sticks_unless_its_replica_is_over_the_bound_or_unhealthy_or_let_it_go() -> None:
    a = ask(session="s1", pinned="c")
    assert schedule(a, [ReplicaView("a", 0, held=15), ReplicaView("b", 0), ReplicaView("c", 1, held=15)], 0.25)[0].name == "a"  # c over the bound
    assert schedule(a, [ReplicaView("a", 1, held=15), ReplicaView("b", 1), ReplicaView("c", 1, held=15)], 0.25)[0].reason == "session"
    assert schedule(a, [ReplicaView("a", 0), ReplicaView("b", 0), ReplicaView("c", 0, held=15, healthy=False)], 0.25)[0].name != "c"
    # c is taken to have let the conversation go: it holds less of the prompt than a, or none of it
    assert schedule(a, [ReplicaView("a", 1, held=15), ReplicaView("b", 1), ReplicaView("c", 0, held=8)], 1.0)[0].name == "a"
    assert schedule(a, [ReplicaView("a", 0), ReplicaView("b", 0), ReplicaView("c", 1)], 1.0)[0].name != "c"
    assert schedule(a, [ReplicaView("a", 0), ReplicaView("b", 0), ReplicaView("c", 1, held=1)], 1.0)[0].name == "c"  # some of it, the most
    short = ask(held_chars=100, session="s1", pinned="c")  # shorter than a block: nothing says it was let go
    assert schedule(short, [ReplicaView("a", 0), ReplicaView("b", 0), ReplicaView("c", 1)], 1.0)[0].name == "c"


def test_a_conversations_first_turn_is_not_drawn_to_the_system_prompts_holder() -> None:
    """Whichever replica holds the system prompt, an idle pool's first turns go where the
    application's ranking puts them (the holder wins no more than its rank would)."""
    first_of_app = max("abc", key=lambda n: rendezvous(ask().blocks[0], n))
    for holder in "abc":
        replicas = [ReplicaView(n, 0, held=HELD if n == holder else 0) for n in "abc"]
        homes = [schedule(ask(session=f"conv-{i}"), replicas, 1.0)[0] for i in range(30)]
        assert {(h.name, h.reason) for h in homes} == {(first_of_app, "session")}
    # ... among the replicas within the bound and not markedly slow
    busy = [ReplicaView("a", 2, held=HELD), ReplicaView("b", 0), ReplicaView("c", 0)]
    slow = [ReplicaView("a", 0, decode_s=0.03), ReplicaView("b", 0, decode_s=0.03), ReplicaView("c", 0, decode_s=0.12)]
    for i in range(30):
        assert schedule(ask(session=f"conv-{i}"), busy, 0.25)[0].name != "a"
        assert schedule(ask(session=f"conv-{i}"), slow, 1.0)[0].name != "c"


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
    sent = view.dispatched(pick.name, first, pick.reason, 0.0)
    assert view.choose(ask(), 0.0)[0].reason != "prefix"  # not prefilled there yet: nothing to reuse
    view.prefilled(pick.name, sent, 0.2)
    again = view.choose(ask(), 0.2)
    assert again[0].name == pick.name and again[0].reason == "prefix"
    view.finished(pick.name, 1.0, ok=True, ttft_s=0.2, itl_s=0.05, expected=sent, prefilled=True)
    assert view.replicas[pick.name].in_flight == 0 and view.sessions["u"] == pick.name
    assert view.choose(ask(session="u"), 1.0)[0].reason == "session"


def test_a_replicas_breaker_takes_it_out_of_the_pool() -> None:
    view = PoolView(PoolConfig("gpu", ("a", "b")))
    for t in range(5):
        view.dispatched("a", ask(), "load", 0.0)
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
        view.dispatched("gpu-1", a, "load", 0.0)
        stream = followed(deps, Choice(config.routing.origins[0], "load", view, a), answer(), 0.0)
        if read:
            assert [type(e).__name__ async for e in stream] == ["Token", "Finish"]
        await stream.aclose()
        assert view.replicas["gpu-1"].in_flight == 0
    assert view.replicas["gpu-1"].breaker.state == "closed" and view.replicas["gpu-1"].cached_tokens == 2


def names(picks: list) -> list[str]:  # type: ignore[type-arg]
    return [p.name for p in picks]


def test_the_baselines_whole_failover_orders() -> None:
    """Round-robin (and session affinity for a request without a session) rotates the whole
    order one replica a turn; least in flight breaks a tie in the queue by rendezvous on the
    prompt, highest first, so isolates agree. A policy name read from config is compared by value."""
    replicas = [ReplicaView("a", 2), ReplicaView("b", 0), ReplicaView("c", 1)]
    rotations = [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"]]
    for turn in range(7):
        assert names(schedule(ask(), replicas, 0.25, "round-robin", turn)) == rotations[turn % 3]
        assert names(schedule(ask(), replicas, 0.25, "session", turn)) == rotations[turn % 3]  # no session: round-robin
    a = ask()
    by_rendezvous = sorted("abcdef", key=lambda n: rendezvous(a.key, n), reverse=True)
    idle = [ReplicaView(n, 0, held=HELD if n == by_rendezvous[-1] else 0) for n in "abcdef"]  # the prefix is no matter to it
    least = "".join(["least-", "in-flight"])  # not the literal's object: as a parsed [vars] value is
    assert names(schedule(a, idle, 0.25, least)) == by_rendezvous
    session = "".join(["sess", "ion"])
    assert [names(schedule(ask(), replicas, 0.25, session, turn)) for turn in range(3)] == rotations
    by_session = schedule(ask(session="u1"), replicas, 0.25, "".join(["sess", "ion"]))
    assert names(by_session) == sorted("abc", key=lambda n: rendezvous("u1", n), reverse=True)


def test_a_pinned_session_fails_over_in_the_cost_order_of_the_rest() -> None:
    replicas = [ReplicaView("a", 0, held=HELD), ReplicaView("b", 2, held=HELD), ReplicaView("c", 1, held=HELD), ReplicaView("d", 3, held=HELD)]
    unpinned = names(schedule(ask(), replicas, 1.0))
    for pinned in "abcd":
        picks = schedule(ask(session="s1", pinned=pinned), replicas, 1.0)
        assert picks[0].name == pinned and picks[0].reason == "session"
        assert names(picks[1:]) == [n for n in unpinned if n != pinned]


def test_only_the_replica_holding_most_of_the_prompt_is_a_prefix_pick() -> None:
    picks = schedule(ask(), [ReplicaView("a", 0, held=HELD), ReplicaView("b", 0, held=5), ReplicaView("c", 0)], 1.0)
    assert {p.name: p.reason for p in picks} == {"a": "prefix", "b": "load", "c": "load"}


@pytest.mark.parametrize("chars, held, expected", [
    (0, 3, 1000.0),     # a prompt of no known characters: every token is new
    (-5, 3, 1000.0),    # nonsense characters: the same
    (1, 1, 0.0),        # one character, held
    (4000, 0, 1000.0),  # nothing held
])
def test_new_prefill(chars: int, held: int, expected: float) -> None:
    assert Ask((), 1000, chars).new_prefill(held) == pytest.approx(expected)


def test_a_conversations_first_turn_starts_where_it_starts_soonest_its_application_breaking_ties() -> None:
    """A first turn is costed as cold everywhere, so the queues and the replicas' speeds decide
    it, whoever holds the system prompt: a measurably faster replica takes it while idle, and a
    replica with requests queued does not while one within the bound has fewer. Ties go by the
    prompt's first block (its application), not the session: an application's conversations
    opened on an idle pool all start on the first replica of its ranking."""
    fast = [ReplicaView("a", 0, decode_s=0.03), ReplicaView("b", 0, decode_s=0.03), ReplicaView("c", 0, decode_s=0.005)]
    queued = [ReplicaView("a", 2, held=HELD), ReplicaView("b", 0), ReplicaView("c", 1)]  # a within the bound at e = 1
    idle = [ReplicaView(n, 0) for n in "abc"]
    assert sum(max("abc", key=lambda n: rendezvous(f"conv-{i}", n)) == "a" for i in range(30)) >= 5
    first_of_app = max("abc", key=lambda n: rendezvous(ask().blocks[0], n))
    for i in range(30):
        assert schedule(ask(session=f"conv-{i}"), fast, 1.0)[0].name == "c"
        assert [p.name for p in schedule(ask(session=f"conv-{i}"), queued, 1.0)] == ["b", "c", "a"]
        assert schedule(ask(session=f"conv-{i}"), idle, 1.0)[0].name == first_of_app
    apps = [app_ask(i, session=f"conv-{i}") for i in range(30)]
    assert all(schedule(a, idle, 1.0)[0].name == first_of(a) for a in apps)
    assert {first_of(a) for a in apps} == {"a", "b", "c"}


def test_a_later_turn_this_view_has_not_seen_goes_where_every_view_sends_it() -> None:
    """Isolates share nothing, so a conversation's later turn often reaches a view that never saw
    it: it goes to the fewest queued as the replicas report it (within the bound, not measurably
    slow), ties by its application's rendezvous, which every view computes alike, and not by
    this view's costs (its record of what each replica holds is its own). A measurably faster
    replica is no reason here: views measure speeds apart."""
    queued = [ReplicaView("a", 2, held=HELD), ReplicaView("b", 0), ReplicaView("c", 1)]
    slow = [ReplicaView("a", 0, decode_s=0.03), ReplicaView("b", 0, decode_s=0.03), ReplicaView("c", 0, decode_s=0.12)]
    tied = [ReplicaView("a", 1), ReplicaView("b", 1, held=HELD), ReplicaView("c", 1)]
    sessions = [f"conv-{i}" for i in range(30)]
    first_of_app = max("abc", key=lambda n: rendezvous(ask().blocks[0], n))
    for session in sessions:
        assert schedule(ask(session=session, continues=True), queued, 1.0)[0].name == "b"
        assert schedule(ask(session=session, continues=True), tied, 1.0)[0].name == first_of_app
    apps = [app_ask(i, session=f"conv-{i}", continues=True) for i in range(30)]
    assert all(schedule(a, tied, 1.0)[0].name == first_of(a) for a in apps)  # b's held prefix, which only this view knows of, is no reason
    assert {first_of(a) for a in apps} == {"a", "b", "c"}
    over = [ReplicaView("a", 0), ReplicaView("b", 3), ReplicaView("c", 3)]
    assert schedule(ask(session="s", continues=True), over, 1.0)[0].name == "a"
    assert {schedule(app_ask(i, session="s", continues=True), slow, 1.0)[0].name for i in range(30)} == {"a", "b"}
    slow_and_idle = [ReplicaView("a", 1, decode_s=0.03), ReplicaView("b", 1, decode_s=0.03), ReplicaView("c", 0, decode_s=0.12)]
    assert schedule(ask(session="s", continues=True), slow_and_idle, 1.0)[0].name != "c"  # slow first, then the queue
    crowded = [ReplicaView("a", 0, decode_s=0.12), ReplicaView("b", 5, decode_s=0.03), ReplicaView("c", 5, decode_s=0.03)]
    assert schedule(ask(session="s", continues=True), crowded, 0.25)[0].name == "a"  # the bound before speed
    faster = next(n for n in "abc" if n != first_of_app)
    fast = [ReplicaView(n, 0, decode_s=0.005 if n == faster else 0.03) for n in "abc"]
    assert schedule(ask(session="s", continues=True), fast, 1.0)[0].name == first_of_app
    assert schedule(ask(session="s"), fast, 1.0)[0].name == faster  # a first turn takes the faster
    holding = [ReplicaView("a", 2), ReplicaView("b", 0), ReplicaView("c", 1, held=HELD)]
    assert schedule(ask(session="u", pinned="c", continues=True), holding, 1.0)[0].name == "c"  # one it has seen keeps to its replica


@pytest.mark.parametrize("queued, slowed, to_the_slowed", [
    (2, 0.09, False),  # two cold prompts and answers ahead on b and c: still sooner than alone on a replica twice as slow
    (3, 0.09, True),   # three: the idle slow replica starts it sooner
    (3, 0.12, False),  # unless it is slower still
])
def test_a_first_turn_counts_what_is_queued_ahead_of_it_as_cold_prompts(queued: int, slowed: float, to_the_slowed: bool) -> None:
    replicas = [ReplicaView("a", 0, **{**MEASURED, "decode_s": slowed}), ReplicaView("b", queued, held=HELD, **MEASURED), ReplicaView("c", queued, **MEASURED)]
    assert (schedule(ask(session="conv"), replicas, 2.0)[0].name == "a") is to_the_slowed


def test_a_first_turn_keeps_to_the_load_bound_over_a_faster_replica() -> None:
    """a is measurably faster and so cheapest for a cold prompt, but at the bound it takes none."""
    replicas = [ReplicaView("a", 3, **{**MEASURED, "decode_s": 0.01}), ReplicaView("b", 1, **MEASURED), ReplicaView("c", 1, **MEASURED)]
    assert schedule(ask(session="conv"), replicas, 1.0)[0].name == "a"
    assert schedule(ask(session="conv"), replicas, 0.25)[0].name != "a"


def test_a_continuing_prompt_without_a_session_goes_by_its_prefix() -> None:
    """Only a session has a rendezvous to keep: a raw prompt (taken as continuing) with none is
    placed like any request, where its prefix is held."""
    replicas = [ReplicaView("a", 0), ReplicaView("b", 0, held=HELD), ReplicaView("c", 0)]
    assert schedule(ask(continues=True), replicas, 1.0)[0] == schedule(ask(), replicas, 1.0)[0]
    assert schedule(ask(continues=True), replicas, 1.0)[0].name == "b"


def test_a_burst_of_conversations_spreads_over_the_pool_as_it_queues() -> None:
    """Twelve conversations opening at once, their system prompt held by one replica: each first
    turn goes where the fewest are queued, so the burst lands four, four and four, not wherever
    the sessions' rendezvous (within a bound of twice the mean) would stack them."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c"), load_bound=1.0))
    view.replicas["a"].remember(ask().blocks)
    for i in range(12):
        view.dispatched(view.choose(ask(session=f"conv-{i}"), 0.0)[0].name, ask(session=f"conv-{i}"), "session", 0.0)
    assert sorted(r.in_flight for r in view.replicas.values()) == [4, 4, 4]


# The cost functions one input at a time, each figure worked by hand: every clamp, band edge,
# prior and constant on its own (the rows above mostly move several at once).


@pytest.mark.parametrize("values, expected", [
    ([], None),
    ([None, 0.0, -1.0, math.nan, math.inf], None),  # nothing sane measured: no median
    ([5.0], 5.0),
    ([4.0, 2.0], 3.0),                               # an even count: the mean of the middle two
    ([8.0, 1.0, 2.0], 2.0),
    ([8.0, 1.0, 4.0, 2.0], 3.0),
    ([16.0, 1.0, 4.0, 2.0, 8.0], 4.0),
    ([32.0, 1.0, 16.0, 2.0, 8.0, 4.0], 6.0),
    ([0.0, 2.0, 4.0], 3.0),                          # zero is no measurement
    ([-0.5, 2.0, 4.0], 3.0),                         # nor is a negative one
    ([0.5, 2.0], 1.25),                              # a figure below 1 is one
    ([math.inf, 1.0, 3.0], 2.0),                     # an infinite one is not
    ([math.nan, 1.0, 3.0], 2.0),
    ([None, 1.0, 3.0], 2.0),
])
def test_the_median_of_what_was_measured(values: list[float | None], expected: float | None) -> None:
    assert median(values) == expected


@pytest.mark.parametrize("measured, prefill_s, answer_s", [
    ([{}, {}], 0.001, 0.256),                          # nothing measured: 1 ms a prompt token, an answer 256 of them
    ([dict(prefill_s=0.0, answer_s=math.nan), dict(prefill_s=-1.0, answer_s=math.inf)], 0.001, 0.256),  # nonsense is no measurement
    ([dict(answer_s=0.512), {}], 0.002, 0.512),        # only answers measured: a prompt token is 1/256 of one
    ([dict(answer_s=0.2), dict(answer_s=0.6)], 0.0015625, 0.4),  # ... of their median
    ([dict(prefill_s=0.002), {}], 0.002, 0.512),       # only prompts measured: an answer is 256 tokens' time
    ([dict(prefill_s=0.003), dict(prefill_s=0.001, answer_s=0.9), dict(prefill_s=0.002, answer_s=0.1)], 0.002, 0.5),  # both: medians
])
def test_the_pools_rates_from_medians_and_the_prior(measured: list[dict[str, float]], prefill_s: float, answer_s: float) -> None:
    pool = rates([ReplicaView(f"r{i}", **m) for i, m in enumerate(measured)])
    assert (pool.prefill_s, pool.answer_s) == pytest.approx((prefill_s, answer_s))


def test_the_pools_rates_carry_each_replicas_slowdown_by_name() -> None:
    pool = rates([ReplicaView("a", decode_s=0.03), ReplicaView("b", decode_s=0.03), ReplicaView("c", decode_s=0.09), ReplicaView("d")])
    assert pool.slowdown == pytest.approx({"a": 1.0, "b": 1.0, "c": 2.0, "d": 1.0})  # c 3x the median counts 2x; d unmeasured


@pytest.mark.parametrize("new, queue, mean_new, prefill_s, answer_s, slowdown, expected", [
    (99, 1, 100, 0.001, 0.3, 1, 0.5),        # (99 + 1 + 1 x 100) x 0.001 + 1 x 0.3
    (99, -2, 100, 0.001, 0.3, 1, 0.1),       # a negative queue: nothing ahead, only this prompt's 100 tokens
    (99, 2, -50, 0.001, 0.3, 1, 0.7),        # a negative size queued: what is queued costs its answers only
    (-50, 0, 100, 0.001, 0.3, 1, 0.001),     # negative new tokens: the one always recomputed
    (99, 1, 100, -0.001, 0.3, 1, 0.3),       # a negative prefill rate: the answer ahead only
    (99, 1, 100, 0.001, -0.3, 1, 0.2),       # a negative answer rate: the prefill only
    (99, 1, 100, 0.001, 0.3, -2, 0.0),       # a negative slowdown: nothing
    (99, 1, 100, 0.001, 0.3, 0.5, 0.25),     # a replica counted twice as fast: half
    (0.5, 0.5, 10, 0.001, 0.3, 1, 0.1565),   # fractions count as they are: (0.5 + 1 + 0.5 x 10) x 0.001 + 0.5 x 0.3
    (0, 0, 0, 0.002, 5, 1, 0.002),           # idle, all cached: the one token at the pool's prefill rate
])
def test_predicted_ttft_clamps_each_nonsense_input_alone(new: float, queue: float, mean_new: float, prefill_s: float,
                                                         answer_s: float, slowdown: float, expected: float) -> None:
    assert predicted_ttft(new, queue, queue * mean_new, prefill_s, answer_s, slowdown) == pytest.approx(expected)


def test_predicted_ttft_without_a_slowdown_is_at_the_pools_speed() -> None:
    assert predicted_ttft(99, 1, 100, 0.001, 0.3) == pytest.approx(0.5)


@pytest.mark.parametrize("measured, expected", [
    ([1.0, 1.0, 1.5], [1.0, 1.0, 1.0]),             # exactly 1.5x the median: still none
    ([1.0, 1.0, 1.8], [1.0, 1.0, 1.2]),             # just over: only the excess, 1.8 / 1.5
    ([3.0, 3.0, 2.0], [1.0, 1.0, 1.0]),             # exactly the median / 1.5: none
    ([3.0, 3.0, 1.9], [1.0, 1.0, 0.95]),            # just under: 1.9 / 3 x 1.5
    ([1.0, 1.0, 16.0], [1.0, 1.0, 16 / 1.5]),       # at the cap
    ([1.0, 1.0, 0.01], [1.0, 1.0, 1.5 / 16]),       # a wild fast figure is capped too: 1/16 of the median, x 1.5
    ([1.0, 1.0, 1 / 16], [1.0, 1.0, 1.5 / 16]),     # ... as one at that cap
    ([1.0, 1.0, math.inf], [1.0, 1.0, 1.0]),        # an infinite figure is nonsense, not a slow replica
    ([math.nan, 0.0, -1.0, None], [1.0, 1.0, 1.0, 1.0]),  # nothing sane measured
    ([None, 2.0], [1.0, 1.0]),                      # one measured: it is the median
    ([1.0, 2.0, 4.0, 8.0], [0.5, 1.0, 1.0, 8 / 3 / 1.5]),  # an even count: against the mean of the middle two, 3
])
def test_slowdowns_at_the_band_edges_and_the_caps(measured: list[float | None], expected: list[float]) -> None:
    assert slowdowns(measured) == pytest.approx(expected)


@pytest.mark.parametrize("ages, expected", [
    ([0.0, 0.0, 0.0], [1.0, 1.0, 8 / 1.5]),                                   # fresh: the whole factor
    ([0.0, 0.0, FORGET_S / 20], [1.0, 1.0, 8 ** math.exp(-1 / 20) / 1.5]),    # half a second: a little
    ([0.0, 0.0, FORGET_S], [1.0, 1.0, 8 ** math.exp(-1) / 1.5]),              # one decay time: e^-1 of it (in log)
    ([0.0, 0.0, 2 * FORGET_S], [1.0, 1.0, 1.0]),                              # 8^e^-2 = 1.32x: within the tolerance
    ([0.0, 0.0, math.inf], [1.0, 1.0, 1.0]),                                  # forgotten
    ([0.0, 0.0, -5.0], [1.0, 1.0, 8 / 1.5]),                                  # a clock gone back: taken as fresh
    ([0.0, 0.0, math.nan], [1.0, 1.0, 8 / 1.5]),
    ([0.0, 0.0], [1.0, 1.0, 8 / 1.5]),                                        # an age missing: fresh
    ([3 * FORGET_S, 0.0, 0.0], [1.0, 1.0, 8 / 1.5]),                          # only a replica's own age fades it
])
def test_a_measured_slowdown_fades_with_its_age(ages: list[float], expected: list[float]) -> None:
    """A replica measured slow gets no requests, so nothing measures it again: the measurement
    fades, and within a few decay times it is offered requests again."""
    assert slowdowns([0.03, 0.03, 0.24], ages) == pytest.approx(expected)
    fast = slowdowns([0.03, 0.03, 0.003], [0.0, 0.0, FORGET_S])[2]  # a fast reading fades toward the median alike
    assert fast == pytest.approx(0.1 ** math.exp(-1) * 1.5)


@pytest.mark.parametrize("mean_new, expected", [
    (40.0, 40.0), (0.5, 0.5),
    (0.0, 0.0),                  # measured as nothing new: what it queues was all cached
    (None, 60.0),                # unmeasured: as this request would be there
    (math.nan, 60.0), (math.inf, 60.0), (-0.5, 60.0), (-5.0, 60.0),  # nonsense: the same
])
def test_what_is_queued_is_sized_by_the_replicas_measured_mean(mean_new: float | None, expected: float) -> None:
    assert queued_size(ReplicaView("a", mean_new=mean_new), 60.0) == expected


@pytest.mark.parametrize("queues, bound, cap", [
    ([0, 0, 0], 0.25, 1),       # mean with this request 1/3: ceil(0.42)
    ([2], 0.0, 3),              # a lone replica: its queue and this request
    ([1, 0], 0.0, 1),           # strict balance, the mean exactly 1: 1, not 2
    ([3, 1, 1], 1.0, 4),        # mean 2, x 2: exactly 4
    ([5, 4, 4, 4], 0.25, 6),    # mean 4.5 x 1.25 = 5.625
    ([9, 5, 5], 0.35, 9),       # 1.35 x 20/3 is 9, computed as 9.000000000000002: not rounded up to 10
    ([1, -3, 0], 1.0, 2),       # a negative queue counts as none: mean 2/3, x 2, ceil(1.33)
    ([-3], 0.25, 2),            # ... alone too: mean 1, ceil(1.25)
])
def test_load_cap(queues: list[float], bound: float, cap: int) -> None:
    assert load_cap(queues, bound) == cap


@pytest.mark.parametrize("queue, queues, bound, over", [
    (0, [], 0.25, False),          # no pool to compare with: nothing is over
    (1, [1, 0], 0.0, True),        # strict balance: one ahead of an idle replica takes no more (cap 1)
    (0, [0, 1], 0.0, False),       # ... and the idle one takes it
    (9, [9, 5, 5], 0.35, True),    # cap 9: a tenth is one too many
    (8, [8, 6, 5], 0.35, False),   # cap 9: a ninth fits
    (1, [1, -3, 0], 1.0, False),   # cap 2, the negative queue as none: a second fits
    (-2, [-2, 0], 0.0, False),     # a negative queue is an idle replica
])
def test_load_bound_edges(queue: float, queues: list[float], bound: float, over: bool) -> None:
    assert over_bound(queue, queues, bound) is over


@pytest.mark.parametrize("chars, block_chars, blocks", [
    (255, None, 0),            # less than a block (256 characters): nothing to match
    (256, None, 1),            # exactly one block
    (511, None, 1),
    (512, None, 2),
    (256 * 256, None, 256),    # the first 256 blocks (64 Ki characters) ...
    (256 * 300 + 7, None, 256),  # ... and no more
    (10, 5, 2), (9, 5, 1),     # another block size
    (5000, 4, 256),            # the cap counts blocks, whatever their size
])
def test_prefix_blocks_are_whole_blocks_up_to_the_cap(chars: int, block_chars: int | None, blocks: int) -> None:
    text = "x" * chars
    assert len(prefix_blocks(text) if block_chars is None else prefix_blocks(text, block_chars)) == blocks


def test_prefix_hashes_are_equal_exactly_as_far_as_the_text_is() -> None:
    base = "".join(chr(ord("a") + i) * 256 for i in range(6))  # six different blocks
    for differs_at in range(6):  # one character changed inside block `differs_at`
        at = differs_at * 256 + 100
        mine, other = prefix_blocks(base), prefix_blocks(base[:at] + "!" + base[at + 1:])
        assert len(mine) == len(other) == 6
        assert [m == o for m, o in zip(mine, other)] == [i < differs_at for i in range(6)], differs_at
    assert len(set(prefix_blocks("x" * 256 * 4))) == 4  # the same block again hashes anew: it covers the blocks before it
    # a partial last block, and anything past the cap, is not hashed
    assert prefix_blocks(base + "tail") == prefix_blocks(base + "other tail")
    assert prefix_blocks("z" * 256 * 256 + "a" * 256) == prefix_blocks("z" * 256 * 256 + "b" * 256)
    assert len(prefix_blocks("\ud800" * 256)) == 1  # a lone surrogate (JSON can carry one) hashes rather than raising


@pytest.mark.parametrize("blocks, session, key", [
    ((7, 8), "s1", 7),      # the prompt's first block
    ((), "s1", "s1"),       # no whole block: the session, so its requests still go alike
    ((), None, ""),         # neither: nothing shared
])
def test_what_rendezvous_ranks_on(blocks: tuple[int, ...], session: str | None, key: str | int) -> None:
    assert Ask(blocks, 10, 40, session).key == key


@pytest.mark.parametrize("value, field", [
    (ReplicaView("a"), "queue"), (Ask((), 1, 4), "prompt_tokens"),
    (Pick("a", "load", 0.0), "cost"), (Rates(0.001, 0.256, {}), "prefill_s"),
])
def test_a_decisions_values_cannot_change_under_it(value: object, field: str) -> None:
    """The pool's view keeps an Ask and hands out Picks and views: one changed later would change
    a decision already made, or the view's record of it."""
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, field, 1)


def test_a_replica_known_only_by_name_is_idle_unmeasured_and_healthy() -> None:
    r = ReplicaView("a")
    assert (r.queue, r.held, r.healthy, r.down) == (0.0, 0, True, False)
    assert (r.prefill_s, r.answer_s, r.decode_s, r.mean_new) == (None, None, None, None)


def test_round_robin_without_a_turn_starts_at_the_first_replica() -> None:
    assert names(schedule(ask(), [ReplicaView("a", 2), ReplicaView("b", 0), ReplicaView("c", 1)], 0.25, "round-robin")) == ["a", "b", "c"]


def test_a_conversations_first_turn_avoids_a_replica_slowed_only_a_little_past_the_tolerance() -> None:
    """c measured 2.4x the median counts 1.6x: measurably slow, so no first turn starts there,
    though its application's rendezvous would put about a third of them on it."""
    replicas = [ReplicaView("a", 0, decode_s=0.03), ReplicaView("b", 0, decode_s=0.03), ReplicaView("c", 0, decode_s=0.072)]
    apps = [app_ask(i, session=f"conv-{i}") for i in range(30)]
    assert sum(first_of(a) == "c" for a in apps) >= 5
    assert {schedule(a, replicas, 1.0)[0].name for a in apps} == {"a", "b"}


def test_an_uncounted_prompt_is_taken_as_four_characters_a_token() -> None:
    from edgellm.generation import GenerationRequest
    from edgellm.routing.pools import ask_for

    raw = GenerationRequest("@cf/a", {"prompt": "x" * 600, "raw": True})
    estimated = ask_for(raw, None)
    assert (estimated.prompt_tokens, estimated.prompt_chars, len(estimated.blocks)) == (150.0, 600, 2)
    assert ask_for(raw, 7).prompt_tokens == 7.0  # counted: the count


@pytest.mark.parametrize("inputs, continues", [
    ({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]}, False),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}]}, True),
    ({"messages": [{"role": "user", "content": "q"}, "not a message", {"role": "assistant"}]}, True),
    ({"prompt": "q"}, False),               # one question: a first turn
    ({"prompt": "q", "raw": True}, True),   # raw text may hold earlier turns: taken as continuing
])
def test_a_request_continues_a_conversation_when_its_prompt_carries_an_answer(inputs: dict, continues: bool) -> None:  # type: ignore[type-arg]
    from edgellm.generation import GenerationRequest
    from edgellm.routing.pools import ask_for

    assert ask_for(GenerationRequest("@cf/a", inputs, session="s"), None).continues is continues


@pytest.mark.parametrize("behind, new, prefill_s, answer_s, slowdown, expected", [
    (0.0, 1000, 0.001, 0.3, 1.0, 0.0),  # an idle pool: nothing waits behind it
    (2.0, 1000, 0.001, 0.3, 1.0, 2.6),  # two waiting, a whole prefill (1 s) and an answer (0.3 s) each
    (2.0, 40, 0.001, 0.3, 1.0, 0.68),  # a held prompt: its 40 new tokens and the answer
    (2.0, 40, 0.001, 0.3, 4.0, 2.72),  # at a quarter of the pool's speed
    (-1.0, 1000, 0.001, 0.3, 1.0, 0.0), (2.0, -5, 0.001, 0.3, 1.0, 0.6), (2.0, 10, -0.001, 0.3, 1.0, 0.6),
    (2.0, 10, 0.001, -0.3, 1.0, 0.02), (2.0, 10, 0.001, 0.3, -1.0, 0.0),  # nonsense counts as none
])
def test_the_delay_a_request_adds_for_those_behind_it(behind: float, new: float, prefill_s: float, answer_s: float, slowdown: float,
                                                      expected: float) -> None:
    assert imposed(behind, new, prefill_s, answer_s, slowdown) == pytest.approx(expected)


def test_in_an_idle_pool_the_first_token_alone_decides() -> None:
    replicas = [ReplicaView("a", held=HELD, **MEASURED, mean_new=40), ReplicaView("b", **MEASURED, mean_new=1000)]
    picks = schedule(ask(), replicas, 1.0)
    assert [p.cost for p in picks] == [pytest.approx((40 + 1) * 0.001), pytest.approx((1000 + 1) * 0.001)]


@pytest.mark.parametrize("holder_queue, others_queue, holder_keeps", [
    # one cold request ahead on the holder, none elsewhere, the pool nearly idle: its first token is
    # sooner elsewhere (1.0 s against 1.34 s), and the prefill elsewhere delays a third of a request
    (1, 0, False),
    # the pool loaded (2-3 queued on every replica): elsewhere is still 0.34 s sooner for this
    # request, but its whole prefill there holds up the two or so queued behind it for 1.3 s each;
    # the holder keeps it
    (3, 2, True),
])
def test_under_load_a_held_prompt_outweighs_a_slightly_shorter_queue(holder_queue: int, others_queue: int, holder_keeps: bool) -> None:
    replicas = [ReplicaView("a", holder_queue, HELD, **MEASURED, mean_new=1000)] + \
        [ReplicaView(n, others_queue, **MEASURED, mean_new=1000) for n in "bc"]
    assert (first(replicas) == "a") is holder_keeps
    queue = {p.name: holder_queue if p.name == "a" else others_queue for p in schedule(ask(), replicas, 1.0)}
    ttft = {name: predicted_ttft(ask().new_prefill(HELD if name == "a" else 0), q, q * 1000, 0.001, 0.3) for name, q in queue.items()}
    assert ttft["a"] > ttft["b"]  # by the first token alone, elsewhere


def test_a_picks_cost_is_its_predicted_first_token_and_the_delay_it_adds_at_the_pools_mean_queue() -> None:
    """Queues 3, 2 and a nonsense -4 (counted as none): the mean queue behind is 5/3."""
    replicas = [ReplicaView("a", 3, HELD, **MEASURED, mean_new=1000), ReplicaView("b", 2, **MEASURED, mean_new=1000),
                ReplicaView("c", -4, **MEASURED, mean_new=1000)]
    costs = {p.name: p.cost for p in schedule(ask(), replicas, 3.0)}
    behind = 5 / 3
    assert costs["a"] == pytest.approx((40 + 1 + 3 * 1000) * 0.001 + 3 * 0.3 + behind * (40 * 0.001 + 0.3))
    assert costs["b"] == pytest.approx((1000 + 1 + 2 * 1000) * 0.001 + 2 * 0.3 + behind * (1000 * 0.001 + 0.3))
    assert costs["c"] == pytest.approx((1000 + 1) * 0.001 + behind * (1000 * 0.001 + 0.3))


@pytest.mark.parametrize("queue, sent_queue, sent_new, mean_new, expected", [
    (0, 0, 0, 40, 0),  # nothing queued
    (2, 2, 1200, 1, 1200),  # two cold prompts this view sent: their prefill, whatever the replica's past requests cost
    (3, 2, 1200, 40, 1240),  # and a third request it reports that another view sent: at its measured mean
    (3, 0, 0, 40, 120),  # only reported: the mean
    (1, 2, 1200, 40, 1200),  # a report behind this view's own count: its own requests still count
    (2, 0, 0, None, 2 * 600),  # only reported, nothing measured: sized as this request would be there (600)
    (2, 2, -5, 40, 0), (2, 2, math.nan, 40, 0), (-1, 2, 1200, 40, 0), (2, -1, 1200, 40, 80),  # nonsense counts as none
])
def test_the_prefill_queued_ahead_is_what_was_sent_there_and_the_mean_for_the_rest(
        queue: float, sent_queue: float, sent_new: float, mean_new: float | None, expected: float) -> None:
    replica = ReplicaView("a", queue, mean_new=mean_new, sent_queue=sent_queue, sent_new=sent_new)
    assert queued_ahead(replica, 600) == pytest.approx(expected)


def test_a_prompt_no_replica_is_known_to_hold_goes_where_every_view_would_send_it() -> None:
    """With no record of the prompt anywhere, the view places it from what the replicas report
    (the fewest queued, within the bound, not measurably slow), ties by its first block, not by
    a cost read through its own measurements (here b, which this view measured faster: views
    measure speeds apart): views that share nothing agree, and the prefix gathers where they
    send it."""
    replicas = [ReplicaView("a", 1, **MEASURED), ReplicaView("b", 0, **{**MEASURED, "decode_s": 0.01}), ReplicaView("c", 0, **MEASURED)]
    apps = [app_ask(i) for i in range(30)]
    picks = [first(replicas, a) for a in apps]
    assert all(p == max("bc", key=lambda n: rendezvous(a.blocks[0], n)) for p, a in zip(picks, apps))
    assert set(picks) == {"b", "c"}
    slow = [ReplicaView("a", 1, **MEASURED), ReplicaView("b", 1, **MEASURED), ReplicaView("c", 0, **{**MEASURED, "decode_s": 0.12})]
    assert {first(slow, a) for a in apps} == {"a", "b"}  # slow first, then the queue
    crowded = [ReplicaView("a", 0, **{**MEASURED, "decode_s": 0.12}), ReplicaView("b", 5, **MEASURED), ReplicaView("c", 5, **MEASURED)]
    assert {schedule(a, crowded, 0.25)[0].name for a in apps} == {"a"}  # the bound before speed
    held = [replace(replicas[0], held=HELD), *replicas[1:]]  # once a replica is known to hold it, the cost decides
    assert {first(held, a) for a in apps} == {"a"}
    pinned = [ReplicaView("a", 0, **MEASURED), ReplicaView("b", 0, **MEASURED), ReplicaView("c", 0, **{**MEASURED, "decode_s": 0.01})]
    for a in apps:  # a session whose replica holds none of it any more goes the same way: where every view would send it
        assert first(pinned, replace(a, session="s", session_replica="a")) == first_of(a)
    assert {first_of(a) for a in apps} == {"a", "b", "c"}


def test_a_replica_just_sent_cold_prompts_is_not_taken_as_idle_for_its_cheap_past() -> None:
    """b's only measured request was a one-token prompt (mean 1 new token); it has since been
    sent two cold 1,000-token prompts. A third prompt, cold on both (its prefix held only by c,
    which is unhealthy), goes to a, whose one request in flight is one cold prompt, not to b as
    its past would have it."""
    replicas = [ReplicaView("a", 1, **MEASURED, mean_new=1000, sent_queue=1, sent_new=1000),
                ReplicaView("b", 2, **MEASURED, mean_new=1, sent_queue=2, sent_new=2000),
                ReplicaView("c", 0, held=1, healthy=False, **MEASURED)]
    cold = ask()
    assert first(replicas, cold) == "a"
    past_only = [replace(r, sent_queue=0.0, sent_new=0.0) for r in replicas]  # sized by the mean alone, b looked idle
    assert first(past_only, cold) == "b"



@pytest.mark.parametrize("gaps, expected", [
    ([], None),                                   # one token: no gap
    ([0.03, 0.03, 0.03], 0.03),                   # steady
    ([0.03, 0.03, 4.0, 0.03, 0.03], 0.03),        # another request's prefill between two tokens: not this replica's speed
    ([0.03, 4.0], 0.03),                          # of two gaps the lower is typical
    ([0.03, 0.12], 0.075),                        # a wobble within the stall factor counts
    ([0.03, 0.03, 0.12, 0.121], 0.06),            # a gap at exactly the stall factor counts, past it not
    ([0.12, 0.12, 0.48], 0.24),                   # 4x the typical gap is still this answer's
    ([0.0, 0.0, 0.0, 0.12] * 3, 0.03),            # tokens batched four to a chunk: the chunk's gap shared among them
    ([0.0, 0.0, 0.0, 0.12] * 3 + [5.0], 0.03),    # batched, and a stall
    ([0.2, 0.25, 0.3], 0.25),                     # a slowed replica is slow at every token
    ([0.003, 0.003, 0.003, 0.043] * 6, 0.013),    # or pauses at every turn (throttled): too many stalls to be neighbours
    ([0.03] * 14 + [4.0, 4.0], 0.03),             # two neighbours in sixteen gaps: within one in eight
    ([0.03] * 13 + [4.0, 4.0], 8.39 / 15),            # two in fifteen: more than one in eight, so they count
    ([0.0, 0.0], None),                           # every token at once: nothing to measure
    ([0.03, math.nan, -1.0, math.inf, 0.03], 0.03),  # nonsense gaps are left out
    ([math.inf, math.inf, 0.03], 0.03),           # even when most of them are
])
def test_time_between_tokens(gaps: list[float], expected: float | None) -> None:
    """Gaps of an answer that shared its replica with other requests."""
    from edgellm.routing.fleet import time_between_tokens

    got = time_between_tokens(gaps, shared=True)
    assert got == (None if expected is None else pytest.approx(expected))


@pytest.mark.parametrize("gaps, expected", [
    ([0.03, 0.03, 4.0, 0.03, 0.03], 4.12 / 5),      # alone on its replica, a stall is the replica's own
    ([0.0003] * 47 + [0.041], (47 * 0.0003 + 0.041) / 48),  # a fast replica paused once while it answered
    ([0.0, 0.0], None),
    ([], None),
])
def test_time_between_tokens_of_an_answer_alone(gaps: list[float], expected: float | None) -> None:
    from edgellm.routing.fleet import time_between_tokens

    got = time_between_tokens(gaps, shared=False)
    assert got == (None if expected is None else pytest.approx(expected))


def test_an_answer_stalled_by_a_neighbours_prefill_teaches_its_steady_speed() -> None:
    """The gaps an answer's tokens are seen with, as `followed` hands them to the view: tokens
    30 ms apart but for one stall (the replica prefilling another request) measure 30 ms."""
    from edgellm.generation import Finish, Token, Usage
    from edgellm.routing.fleet import time_between_tokens
    from edgellm.routing.pools import _Outcome

    times = iter([10.0, 10.03, 10.06, 14.06, 14.09, 14.12])
    outcome = _Outcome(9.0, clock=lambda: next(times))
    for word in "a stalled answer of six tokens".split():
        outcome.see(Token(word))
    outcome.see(Finish("stop", Usage(3, 6, cached_tokens=0)))
    assert outcome.gaps == pytest.approx([0.03, 0.03, 4.0, 0.03, 0.03])
    assert (outcome.first, outcome.last, outcome.tokens, outcome.ok) == (10.0, 14.12, 6, True)
    assert time_between_tokens(outcome.gaps) == pytest.approx(0.03)


async def test_a_followed_answer_is_watched_while_it_streams_and_its_prefill_comes_off_at_its_first_token() -> None:
    from edgellm.config import Config as _Config
    from edgellm.deps import Deps
    from edgellm.generation import Finish, Token, Usage
    from edgellm.routing.pools import Choice, dispatched, followed

    async def answer():  # type: ignore[no-untyped-def]
        yield Token("a")
        yield Token("b")
        yield Finish("stop", Usage(3, 2, cached_tokens=0))

    config = _Config.from_env(origins({"pool": "gpu", "replicas": ["http://a:1", "http://b:1"]}))
    deps = Deps(config=config, ai=None)  # type: ignore[arg-type]
    view = PoolView(config.routing.pools["gpu"])
    replica = view.replicas["gpu-1"]
    other = view.dispatched("gpu-1", ask(), "load", deps.clock.now())  # another request, still prefilling there
    choice = dispatched(deps, Choice(config.routing.origins[0], "load", view, ask()), "load")
    assert choice.expected is not None and replica.sent_new == other.new_tokens + choice.expected.new_tokens > other.new_tokens
    stream = followed(deps, choice, answer(), 0.0)
    assert replica.answering == []  # no gaps before its first token
    seen = []
    async for event in stream:
        seen.append((type(event).__name__, replica.sent_new, len(replica.answering), replica.awaiting))
    assert seen == [("Token", other.new_tokens, 1, 1), ("Token", other.new_tokens, 1, 1), ("Finish", other.new_tokens, 1, 1)]
    assert replica.answering == [] and replica.sent_new == other.new_tokens and replica.in_flight == 1


def test_an_answer_keeps_its_first_gaps_for_its_speed_and_its_latest_for_now() -> None:
    from edgellm.generation import Token
    from edgellm.routing.fleet import LIVE_GAPS, MAX_GAPS
    from edgellm.routing.pools import _Outcome

    times = iter([i * 0.01 for i in range(MAX_GAPS + 1)] + [MAX_GAPS * 0.01 + 0.5 * i for i in range(1, 101)])
    outcome = _Outcome(0.0, clock=lambda: next(times))
    for _ in range(MAX_GAPS + 101):
        outcome.see(Token("t"))
    assert len(outcome.gaps) == MAX_GAPS and outcome.gaps[-1] == pytest.approx(0.01)
    assert list(outcome.recent) == pytest.approx([0.5] * LIVE_GAPS) and outcome.tokens == MAX_GAPS + 101


@pytest.mark.parametrize("neighbour, itl", [
    (None, 4.12 / 5),         # alone on the replica: the stall was the replica's own
    ("before", 0.03),         # another request was in flight there when it started (and ended before it)
    ("during", 0.03),         # another was sent there while it streamed (and ended before it)
    ("still", 0.03),          # another was sent there while it streamed, and is still in flight
    ("reported", 0.03),       # the replica itself reports others (another isolate's)
])
async def test_a_stall_is_left_out_only_when_the_replica_had_a_neighbour(neighbour: str | None, itl: float) -> None:
    from edgellm.config import Config as _Config
    from edgellm.deps import Deps
    from edgellm.generation import Finish, Token, Usage
    from edgellm.routing.pools import Choice, dispatched, followed

    view: PoolView
    times = iter([10.0, 10.03, 10.06, 14.06, 14.09, 14.12])

    other = []

    async def answer():  # type: ignore[no-untyped-def]
        for i in range(6):
            if i == 3 and neighbour in ("during", "still"):
                other.append(view.dispatched("gpu-1", ask(8000), "load", 0.0))
            if i == 4 and neighbour != "still" and other:
                view.finished("gpu-1", 1.0, None, expected=other[0])
            yield Token("t")
        yield Finish("stop", Usage(3, 6, cached_tokens=0))

    config = _Config.from_env(origins({"pool": "gpu", "replicas": ["http://a:1", "http://b:1"]}))
    deps = Deps(config=config, ai=None)  # type: ignore[arg-type]
    view = PoolView(config.routing.pools["gpu"])
    if neighbour == "before":
        other.append(view.dispatched("gpu-1", ask(8000), "load", 0.0))
    if neighbour == "reported":
        view.replicas["gpu-1"].reading = sane_reading(deps.clock.now(), 2, 0)
    choice = dispatched(deps, Choice(config.routing.origins[0], "load", view, ask()), "load")
    async for _ in followed(deps, choice, answer(), 9.0, clock=lambda: next(times)):
        pass
    assert view.replicas["gpu-1"].itl_s == pytest.approx(itl)


@pytest.mark.parametrize("gaps, shared, explained, expected", [
    ([0.03] * 8 + [4.0] * 3, True, 11.91, 0.03),               # three stalls in eleven gaps, a neighbour waiting through them
    ([0.03] * 8 + [4.0] * 3, True, 11.9, 12.24 / 11),          # stalled longer than any neighbour waited: the replica's own
    ([0.03] * 8 + [4.0] * 3, True, 0.0, 12.24 / 11),           # nobody waited beside it: too many to be neighbours
    ([0.03] * 8 + [4.0] * 3, False, 100.0, 12.24 / 11),        # alone, nothing explains a stall
    ([0.03] * 16 + [4.0] * 2, True, 0.0, 0.03),                # few stalls need no explaining
])
def test_stalls_a_neighbours_wait_explains_are_left_out(gaps: list[float], shared: bool, explained: float,
                                                        expected: float) -> None:
    """A short answer stalled three times by one long prompt prefilled a batch at a time (on the
    real fleet, twelve tokens beside a 1,400-token prompt read 1.3 s between tokens, 8x its peers):
    each stall, beyond the answer's own typical gap, must fit in the time a neighbour waited."""
    from edgellm.routing.fleet import time_between_tokens

    assert time_between_tokens(gaps, shared, explained) == pytest.approx(expected)


class _Now:
    """One clock for the view and the answer's token times, moved by the answer as it streams."""

    def __init__(self, t: float) -> None:
        self.t = t

    def now(self) -> float:
        return self.t


@pytest.mark.parametrize("neighbour, itl", [
    ("during", 0.03),             # sent while it streamed, its first token near the answer's end: it waited through the stalls
    ("waiting", 0.03),            # sent before, still waiting at this answer's first token, first token near its end
    ("still", 0.03),              # sent while it streamed, no first token yet when the answer ends
    ("held", 0.03),               # on a prompt the view took to be held there (few new tokens), yet it waited as long as a cold one
    ("short", 12.24 / 11),        # waited 4 s of the answer's 12 s of stalls: the rest is the replica's own
    ("prefilled", 12.24 / 11),    # its first token came before this answer's: it stalled none of its tokens
    (None, 12.24 / 11),
])
async def test_an_answers_stalls_are_held_against_how_long_a_neighbour_waited_beside_it(neighbour: str | None, itl: float) -> None:
    from edgellm.config import Config as _Config
    from edgellm.deps import Deps
    from edgellm.generation import Finish, Token, Usage
    from edgellm.routing.pools import Choice, dispatched, followed

    offsets = (0, 0.03, 0.06, 4.06, 4.09, 8.09, 8.12, 12.12, 12.15, 12.18, 12.21, 12.24)
    config = _Config.from_env(origins({"pool": "gpu", "replicas": ["http://a:1", "http://b:1"]}))
    clock = _Now(9.0)
    deps = Deps(config=config, ai=None, clock=clock)  # type: ignore[arg-type]
    view = PoolView(config.routing.pools["gpu"])
    other = []
    held = ask(8000)
    if neighbour == "held":  # the view saw this prompt served there before: it takes it as held
        view.finished("gpu-1", 1.0, True, expected=view.dispatched("gpu-1", held, "load", 0.5))
        assert view.replicas["gpu-1"].expect(held, False, 1.0).new_tokens < held.prompt_tokens / 10

    def neighbour_at(i: int, t: float) -> None:
        if neighbour in ("during", "held", "still", "short") and i == 1:
            other.append(view.dispatched("gpu-1", held if neighbour == "held" else ask(8000), "load", t))
        if neighbour in ("during", "held", "waiting") and i == 10 or neighbour == "short" and i == 4:
            view.prefilled("gpu-1", other[0], t)

    async def answer():  # type: ignore[no-untyped-def]
        for i, offset in enumerate(offsets):
            clock.t = 10.0 + offset
            neighbour_at(i, clock.t)
            yield Token("t")
        yield Finish("stop", Usage(3, 12, cached_tokens=0))

    if neighbour in ("waiting", "prefilled"):
        other.append(view.dispatched("gpu-1", ask(8000), "load", 9.5))
    if neighbour == "prefilled":
        view.prefilled("gpu-1", other[0], 9.9)
    choice = dispatched(deps, Choice(config.routing.origins[0], "load", view, ask(0, tokens=10)), "load")
    async for _ in followed(deps, choice, answer(), 9.0, clock=lambda: clock.t):
        pass
    assert view.replicas["gpu-1"].itl_s == pytest.approx(itl)


async def test_an_answer_without_a_token_comes_off_its_replica_with_nothing_to_explain() -> None:
    from edgellm.config import Config as _Config
    from edgellm.deps import Deps
    from edgellm.routing.pools import Choice, dispatched, followed

    async def refused():  # type: ignore[no-untyped-def]
        raise ConnectionError("the replica went away")
        yield  # pragma: no cover

    config = _Config.from_env(origins({"pool": "gpu", "replicas": ["http://a:1", "http://b:1"]}))
    deps = Deps(config=config, ai=None)  # type: ignore[arg-type]
    view = PoolView(config.routing.pools["gpu"])
    view.replicas["gpu-1"].prefill_s = 0.01
    choice = dispatched(deps, Choice(config.routing.origins[0], "load", view, ask()), "load")
    with pytest.raises(ConnectionError):
        async for _ in followed(deps, choice, refused(), 9.0):
            pass
    assert view.replicas["gpu-1"].in_flight == 0 and view.replicas["gpu-1"].errors == 1
