"""The semantic cache's error bound (`cache.calibration`, through `cache.semantic.lookup`): the
Wilson interval, the verdict, a namespace that serves no semantic hit until its evidence meets
the bound (and stops again when a wrong verdict takes it over), would-be hits judged for free
while stopped, sampled checks of served hits after the response (capped per minute, on the
operator's account), the configuration and the key's own bound."""

from __future__ import annotations

from typing import Any, AsyncIterator

import pytest

from edgellm.access.keys import KeyRecord, new_key
from edgellm.cache import semantic
from edgellm.cache.policy import CachePolicy
from edgellm.cache.calibration import Calibration, Estimate, same_answer, wilson
from edgellm.caller import Principal
from edgellm.config import Config
from edgellm.generation import Finish, Generation, Token, Usage
from tests.unit.test_semantic_lookup import A, B, ask, key_of, look, make, remember, unit


@pytest.mark.parametrize(("wrong", "checks", "low", "high"), [
    (0, 0, 0.0, 1.0),
    (0, 10, 0.0, 0.27753),  # z^2 / (n + z^2)
    (5, 10, 0.23659, 0.76341),
    (1, 100, 0.00177, 0.05448),
    (10, 10, 0.72247, 1.0),
])
def test_the_wilson_interval(wrong: int, checks: int, low: float, high: float) -> None:
    assert wilson(wrong, checks) == pytest.approx((low, high), abs=5e-5)


def test_a_bound_of_two_percent_is_met_after_189_right_verdicts_and_lost_to_one_wrong() -> None:
    assert not Estimate(188, 0).serves(0.02) and Estimate(189, 0).serves(0.02)
    assert not Estimate(0, 0).serves(0.5)  # no evidence: nothing is served
    assert not Estimate(190, 1).serves(0.02)


@pytest.mark.parametrize(("cached", "fresh", "right"), [
    ("Paris.", "Paris.", True),
    ("The capital is  Paris.\n", "the capital is Paris.", True),
    ("Paris.", "Lyon.", False),
    ("Four legs.", "Four legs, usually.", False),  # another wording counts as wrong: the estimate errs high
])
def test_the_verdict_is_the_same_text(cached: str, fresh: str, right: bool) -> None:
    assert same_answer(cached, fresh) is right


async def answered(text: str) -> AsyncIterator[Any]:
    yield Token(text)
    yield Finish("stop", Usage(5, 3))


async def serve_miss(deps: Any, plan: semantic.Plan, text: str, answer: str) -> None:
    """The miss's own generation running to its end, as the exact cache's write path reads it."""
    async for _ in semantic.remembered_afterwards(deps, plan, key_of(text), 3600, answered(answer)):
        pass


async def test_semantic_hits_stop_until_the_evidence_meets_the_bound_and_stop_again_on_a_wrong_verdict() -> None:
    deps, background, _ = make({A: unit(0.0), B: unit(0.0)}, bound=0.02)
    await remember(deps, A)
    calibration = deps.state.semantic.calibration
    stopped = await look(deps, B)
    assert isinstance(stopped, semantic.Plan) and stopped.check is not None  # a would-be hit, served as a miss
    assert calibration.stopped_hits == 1
    await serve_miss(deps, stopped, B, "four")  # the real answer is the cached one: a right verdict, at no cost
    assert calibration.right == 1 and calibration.free_checks == 1
    for _ in range(187):
        plan = await look(deps, B)
        assert isinstance(plan, semantic.Plan)
        await serve_miss(deps, plan, B, "four")
    last = await look(deps, B)
    assert isinstance(last, semantic.Plan) and last.check is not None  # 188 right: the upper bound is still over 2%
    await serve_miss(deps, last, B, "four")
    assert isinstance(await look(deps, B), semantic.Hit)  # 189: served
    estimate = calibration.estimate(stopped.namespace)
    assert (estimate.checks, estimate.wrong) == (189, 0)
    estimate.checks += 1  # one more would-be hit, judged wrong
    calibration.record(stopped.namespace, stopped.check.entry, 0.9, False, semantic.MARGIN)
    assert not isinstance(await look(deps, B), semantic.Hit)
    assert calibration.raised[stopped.check.entry] >= 0.9 + semantic.MARGIN
    await background.settle()


async def test_a_wrong_verdict_makes_that_entry_stricter_than_the_score_it_was_served_at() -> None:
    deps, background, _ = make({A: unit(0.0), B: unit(0.0)})
    await remember(deps, A)
    assert isinstance(await look(deps, B), semantic.Hit)
    plan = await look(deps, A, policy=CachePolicy(read=False, write=True, ttl=60))
    assert isinstance(plan, semantic.Plan)
    entry = semantic.vector_id(plan.namespace, key_of(A).digest)
    deps.state.semantic.calibration.record(plan.namespace, entry, 0.999, False, semantic.MARGIN)
    assert not isinstance(await look(deps, B), semantic.Hit)  # its own threshold is now above 1
    await background.settle()


