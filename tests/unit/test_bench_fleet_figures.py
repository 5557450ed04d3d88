"""How the fleet benchmark reads its own cells: which answers set the tail and what was running
beside them, how far a ratio of percentiles from one run can be trusted, and a variant's cell
against this code's, and the load (b)'s conversations offer."""

from __future__ import annotations

import asyncio
import math
import random
import signal

import httpx
import pytest

from bench.bench_fleet import Cell, Outcome, against_variants, conversation_plan, errors, one, pooled, ratio_interval, slowest, targets
from bench.edge_process import interrupt_on_stop_signals


def answer(ttft: float, sent_at: float, latency: float, replica: str, cached: int = 0) -> Outcome:
    return Outcome(True, ttft, latency, replica, sent_at, "load", cached=cached, prompt=600)


def test_the_slowest_answers_come_with_what_was_running_beside_them() -> None:
    outcomes = [answer(9.0, 10.0, 12.0, "gpu-a"),  # the slowest: sent while two ran on gpu-a, one on gpu-b
                answer(1.0, 5.0, 6.0, "gpu-a"),  # 5..11: running at 10
                answer(2.0, 9.5, 3.0, "gpu-a"),  # 9.5..12.5: running at 10
                answer(3.0, 8.0, 4.0, "gpu-b", cached=590),  # 8..12: running at 10
                answer(0.5, 10.5, 1.0, "gpu-c"),  # sent after it: not counted
                answer(4.0, 1.0, 9.0, "gpu-c")]  # 1..10: ended as it was sent
    worst, second, third = slowest(outcomes)
    assert (worst["ttft_s"], worst["replica"], worst["busy_there"], worst["busy_fleet"]) == (9.0, "gpu-a", 2, 3)
    assert (second["ttft_s"], second["replica"], second["busy_there"], second["busy_fleet"]) == (4.0, "gpu-c", 0, 0)
    assert (third["ttft_s"], third["cached"], third["prompt"]) == (3.0, 590, 600)
    assert len(slowest(outcomes, count=5)) == 5 and slowest([]) == []


def test_a_ratio_of_percentiles_comes_with_its_interval() -> None:
    assert ratio_interval([100.0] * 50, [200.0] * 50, 99) == (0.5, 0.5)  # nothing to resample: exact
    assert all(math.isnan(v) for v in ratio_interval([], [1.0], 50))
    same = [float(v) for v in range(1, 97)]
    low, high = ratio_interval(same, list(reversed(same)), 99)
    assert low < 1.0 < high  # two equal cells: the interval holds 1
    assert ratio_interval(same, same, 99) == ratio_interval(same, same, 99)  # seeded: it repeats
    doubled = [2 * v for v in same]
    low, high = ratio_interval(doubled, same, 50)
    assert 1.0 < low <= 2.0 <= high  # twice as slow: the interval holds 2 and not 1


def test_a_variant_is_read_against_the_same_policy_on_the_same_workload() -> None:
    def row(p50: float, p99: float, rps: float, hits: float) -> dict[str, object]:
        return {"ttft_p50_ms": p50, "ttft_p99_ms": p99, "throughput_rps": rps, "prefix_hit_rate": hits,
                "ttfts_ms": [p50] * 50 + [p99] * 2}

    rows = {("scheduler", "shared"): row(300, 9000, 0.5, 0.8), ("scheduler:old", "shared"): row(600, 9000, 0.4, 0.6),
            ("scheduler:old", "unique"): row(1, 1, 1, 0),  # no scheduler cell of its own workload: nothing to compare
            ("least-in-flight", "shared"): row(1, 1, 1, 0)}
    [line] = against_variants(rows)
    assert line.startswith("(shared) scheduler over scheduler:old: TTFT p50 0.50x")
    assert "p99 1.00x" in line and "answers/s 0.50 against 0.40" in line and "prefix hits 80% against 60%" in line


