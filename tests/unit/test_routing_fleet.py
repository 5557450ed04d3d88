"""How many prefix blocks a pool's view takes a replica to keep: learned from what the replica
says it reused (`usage.prompt_tokens_details.cached_tokens`) against what the view expected.

A replica's KV cache holds a few prompts, not every prompt it was ever sent; a view that
remembered them all would take every replica to hold every application's prompt once each had
seen it, and prefix locality would steer nothing."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from edgellm.routing.config import PoolConfig
from edgellm.routing.fleet import BLOCK_TOKENS, GROWTH, HELD_BLOCKS, MAX_SLOW_STREAK, MIN_HELD_BLOCKS, Expected, PoolView, sane_reading
from edgellm.routing.scheduler import BLOCK_CHARS, FORGET_S, Ask

BLOCKS = 20  # blocks a prompt (5 KiB: a long system prompt)


def prompt(app: int, blocks: int = BLOCKS) -> Ask:
    """An application's prompt: its own chained blocks (numbers standing for hashes), counted tokens."""
    return Ask(tuple(app * 1000 + i for i in range(blocks)), blocks * BLOCK_TOKENS, blocks * BLOCK_CHARS)


def serve(view: PoolView, name: str, ask: Ask, cached: int) -> Expected:
    """One request sent to `name` and answered, the replica saying it reused `cached` tokens."""
    expected = view.dispatched(name, ask, "load", 0.0)
    view.finished(name, 1.0, True, 0.5, 0.05, cached, int(ask.prompt_tokens), 1.0, expected=expected)
    return expected