async def test_served_hits_are_sampled_checked_after_the_response_capped_per_minute() -> None:
    deps, background, _ = make({A: unit(0.0), B: unit(0.0)})
    deps = deps.for_request(background)
    object.__setattr__(deps, "config", Config(open_access=True, embedding_models=deps.config.embedding_models,
                                              semantic_max_error=0.5, semantic_check_rate=1.0, semantic_checks_per_minute=1))
    await remember(deps, A)
    for _ in range(10):  # evidence enough for a bound of 0.5
        deps.state.semantic.calibration.record(semantic.index_namespace("acme", key_of(A)), "other", 0.99, True, semantic.MARGIN)
    made: list[str] = []

    async def generate() -> Generation:
        made.append("check")
        return Generation("@cf/m", answered("four"))

    request, ctx, gen_request = ask(B)
    hit = await semantic.lookup(deps, request, ctx, gen_request, key_of(B), CachePolicy(read=True, write=True, ttl=3600),
                                _read, generate)
    assert isinstance(hit, semantic.Hit) and made == []  # nothing before the response
    await background.settle()
    calibration = deps.state.semantic.calibration
    assert made == ["check"] and calibration.sampled_checks == 1 and calibration.right == 11 and calibration.check_tokens == 8
    again = await semantic.lookup(deps, request, ctx, gen_request, key_of(B), CachePolicy(read=True, write=True, ttl=3600),
                                  _read, generate)
    await background.settle()
    assert isinstance(again, semantic.Hit) and made == ["check"] and calibration.capped == 1  # the minute's one check is spent
    deps.clock.advance(60)
    await semantic.lookup(deps, request, ctx, gen_request, key_of(B), CachePolicy(read=True, write=True, ttl=3600), _read, generate)
    await background.settle()
    assert made == ["check", "check"]  # a new minute, a new check
    object.__setattr__(deps, "config", Config(open_access=True, embedding_models=deps.config.embedding_models,
                                              semantic_max_error=None, semantic_check_rate=1.0))
    deps.clock.advance(60)
    await semantic.lookup(deps, request, ctx, gen_request, key_of(B), CachePolicy(read=True, write=True, ttl=3600), _read, generate)
    await background.settle()
    assert made == ["check", "check"]  # the bound off: no check is paid for
    assert deps.usage.rows and all(r.route == semantic.USAGE_ROUTE for r in deps.usage.rows)  # type: ignore[union-attr]  # no check in a tenant's usage


async def _read(deps: Any, key: Any) -> tuple[Any, int]:
    from tests.unit.test_semantic_lookup import Answer

    return Answer(), 1


def test_the_bound_is_configured_and_checked() -> None:
    assert Config().semantic_max_error == 0.02
    assert Config.from_env({"SEMANTIC_MAX_ERROR": "0.05"}).semantic_max_error == 0.05
    assert Config.from_env({"SEMANTIC_MAX_ERROR": "off"}).semantic_max_error is None
    for bad in ("0", "1", "2%", "-0.1"):
        with pytest.raises(ValueError, match="SEMANTIC_MAX_ERROR"):
            Config.from_env({"SEMANTIC_MAX_ERROR": bad})
    assert Config.from_env({"SEMANTIC_CHECK_RATE": "1"}).semantic_check_rate == 1.0
    with pytest.raises(ValueError, match="SEMANTIC_CHECK_RATE"):
        Config.from_env({"SEMANTIC_CHECK_RATE": "1.5"})
    with pytest.raises(ValueError, match="SEMANTIC_CHECKS_PER_MINUTE"):
        Config.from_env({"SEMANTIC_CHECKS_PER_MINUTE": "0"})


def test_a_key_sets_its_own_bound() -> None:
    made = new_key("acme", 0.0, semantic_max_error=0.1)
    assert KeyRecord.decode(made.record.encode()).semantic_max_error == 0.1
    with pytest.raises(ValueError, match="semantic_max_error"):
        new_key("acme", 0.0, semantic_max_error=1.5)
    deps, _, _ = make({}, bound=0.02)
    _, ctx, _ = ask(A)
    assert semantic.max_error(deps, ctx) == 0.02
    ctx.principal = Principal("acme", made.record.key_id, made.record)
    assert semantic.max_error(deps, ctx) == 0.1


def test_the_isolate_keeps_a_bounded_number_of_estimates() -> None:
    calibration = Calibration()
    for i in range(300):
        calibration.estimate(f"ns{i}")
    assert len(calibration.estimates) == 256 and "ns299" in calibration.estimates and "ns0" not in calibration.estimates


async def test_the_estimate_is_on_metrics_and_stats() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from edgellm.telemetry.exposition import TextExposition, families

    deps, _, _ = make({}, bound=0.02)
    calibration = deps.state.semantic.calibration
    for right in [True] * 9 + [False]:
        calibration.record("sc-x", "e", 0.9, right, semantic.MARGIN)
    text = TextExposition().render(families(deps))[0].decode()
    found = {f.name: f for f in text_string_to_metric_families(text)}
    rates = {s.labels["bound"]: s.value for s in found["edgellm_cache_semantic_wrong_rate"].samples}
    low, high = wilson(1, 10)
    assert rates == pytest.approx({"estimate": 0.1, "lower": low, "upper": high})
    verdicts = {s.labels["verdict"]: s.value for s in found["edgellm_cache_semantic_verdicts"].samples}
    assert verdicts == {"right": 9.0, "wrong": 1.0}
    assert [s.value for s in found["edgellm_cache_semantic_stopped_namespaces"].samples] == [1.0]
    assert calibration.to_json()["namespaces"]["sc-x"]["upper"] == pytest.approx(high, abs=1e-6)