def test_throughput_is_judged_where_the_fleet_is_full_and_the_tail_at_70_percent() -> None:
    def row(p50: float, p99: float, rps: float) -> dict[str, object]:
        return {"ttft_p50_ms": p50, "ttft_p99_ms": p99, "throughput_rps": rps, "ttfts_ms": [p50] * 50 + [p99] * 2}

    rows = {("scheduler", "turns"): row(400, 4000, 0.3), ("round-robin", "turns"): row(4000, 6000, 0.3),
            ("least-in-flight", "turns"): row(600, 7000, 0.3),
            ("scheduler", "turns-saturated"): row(900, 12000, 1.5), ("round-robin", "turns-saturated"): row(5800, 16000, 0.6),
            ("scheduler", "saturated"): row(5000, 17000, 0.7), ("round-robin", "saturated"): row(6800, 14000, 0.62)}
    verdicts = {name: (met, figure) for name, met, figure in targets(rows)}
    assert verdicts["(turns) TTFT p50 <= 0.5x round-robin"][0] is True
    assert verdicts["(turns) TTFT p99 <= 0.7x least-in-flight"][0] is True
    assert verdicts["(turns) throughput >= 1.2x round-robin, at full load (turns-saturated)"] == (True, "2.50x")
    assert verdicts["(shared) throughput >= 1.2x round-robin, at full load (saturated)"] == (False, "1.13x")
    # at 70% every policy serves the arrivals: no throughput verdict from those cells, none without a baseline
    assert not any("throughput" in name and "full load" not in name for name in verdicts)
    assert not any(name.startswith("(shared) TTFT") for name in verdicts)


def offered(plans: list[list], rate: float, service: float, window: float, windows: int) -> list[float]:
    """Turns sent per second in consecutive windows, as a share of `rate`, averaged over plans
    (each turn sent `service` seconds after the last was sent, plus the user's reading time)."""
    counts = [0] * windows
    for plan in plans:
        for conversation in plan:
            at = conversation.start
            for reading in conversation.reading:
                if at < window * windows:
                    counts[int(at // window)] += 1
                at += service + reading
    return [c / len(plans) / window / rate for c in counts]


def test_conversations_offer_the_calibrated_rate_and_not_a_burst_of_first_turns() -> None:
    rate, n = 0.6, 96
    plans = [conversation_plan(n, rate, random.Random(seed)) for seed in range(300)]
    assert all(sum(len(c.reading) for c in plan) == n and len({c.index for c in plan}) == n // 4 for plan in plans)
    assert all(len(c.words) == len(c.reading) == 4 for c in plans[0])
    # the run's middle (after the first conversations overlap, before the last ones close) holds
    # near the calibrated rate, and no stretch of it goes far above
    shares = offered(plans, rate, service=1.2, window=16.0, windows=10)
    assert max(shares) <= 1.1, shares
    assert min(shares[2:8]) >= 0.8, shares
    # first turns open at a quarter of the rate: the cold prompts are spread over the run
    firsts = [c.start for plan in plans for c in plan]
    assert sum(1 for t in firsts if t < 40) / len(plans) < 0.3 * 40 * 1.2
    # the same seed draws the same conversations; the plan does not depend on answers' timing
    assert conversation_plan(n, rate, random.Random(7)) == conversation_plan(n, rate, random.Random(7))
    # at full load (no rate) nobody waits: every conversation is ready at once and no one reads
    closed = conversation_plan(n, 0.0, random.Random(7))
    assert len(closed) == n // 4 and all(c.start == 0 and c.reading == [0, 0, 0, 0] for c in closed)


def test_a_policy_run_more_than_once_is_judged_on_its_cells_pooled() -> None:
    """Cells of one policy interleaved with another version's (new, old, old, new) count together:
    the second cell must not stand in for both."""
    first = Cell("scheduler", "shared", [answer(t, i, t + 1, "gpu-a") for i, t in enumerate([1.0] * 95 + [20.0])], 100.0, 600.0, 1000.0)
    second = Cell("scheduler", "shared", [answer(t, i, t + 1, "gpu-b") for i, t in enumerate([1.0] * 96)], 50.0, 300.0, 1000.0)
    both = pooled([first, second]).summary()
    assert (both["n"], both["ok"], sorted(both["ttfts_ms"])[-1]) == (192, 192, 20000)
    assert both["throughput_rps"] == 192 / 150 and both["prefix_hit_rate"] == 900 / 2000
    assert both["shares"] == {"gpu-a": 96, "gpu-b": 96}
    assert pooled([first]) is first


def test_a_slowed_replicas_share_over_pooled_cells_counts_each_against_its_own_moment() -> None:
    """Two (d) cells slowed at different moments, each a different replica: the pooled share is
    each answer judged by its own cell's moment and replica, the counts summed."""
    first = Cell("scheduler", "slowed", [answer(1.0, t, 2.0, "gpu-a" if t in (0.0, 5.0, 30.0) else "gpu-b") for t in (0.0, 5.0, 12.0, 15.0, 30.0, 40.0)],
                 50.0, 0.0, 1.0, slowed_at=10.0, slowed="gpu-a")
    second = Cell("scheduler", "slowed", [answer(1.0, t, 2.0, "gpu-c" if t < 100.0 else "gpu-a") for t in (90.0, 110.0, 120.0, 130.0)],
                  50.0, 0.0, 1.0, slowed_at=100.0, slowed="gpu-c")
    alone = first.summary()
    assert (alone["slowed_share_before"], alone["slowed_share_first_10s"], alone["slowed_share_after_10s"]) == (1.0, 0.0, 0.5)
    both = pooled([first, second]).summary()
    # before: a, a (the first's) and c (the second's): 3 of 3; first 10 s: b, b: 0 of 2; after: a, b
    # (the first's) and a, a, a (the second's, whose slowed replica is c): 1 of 5
    assert (both["slowed_share_before"], both["slowed_share_first_10s"], both["slowed_share_after_10s"]) == (1.0, 0.0, 0.2)
    assert both["sent_after_10s"] == 5
    assert "slowed_share_before" not in pooled([Cell("scheduler", "shared", [answer(1.0, 0.0, 2.0, "gpu-a")])]).summary()


def streamed(status: int, body: str) -> Outcome:
    """One request of the bench's, answered by a server that sends `body` with `status`."""
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body.encode(), headers={"x-edgellm-route": "origin; origin=gpu-b; reason=prefix"})

    async def run() -> Outcome:
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer), base_url="http://edge") as client:
            return await one(client, {"messages": []}, {}, 0.0)

    return asyncio.run(run())