async def object_call(router: Any, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """One call to the pool's Durable Object, as an isolate's `pools` makes it: a POST to the
    object's `path` for pool "gpu", its JSON answer."""
    from edgellm.http import Request

    response = await router.fetch(Request("POST", "https://router.internal" + path, {}, json.dumps({"pool": "gpu", **body}).encode()))
    return json.loads(response.body)  # type: ignore[no-any-return]


def one_replica() -> PoolView:
    return PoolView(PoolConfig("gpu", ("a", "b")))


def test_what_a_view_expects_of_a_replica() -> None:
    view = one_replica()
    for app in range(4):
        serve(view, "a", prompt(app), 0)
    expected = view.dispatched("a", prompt(1), "load", 0.0)
    # app 1 was followed by apps 2 and 3: 40 blocks remembered since its last one
    assert expected == Expected(prompt(1).blocks, BLOCKS, 2 * BLOCKS, BLOCKS * BLOCK_TOKENS, False, False,
                                new_tokens=prompt(1).prompt_tokens - BLOCKS * BLOCK_TOKENS)
    # b never saw it: the whole prompt is left to prefill there
    assert view.dispatched("b", prompt(1), "load", 0.0) == Expected(prompt(1).blocks, new_tokens=prompt(1).prompt_tokens)


def test_a_prompt_the_replica_let_go_brings_the_bound_down_to_its_depth() -> None:
    """Apps 0..3 served; the replica reuses nothing of app 0 (three prompts, 60 blocks, came
    after it): it keeps fewer than 60 blocks, so app 1 (further back than 60 now) is forgotten,
    and the two prompts since, and app 0 itself, are still taken as held."""
    view = one_replica()
    for app in range(4):
        serve(view, "a", prompt(app), 0)
    replica = view.replicas["a"]
    assert replica.holds(prompt(1).blocks, 1.0) == BLOCKS and replica.held_bound == HELD_BLOCKS
    serve(view, "a", prompt(0), 0)
    assert replica.held_bound == 3 * BLOCKS
    assert replica.holds(prompt(1).blocks, 1.0) == 0
    assert [replica.holds(prompt(app).blocks, 1.0) for app in (2, 3, 0)] == [BLOCKS] * 3
    assert view.to_json(1.0)["replicas"][0]["prefix_blocks_bound"] == 3 * BLOCKS


def test_a_prompt_it_kept_leaves_the_bound_alone() -> None:
    view = one_replica()
    for app in range(4):
        serve(view, "a", prompt(app), 0)
    half = int(BLOCKS * BLOCK_TOKENS / 2)  # half of what was expected: still a hit (a template may differ)
    serve(view, "a", prompt(0), half)
    assert view.replicas["a"].held_bound == HELD_BLOCKS
    serve(view, "a", prompt(1), half - 1)  # just under half: let go
    assert view.replicas["a"].held_bound == 3 * BLOCKS


def test_the_bound_never_falls_below_its_floor_nor_rises_on_a_miss() -> None:
    view = one_replica()
    serve(view, "a", prompt(0), 0)
    serve(view, "a", prompt(0), 0)  # let go at once (a restarted replica): depth 0
    replica = view.replicas["a"]
    assert replica.held_bound == MIN_HELD_BLOCKS
    assert len(replica.held) == MIN_HELD_BLOCKS
    for app in range(1, 3):
        serve(view, "a", prompt(app, 4), 0)
    serve(view, "a", prompt(1, 4), 0)  # a miss deeper than the bound learned: it does not come back up
    assert replica.held_bound == MIN_HELD_BLOCKS


def test_a_replica_that_reused_more_than_remembered_grows_the_bound() -> None:
    view = one_replica()
    replica = view.replicas["a"]
    serve(view, "a", prompt(0), 0)
    serve(view, "a", prompt(0), 0)
    assert replica.held_bound == MIN_HELD_BLOCKS
    serve(view, "a", prompt(1), 0)  # app 0 is forgotten here (20 blocks since, bound 16) ...
    assert replica.holds(prompt(0).blocks, 1.0) == 0
    serve(view, "a", prompt(0), int(2 * BLOCK_TOKENS) - 1)  # ... a reuse under two blocks is the template's
    assert replica.held_bound == MIN_HELD_BLOCKS
    serve(view, "a", prompt(2), 0)
    serve(view, "a", prompt(0), int(2 * BLOCK_TOKENS))  # ... two blocks it kept that the view had forgotten
    assert replica.held_bound == round(MIN_HELD_BLOCKS * GROWTH)
    for _ in range(10):  # two prompts taking turns, both kept: it grows until both are remembered, no further
        serve(view, "a", prompt(3), int(prompt(3).prompt_tokens))
        serve(view, "a", prompt(4), int(prompt(4).prompt_tokens))
    assert 2 * BLOCKS <= replica.held_bound < 2 * BLOCKS * GROWTH
    for app in range(10, 100):  # a replica that keeps everything: never past the most remembered
        serve(view, "a", prompt(app), int(prompt(app).prompt_tokens))
    assert replica.held_bound == HELD_BLOCKS


def test_a_miss_beside_the_same_prompt_in_flight_says_nothing_of_the_bound() -> None:
    """llama.cpp serves a second request on a prompt in another slot, which prefills it again
    while the first still holds it: no sign the cache let it go."""
    view = one_replica()
    for app in range(4):
        serve(view, "a", prompt(app), 0)
    first = view.dispatched("a", prompt(0), "load", 0.0)
    second = view.dispatched("a", prompt(0), "load", 0.0)
    assert (first.concurrent, second.concurrent) == (False, True)
    view.finished("a", 1.0, True, 0.5, 0.05, 0, int(prompt(0).prompt_tokens), 1.0, expected=second)
    assert view.replicas["a"].held_bound == HELD_BLOCKS
    view.finished("a", 1.0, True, 0.5, 0.05, 0, int(prompt(0).prompt_tokens), 1.0, expected=first)
    assert view.replicas["a"].held_bound == 3 * BLOCKS  # the first had it to itself: that miss counts
    assert not view.replicas["a"].serving and view.replicas["a"].in_flight == 0


def test_what_is_in_flight_comes_off_whatever_the_end() -> None:
    view = one_replica()
    replica = view.replicas["a"]
    for ok in (True, False, None):
        expected = view.dispatched("a", prompt(0), "load", 0.0)
        other = view.dispatched("a", prompt(1), "load", 0.0)
        view.finished("a", 1.0, ok, expected=expected)
        assert set(replica.serving) == set(prompt(1).blocks)
        view.finished("a", 1.0, ok, expected=other)
        assert not replica.serving
    view.dispatched("a", prompt(2), "load", 0.0)
    view.finished("a", 1.0, None)  # a report without its expectation (an object's lease lost): cleared once idle
    assert not replica.serving


@pytest.mark.parametrize("ok, cached", [(False, 0), (None, 0), (True, None), (True, -1)])
def test_only_an_answer_with_a_count_teaches(ok: bool | None, cached: int | None) -> None:
    view = one_replica()
    for app in range(4):
        serve(view, "a", prompt(app), 0)
    expected = view.dispatched("a", prompt(0), "load", 0.0)
    view.finished("a", 1.0, ok, 0.5, 0.05, cached, int(prompt(0).prompt_tokens), 1.0, expected=expected)
    assert view.replicas["a"].held_bound == HELD_BLOCKS


def test_a_conversations_next_turn_reusing_its_last_answer_is_no_sign_of_room() -> None:
    """A later turn's prompt holds the last answer, which the replica keeps and the view never
    saw: reusing more than expected there says nothing of the bound; a first turn does."""
    view = one_replica()
    replica = view.replicas["a"]
    serve(view, "a", prompt(0), 0)
    serve(view, "a", prompt(0), 0)
    assert replica.held_bound == MIN_HELD_BLOCKS
    turn = Ask(prompt(5).blocks, prompt(5).prompt_tokens, prompt(5).prompt_chars, session="s1")
    expected = serve(view, "a", turn, 0)
    assert not expected.continued
    later = Ask(prompt(6).blocks, prompt(6).prompt_tokens, prompt(6).prompt_chars, session="s1")
    assert serve(view, "a", later, int(later.prompt_tokens)).continued
    assert replica.held_bound == MIN_HELD_BLOCKS
    first = Ask(prompt(7).blocks, prompt(7).prompt_tokens, prompt(7).prompt_chars, session="s2")
    serve(view, "a", first, int(first.prompt_tokens))
    assert replica.held_bound == round(MIN_HELD_BLOCKS * GROWTH)


def test_a_bounded_replica_stops_looking_warm_for_every_prompt() -> None:
    """Eight applications, a replica that keeps three prompts (a least-recently-used cache of 60
    blocks, as the fleet benchmark's replicas are sized): once the view has learned its bound,
    what it takes the replica to hold is what the replica holds, for nearly every request."""
    from collections import OrderedDict

    view = one_replica()
    cache: OrderedDict[int, None] = OrderedDict()

    def replica_reuses(ask: Ask) -> int:
        held = 0
        while held < len(ask.blocks) and ask.blocks[held] in cache:
            held += 1
        for block in ask.blocks:
            cache[block] = None
            cache.move_to_end(block)
        while len(cache) > 3 * BLOCKS:
            cache.popitem(last=False)
        return int(held * BLOCK_TOKENS)

    import random
    rng = random.Random(5)
    right, right_remembering_all, seen = [], [], set()
    for i in range(400):
        ask = prompt(rng.randrange(8))
        said = view.replicas["a"].holds(ask.blocks, 1.0) == len(ask.blocks)
        reused = replica_reuses(ask)
        expected = view.dispatched("a", ask, "load", 0.0)
        view.finished("a", 1.0, True, 0.5, 0.05, reused, int(ask.prompt_tokens), 1.0, expected=expected)
        right.append(said == (reused > 0))
        right_remembering_all.append((ask.blocks[0] in seen) == (reused > 0))
        seen.add(ask.blocks[0])
    assert sum(right_remembering_all[100:]) < 150  # wrong whenever the replica let one go: most of the time
    assert sum(right[100:]) >= 295, sum(right[100:])
    assert 2 * BLOCKS <= view.replicas["a"].held_bound <= 4 * BLOCKS


def test_the_pool_object_learns_from_the_done_report() -> None:
    """On Cloudflare the pool's Durable Object keeps the expectation under the request's lease
    and holds `/done`'s count against it, as an isolate's own view does."""
    import asyncio

    from edgellm.config import Config
    from edgellm.deps import Deps
    from edgellm.routing.router import RouterObject

    config = Config.from_env({"ORIGINS": json.dumps([{"pool": "gpu", "replicas": ["http://a:1"]}])})
    router = RouterObject(Deps(config=config, ai=None))  # type: ignore[arg-type]

    async def run() -> None:
        for i, app in enumerate([0, 1, 2, 3, 0]):
            ask = prompt(app)
            picks = await object_call(router, "/pick", {"blocks": list(ask.blocks), "tokens": ask.prompt_tokens, "chars": ask.prompt_chars, "id": f"r{i}"})
            await object_call(router, "/done", {"id": f"r{i}", "name": picks["picks"][0][0], "ok": True, "cached_tokens": 0,
                                 "prompt_tokens": int(ask.prompt_tokens)})
        stats = await object_call(router, "/stats", {})
        assert stats["replicas"][0]["prefix_blocks_bound"] == 3 * BLOCKS

    asyncio.run(run())


def test_the_pool_object_places_a_later_turn_it_has_not_seen_where_any_view_would() -> None:
    """`/pick` carries whether the request continues a conversation: a later turn the object never
    saw goes where an isolate deciding alone sends it (the fewest queued, ties by its
    application's rendezvous), a first turn where it starts soonest (the replica measured faster)."""
    import asyncio

    from edgellm.config import Config
    from edgellm.deps import Deps
    from edgellm.routing.router import RouterObject
    from edgellm.routing.scheduler import rendezvous

    names = ("gpu-a", "gpu-b", "gpu-c")
    config = Config.from_env({"ORIGINS": json.dumps([{"pool": "gpu", "load_bound": 1.0, "replicas": [
        {"name": n, "url": f"http://{n}:1"} for n in names]}])})
    router = RouterObject(Deps(config=config, ai=None))  # type: ignore[arg-type]

    async def pick(body: dict[str, Any]) -> str:
        return str((await object_call(router, "/pick", body))["picks"][0][0])

    async def run() -> None:
        warm = [await pick({"blocks": [str(i)], "tokens": 10, "chars": 40, "id": f"warm{i}"}) for i in range(3)]
        assert set(warm) == set(names)
        for i, name in enumerate(warm):
            await object_call(router, "/done", {"id": f"warm{i}", "name": name, "ok": True, "ttft_s": 0.1,
                                                "itl_s": 0.005 if i == 0 else 0.03})
        block = next(b for b in range(10, 1000) if max(names, key=lambda n: rendezvous(b, n)) != warm[0])
        turn = {"blocks": [str(block)], "tokens": 10, "chars": 40}
        assert await pick({**turn, "session": "s1", "continues": True, "id": "later"}) == max(names, key=lambda n: rendezvous(block, n))
        assert await pick({**turn, "session": "s2", "id": "first"}) == warm[0]

    asyncio.run(run())


def test_the_pool_object_takes_a_prompt_as_held_once_its_prefill_could_be_done() -> None:
    """The object hears only `/done`, never a first token: a prompt it sent counts as held on
    its replica once the prefill queued there when it was sent could be done at the measured
    speed, not before (a second request would prefill it again beside the first), and not only
    when the first ends (a long answer would keep its prompt from every request meanwhile)."""
    import asyncio

    from edgellm.config import Config
    from edgellm.deps import Deps
    from edgellm.routing.router import RouterObject
    from tests.conftest import ManualClock

    config = Config.from_env({"ORIGINS": json.dumps([{"pool": "gpu", "load_bound": 4.0, "replicas": [
        {"name": n, "url": f"http://{n}:1"} for n in ("gpu-a", "gpu-b")]}])})
    tokens = int(prompt(0).prompt_tokens)

    async def pick_after(wait_s: float) -> tuple[str, list[str]]:
        clock = ManualClock()
        router = RouterObject(Deps(config=config, ai=None, clock=clock))  # type: ignore[arg-type]

        def ask(app: int, lease: str) -> dict:  # type: ignore[type-arg]
            return {"blocks": [str(b) for b in prompt(app).blocks], "tokens": tokens, "chars": prompt(app).prompt_chars, "id": lease}

        for lease, app in (("m1", 5), ("m2", 6)):  # measured: a cold prompt prefills in 1 s, an answer takes 0.2 s
            measured = await object_call(router, "/pick", ask(app, lease))
            await object_call(router, "/done", {"id": lease, "name": measured["picks"][0][0], "ok": True, "ttft_s": 1.0, "itl_s": 0.05,
                                 "total_s": 1.2, "cached_tokens": 0, "prompt_tokens": tokens})
        first = (await object_call(router, "/pick", ask(0, "first")))["picks"][0][0]
        clock.advance(wait_s)
        second = (await object_call(router, "/pick", ask(0, "second")))["picks"][0]
        return first, second

    first, (second, reason) = asyncio.run(pick_after(0.1))
    assert second != first and reason != "prefix"  # still being prefilled: the other replica starts sooner
    first, (second, reason) = asyncio.run(pick_after(1.5))
    assert (second, reason) == (first, "prefix")


def test_a_prompt_stays_in_flight_until_its_last_request_ends() -> None:
    view = one_replica()
    for app in range(4):
        serve(view, "a", prompt(app), 0)
    first = view.dispatched("a", prompt(0), "load", 0.0)
    second = view.dispatched("a", prompt(0), "load", 0.0)
    view.finished("a", 1.0, True, 0.5, 0.05, 0, int(prompt(0).prompt_tokens), 1.0, expected=second)
    assert view.replicas["a"].serving[prompt(0).blocks[0]] == 1
    assert view.dispatched("a", prompt(0), "load", 0.0).concurrent  # the first is still being served
    assert not first.concurrent


@pytest.mark.parametrize("ttft, total, cached, prompt_tokens, prefill_s, answer_s, mean_new", [
    (1.1, 1.5, 0, 1099, 0.001, 0.4, 1099),  # a cold prompt: its first token over its tokens and the one recomputed
    (1.1, 1.5, 1000, 1099, 0.011, 0.4, 99),  # 99 new tokens: timed over those
    (0.52, 1.5, 1099, 1163, 0.008, 0.98, 64),  # exactly a block (64 tokens) new: the least that is timed
    (0.5, 1.5, 1100, 1163, None, 1.0, 63),  # under a block new: mostly overhead, not timed
    (0.5, 0.4, 0, 1099, 0.5 / 1100, None, 1099),  # a last token before the first: no answer time
    (0.5, 1.5, 2000, 1099, None, 1.0, 0),  # reused more than the prompt (a report is data): nothing new
])
def test_what_an_answer_teaches_of_a_replicas_rates(ttft: float, total: float, cached: int, prompt_tokens: int,
                                                   prefill_s: float | None, answer_s: float | None, mean_new: float) -> None:
    view = one_replica()
    view.dispatched("a", prompt(0), "load", 0.0)
    view.finished("a", 1.0, True, ttft, 0.05, cached, prompt_tokens, total)
    replica = view.replicas["a"]
    assert replica.prefill_s == (None if prefill_s is None else pytest.approx(prefill_s))
    assert replica.answer_s == (None if answer_s is None else pytest.approx(answer_s))
    assert replica.mean_new == mean_new and replica.itl_s == 0.05 and replica.ttft_s == ttft
    assert (replica.cached_tokens, replica.prompt_tokens) == (cached, prompt_tokens)


@pytest.mark.parametrize("ok", [None, False])
def test_an_answer_that_did_not_finish_teaches_no_rates(ok: bool | None) -> None:
    view = one_replica()
    view.dispatched("a", prompt(0), "load", 0.0)
    view.finished("a", 1.0, ok, 1.1, 0.05, 0, 1099, 1.5)
    replica = view.replicas["a"]
    assert (replica.prefill_s, replica.answer_s, replica.mean_new) == (None, None, None)
    assert replica.errors == (ok is False) and replica.in_flight == 0


def test_the_prefill_a_view_sent_is_queued_work_until_each_request_ends() -> None:
    view = one_replica()
    serve(view, "a", prompt(0), 0)  # a holds app 0
    hit = view.dispatched("a", prompt(0), "prefix", 0.0)
    cold = view.dispatched("a", prompt(1), "load", 0.0)
    assert (hit.new_tokens, cold.new_tokens) == (0.0, prompt(1).prompt_tokens)
    [a, b] = view.views(prompt(2).blocks, 1.0)
    assert (a.sent_queue, a.sent_new, b.sent_queue, b.sent_new) == (2.0, prompt(1).prompt_tokens, 0.0, 0.0)
    view.finished("a", 2.0, True, 0.5, 0.05, 0, int(prompt(1).prompt_tokens), 1.0, expected=cold)
    assert view.replicas["a"].sent_new == 0.0 and view.replicas["a"].in_flight == 1  # the hit's nothing is left
    again = view.dispatched("a", prompt(3), "load", 0.0)
    view.finished("a", 3.0, None, expected=again)  # the client left: its work is off the replica too
    view.finished("a", 3.0, True, 0.5, 0.05, int(prompt(0).prompt_tokens), int(prompt(0).prompt_tokens), 1.0, expected=hit)
    assert (view.replicas["a"].sent_new, view.replicas["a"].in_flight) == (0.0, 0)


def test_an_end_without_its_expectation_clears_the_queued_work_once_nothing_is_in_flight() -> None:
    view = one_replica()
    view.dispatched("a", prompt(1), "load", 0.0)
    view.finished("a", 1.0, None)  # a report that lost what was expected (the object's lease expired)
    assert view.replicas["a"].sent_new == 0.0


def test_a_one_token_answer_has_no_answer_time_to_teach() -> None:
    view = one_replica()
    view.dispatched("a", prompt(0), "load", 0.0)
    view.finished("a", 1.0, True, 0.5, None, 0, int(prompt(0).prompt_tokens), 0.5)  # first token was the last
    assert view.replicas["a"].answer_s is None and view.replicas["a"].mean_new == prompt(0).prompt_tokens


def test_a_streaming_answer_shows_its_replica_slower_at_once() -> None:
    """What the decision reads as a replica's time between tokens: its smoothed past, or what its
    streaming answers show now when they are slower; too few gaps say nothing; an answer that ended
    shows nothing more."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c")))
    for name in "abc":
        serve(view, name, prompt(0), 0)  # every replica answered at 50 ms between tokens
    decode = lambda: {v.name: v.decode_s for v in view.views((), 2.0)}  # noqa: E731
    assert decode() == {"a": 0.05, "b": 0.05, "c": 0.05}
    slow: list[float] = [0.2] * 7
    fast: list[float] = [0.01] * 30
    view.watch("a", slow, 0.0)
    view.watch("b", fast, 0.0)
    assert decode() == {"a": 0.05, "b": 0.05, "c": 0.05}  # seven gaps are too few; a faster one moves nothing
    slow.append(0.2)
    assert decode()["a"] == pytest.approx(0.2)
    steady: list[float] = [0.05] * 8
    view.watch("a", steady, 0.0)
    assert decode()["a"] == pytest.approx(0.2)  # the slowest of its streaming answers
    assert view.to_json(2.0)["replicas"][0]["live_itl_s"] == pytest.approx(0.2)
    view.unwatch("a", slow)
    view.unwatch("a", slow)  # twice is harmless
    assert decode() == {"a": 0.05, "b": 0.05, "c": 0.05} and [gaps for gaps, _ in view.replicas["a"].answering] == [steady]
    twin = list(fast)  # another answer's gaps, equal so far
    view.watch("b", twin, 0.0)
    view.unwatch("b", twin)
    assert len(view.replicas["b"].answering) == 1 and view.replicas["b"].answering[0][0] is fast


@pytest.mark.parametrize("waited_s, slower", [
    (None, True),   # nobody waited beside it: three 4 s stalls in eleven gaps are the replica's own pace
    (12.0, False),  # a request sent there waited 12 s for its first token meanwhile: its prompt stalled them
    (4.0, True),    # it waited 4 s: it explains one stall, not three
])
def test_a_streaming_answers_stalls_count_only_beyond_what_a_neighbour_waited(waited_s: float | None, slower: bool) -> None:
    """While an answer streams, its stalls are held against how long a request sent beside it
    waited for its first token (timed, whatever the view expected of its prompt), as when the
    answer ends."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c")))
    for name in "abc":
        serve(view, name, prompt(9), 0)  # 50 ms between tokens
    view.prefilled("a", view.dispatched("a", prompt(1), "load", 10.0), 10.0)  # an answer streams from a from t = 10
    gaps: list[float] = [0.05] * 8 + [4.0] * 3
    view.watch("a", gaps, 10.0)
    if waited_s is not None:
        neighbour = view.dispatched("a", prompt(1), "prefix", 10.1)  # the same prompt: taken as held there
        view.prefilled("a", neighbour, 10.1 + waited_s)
    decode = {v.name: v.decode_s for v in view.views((), 22.5)}
    assert (decode["a"] > 1.5 * decode["b"]) is slower


def test_a_replica_slowed_mid_answer_loses_the_prefix_it_holds_before_that_answer_ends() -> None:
    """a holds the prompt and is streaming one answer; b and c are idle and cold. At 50 ms a
    token the prompt goes to a; once a's answer shows 10x slower tokens, it goes elsewhere."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c")))
    for name in "abc":
        serve(view, name, prompt(9), 0)
    view.finished("a", 1.0, True, 2.0, 0.05, 0, int(prompt(1).prompt_tokens), 3.0)  # rates: a cold prompt's prefill
    expected = view.dispatched("a", prompt(1), "load", 0.0)  # a now holds the prompt
    assert view.choose(prompt(1), 2.0)[0].name != "a"  # while it prefills it, its cold prefill is queued there
    view.prefilled("a", expected, 0.0)  # and now it is answering it
    gaps: list[float] = [0.05] * 8
    view.watch("a", gaps, 0.0)
    assert view.choose(prompt(1), 2.0)[0].name == "a"
    gaps[:] = [0.5] * 8
    assert view.choose(prompt(1), 2.0)[0].name != "a"


def test_a_replica_measured_slow_once_is_offered_requests_again_as_the_measurement_ages() -> None:
    """One answer on a stalled for seconds (a passing fault): its time between tokens reads 8x the
    others', and new prompts go elsewhere, even to replicas that are busy. With no request, nothing
    would measure it again; the measurement fades, and a few decay times later it takes them."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c")))
    for name in "abc":
        serve(view, name, prompt(9), 0)  # 50 ms between tokens, at t = 1
    view.finished("a", 1.0, True, 2.0, 0.4, 0, int(prompt(1).prompt_tokens), 3.0)
    assert view.replicas["a"].itl_at == 1.0 and view.to_json(1.0)["replicas"][0]["itl_age_s"] == 0.0
    for name in "bc":
        view.dispatched(name, prompt(2), "load", 0.0)  # b and c are each busy with one request
    assert view.choose(prompt(3), 1.0)[0].name != "a"
    assert view.choose(prompt(3), 1.0 + 5 * FORGET_S)[0].name == "a"
    assert view.to_json(1.0 + 5 * FORGET_S)["replicas"][0]["itl_age_s"] == 5 * FORGET_S
    view.prefilled("a", view.dispatched("a", prompt(3), "prefix", 0.0), 0.0)  # it takes one, and answers it
    gaps: list[float] = [0.4] * 8  # as slow as before: that is now, whatever the age
    view.watch("a", gaps, 0.0)
    assert view.views((), 1.0 + 5 * FORGET_S)[0].decode_age == 0.0
    assert view.views((), 1.0 + 5 * FORGET_S)[0].decode_s == pytest.approx(0.4)
    assert view.choose(prompt(3), 1.0 + 5 * FORGET_S)[0].name != "a"