def test_each_way_a_request_goes_unanswered_is_named() -> None:
    chunk = 'data: {"choices": [{"delta": {"content": "hi"}}]}\n\n'
    answered = streamed(200, chunk + "data: [DONE]\n\n")
    assert answered.ok and answered.text == "hi" and answered.error == "" and answered.replica == "gpu-b"
    cut = streamed(200, chunk)
    assert not cut.ok and cut.error == "200: the stream ended without [DONE]"
    empty = streamed(200, "data: [DONE]\n\n")
    assert not empty.ok and empty.error == "200: an answer with no content"
    refused = streamed(503, '{"error": {"message": "every replica is down"}}')
    assert not refused.ok and refused.error.startswith("503: ") and "every replica is down" in refused.error


def test_a_cells_losses_are_grouped_by_cause_with_how_many_and_when() -> None:
    def lost(sent_at: float, error: str, replica: str = "?") -> Outcome:
        return Outcome(False, 30.0, 30.0, replica, sent_at, error=error)

    outcomes = [answer(1.0, 0.5, 2.0, "gpu-a"), lost(40.0, "503: start_timeout"), lost(12.5, "503: start_timeout", "gpu-c"),
                lost(20.0, ""), lost(33.0, "200: the stream ended without [DONE]", "gpu-a")]
    assert errors(outcomes) == [
        {"error": "503: start_timeout", "count": 2, "first_sent_at_s": 12.5, "replica": "gpu-c", "after_s": 30.0},
        {"error": "?", "count": 1, "first_sent_at_s": 20.0, "replica": "?", "after_s": 30.0},
        {"error": "200: the stream ended without [DONE]", "count": 1, "first_sent_at_s": 33.0, "replica": "gpu-a", "after_s": 30.0}]
    assert errors([answer(1.0, 0.5, 2.0, "gpu-a")]) == []
    cell = Cell("scheduler", "shared", outcomes, span_s=50.0)
    assert cell.summary()["errors"] == errors(outcomes) and cell.summary()["ok"] == 1


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_interrupts_a_benchmark_as_ctrl_c_does(stop_signal: signal.Signals) -> None:
    """So every `finally` that stops a replica or an edge runs (the end-to-end case, a real run's
    process group left empty, is tests/edge/test_fleet_bench.py)."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        for s in before:  # a signal left unhandled must fail this test, not end the test run
            signal.signal(s, lambda signum, frame: None)
        interrupt_on_stop_signals()
        with pytest.raises(KeyboardInterrupt, match=f"signal {int(stop_signal)}"):
            signal.raise_signal(stop_signal)
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