def test_a_replica_slow_answer_after_answer_is_forgotten_more_slowly_each_time() -> None:
    """Each answer in a row that shows a slower than the rest of the pool stretches the fade: a
    replica still slow when offered a request again is not a passing fault, and the next offer
    comes later (up to `MAX_SLOW_STREAK` times the decay time). One answer at the pool's pace
    ends the streak, and the fade is back to its own decay time."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c")))
    for name in "abc":
        serve(view, name, prompt(9), 0)  # 50 ms between tokens each
    assert [view.replicas[n].slow_streak for n in "abc"] == [0, 0, 0]
    for streak in range(1, MAX_SLOW_STREAK + 3):
        view.finished("a", 1.0, True, 2.0, 0.4, 0, int(prompt(1).prompt_tokens), 3.0)  # 8x the others'
        assert view.replicas["a"].slow_streak == min(streak, MAX_SLOW_STREAK)
        assert view.views((), 1.0 + FORGET_S)[0].decode_age == pytest.approx(FORGET_S / min(streak, MAX_SLOW_STREAK))
        assert view.to_json(1.0)["replicas"][0]["slow_streak"] == min(streak, MAX_SLOW_STREAK)
    assert [view.replicas[n].slow_streak for n in "bc"] == [0, 0]  # the rest were not measured slow
    for name in "bc":
        view.dispatched(name, prompt(2), "load", 0.0)  # b and c are each busy with one request
    # a replica measured slow once takes a new prompt again five decay times on (above); this one not
    assert view.choose(prompt(3), 1.0 + 5 * FORGET_S)[0].name != "a"
    assert view.choose(prompt(3), 1.0 + 5 * MAX_SLOW_STREAK * FORGET_S)[0].name == "a"
    view.finished("a", 1.0, True, 2.0, 0.07, 0, int(prompt(1).prompt_tokens), 3.0)  # 1.4x: within the noise
    assert view.replicas["a"].slow_streak == 0
    assert view.views((), 1.0 + FORGET_S)[0].decode_age == pytest.approx(FORGET_S)


def test_a_replica_is_slow_only_against_the_rest_of_the_pool() -> None:
    """Alone in its pool a replica has nothing to be slow against; with one other, it is judged
    against that one (the answer's own past is not the measure), at `TOLERANCE` of it."""
    alone = one_replica()
    for _ in range(3):
        alone.finished("a", 1.0, True, 0.5, 0.4, total_s=1.0)
    assert alone.replicas["a"].slow_streak == 0
    pair = PoolView(PoolConfig("gpu", ("a", "b")))
    pair.finished("b", 1.0, True, 0.5, 0.125, total_s=1.0)
    pair.finished("a", 1.0, True, 0.5, 0.1875, total_s=1.0)  # exactly 1.5x: the noise
    assert pair.replicas["a"].slow_streak == 0
    pair.finished("a", 1.0, True, 0.5, 0.19, total_s=1.0)
    pair.finished("a", 1.0, True, 0.5, 0.4, total_s=1.0)  # a's own smoothed past is slow now: b is the measure
    assert pair.replicas["a"].slow_streak == 2


def test_a_slow_replicas_measurement_does_not_fade_while_requests_wait_there() -> None:
    """A slow replica with requests in flight (queued behind its slowness, no token yet) is not
    thought faster for the wait: its measurement ages only from when it went idle."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c")))
    for name in "abc":
        serve(view, name, prompt(9), 0)
    view.finished("a", 1.0, True, 2.0, 0.4, 0, int(prompt(1).prompt_tokens), 3.0)  # slow, idle from t = 1
    waiting = view.dispatched("a", prompt(1), "load", 0.0)
    later = 1.0 + 5 * FORGET_S
    assert view.views((), later)[0].decode_age == 0.0
    assert view.choose(prompt(1), later)[0].name != "a"  # it holds the prompt, but it is slow and busy
    view.finished("a", later, None, expected=waiting)  # idle again from here, nothing measured
    assert view.views((), later + FORGET_S)[0].decode_age == FORGET_S
    assert view.views((), later + FORGET_S)[1].decode_age == 5 * FORGET_S + FORGET_S  # b: idle since its answer


@pytest.mark.parametrize("age, expected", [
    (0.0, 0.7 * 0.4 + 0.3 * 0.05),                          # back to back: the usual smoothing
    (FORGET_S, 0.7 / math.e * 0.4 + (1 - 0.7 / math.e) * 0.05),  # the past kept at e^-1 of its weight
    (10 * FORGET_S, 0.05),                                   # after a quiet spell: the new answer
    (-1.0, 0.7 * 0.4 + 0.3 * 0.05),                          # a clock gone back: as back to back
])
def test_an_answers_speed_outweighs_an_old_measurement(age: float, expected: float) -> None:
    view = one_replica()
    view.finished("a", 1.0, True, 0.5, 0.4, total_s=1.0)
    view.finished("a", 1.0 + age, True, 0.5, 0.05, total_s=1.0)
    assert view.replicas["a"].itl_s == pytest.approx(expected, rel=1e-3)


def test_a_requests_prefill_comes_off_the_queued_work_at_its_first_token_once() -> None:
    view = one_replica()
    one, two = view.dispatched("a", prompt(1), "load", 0.0), view.dispatched("a", prompt(2), "load", 0.0)
    assert view.replicas["a"].sent_new == 2 * prompt(1).prompt_tokens
    view.prefilled("a", one, 0.0)
    assert view.replicas["a"].sent_new == prompt(2).prompt_tokens
    view.finished("a", 1.0, True, expected=one, prefilled=True)  # not twice
    assert view.replicas["a"].sent_new == prompt(2).prompt_tokens
    view.dispatched("a", prompt(3), "load", 0.0)
    view.finished("a", 1.0, None, expected=two)  # no first token: it comes off at the end
    assert view.replicas["a"].sent_new == prompt(3).prompt_tokens


def test_a_streaming_answers_stall_counts_unless_the_replica_serves_others() -> None:
    """The same neighbour rule as a finished answer's: others in flight there, or in its report."""
    view = PoolView(PoolConfig("gpu", ("a", "b", "c")))
    for name in "abc":
        serve(view, name, prompt(0), 0)
    decode = lambda: next(v.decode_s for v in view.views((), 2.0) if v.name == "a")  # noqa: E731
    stalled = [0.05] * 15 + [4.05]
    view.dispatched("a", prompt(1), "load", 0.0)
    view.watch("a", stalled, 0.0)
    assert decode() == pytest.approx(0.3)  # alone: the replica paused
    view.replicas["a"].reading = sane_reading(2.0, 2, 0)
    assert decode() == pytest.approx(0.05)  # its report shows another isolate's request: that one's prefill
    view.replicas["a"].reading = None
    view.dispatched("a", prompt(2), "load", 0.0)
    assert decode() == pytest.approx(0.05)  # beside another of this view's
    view.finished("a", 3.0, None)
    view.finished("a", 3.0, None)  # both ended, the stream never unwatched (never closed)
    assert view.replicas["a"].answering == [] and decode() == 0.05


def test_a_replica_with_no_past_reads_its_streaming_answer() -> None:
    view = one_replica()
    view.dispatched("a", prompt(1), "load", 0.0)
    view.watch("a", [0.2] * 8, 0.0)
    assert {v.name: v.decode_s for v in view.views((), 1.0)} == {"a": pytest.approx(0.2), "b": None}


def test_a_request_waits_from_when_it_is_sent_until_its_first_token_or_its_end_without_one() -> None:
    """The clock an answer's stalls are held against runs while any request this view sent to the
    replica waits for its first token, and only then; a clock gone back adds nothing."""
    view = one_replica()
    replica = view.replicas["a"]
    one = view.dispatched("a", prompt(1), "load", 10.0)
    two = view.dispatched("a", prompt(2), "load", 10.0)
    assert replica.awaiting == 2
    view.finished("a", 11.0, False, expected=one)  # refused before answering: it no longer waits
    assert replica.awaiting == 1 and replica.in_flight == 1
    view.prefilled("a", two, 13.0)
    assert replica.awaiting == 0 and replica.awaited(20.0) == 3.0  # 10 to 13, nothing after
    view.dispatched("a", prompt(3), "load", 20.0)
    assert replica.awaited(15.0) == 3.0 and replica.awaited(17.0) == 5.0  # counted again from the clock's new reading


def test_a_prompt_sent_counts_as_held_from_its_first_token_there() -> None:
    """No server holds a prompt for another request before it has prefilled it: a second request
    sent beside the first on the same prompt is costed cold (on the real fleet it reused 5-10 of
    ~600 tokens, and prefilled beside the first on the same core). From the first token on, the
    prompt is held; a prefix held before the first request came still counts throughout."""
    view = one_replica()
    first = view.dispatched("a", prompt(1), "load", 10.0)
    assert view.views(prompt(1).blocks, 10.5)[0].held == 0
    beside = view.dispatched("a", prompt(1), "prefix", 10.5)
    assert (beside.held, beside.new_tokens) == (0, prompt(1).prompt_tokens)
    longer = Ask(prompt(1).blocks + (77,), prompt(1).prompt_tokens + BLOCK_TOKENS, prompt(1).prompt_chars + BLOCK_CHARS)
    view.prefilled("a", first, 14.0)
    assert view.views(prompt(1).blocks, 14.0)[0].held == BLOCKS  # the one sent beside it is not needed for that
    continued = view.dispatched("a", longer, "prefix", 14.5)
    assert continued.held == BLOCKS and view.views(longer.blocks, 15.0)[0].held == BLOCKS  # its own new block not yet
    view.finished("a", 16.0, False, expected=continued)  # failed before its first token: nothing more is coming
    assert view.views(longer.blocks, 16.0)[0].held == BLOCKS + 1


@pytest.mark.parametrize("ahead", [0.0, 1000.0])
def test_a_view_told_only_of_ends_takes_a_prompt_as_prefilled_once_the_work_queued_there_could_be(ahead: float) -> None:
    """The pool's object hears of a request when it ends, not at its first token: it takes the
    request's new blocks as prefilled once the prefill queued on the replica when it was sent,
    its own included, could be done at the replica's speed as measured now (the pool's median
    where the replica has none); before any is measured, once the request ends."""
    view = PoolView(PoolConfig("gpu", ("a", "b")), first_tokens=False)
    view.replicas["a"].sent_new = ahead
    sent = view.dispatched("a", prompt(1), "load", 10.0)
    assert view.views(prompt(1).blocks, 1e9)[0].held == 0  # nothing measured: pending until it ends
    view.replicas["b"].prefill_s = 0.01  # measured elsewhere meanwhile
    done_at = 10.0 + (ahead + prompt(1).prompt_tokens) * 0.01
    assert view.views(prompt(1).blocks, done_at - 0.01)[0].held == 0
    assert view.views(prompt(1).blocks, done_at + 0.01)[0].held == BLOCKS
    assert view.dispatched("a", prompt(1), "prefix", done_at + 0.01).held == BLOCKS  # sent again: reused, not pending anew
    view.replicas["a"].prefill_s = 0.02  # its own, slower: the prompt is not there yet
    assert view.views(prompt(1).blocks, done_at + 0.01)[0].held == 0
    view.finished("a", done_at, True, expected=sent)
    assert view.views(prompt(1).blocks, done_at)[0].held == BLOCKS
