"""The fleet benchmark's and simulator's plumbing, on the tiny GGUF: every cell of a `--quick`
run answers every request through a real pool of replica processes behind `edgellm dev`, and
the simulator runs every policy and placement. (Multi-turn conversations outgrow the tiny
GGUF's 512-token context by their second turn: that workload runs with SmolLM2 only.) Their figures mean nothing here (no timings are
asserted); the benchmarks themselves are run by hand and their figures are in docs/benchmarks.md."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench import bench_fleet, probe_replica_cache, sim_fleet


def test_the_fleet_benchmark_runs_every_policy(tiny_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "cells.json"
    code = bench_fleet.main(["--quick", "--model", str(tiny_model), "--system-tokens", "20", "--max-tokens", "4",
                             "--workloads", "shared,saturated,slowed", "--json", str(out)])
    cells = json.loads(out.read_text())
    assert code == 0, capsys.readouterr().out
    assert {(c["policy"], c["workload"]) for c in cells} == {(p, w) for p in bench_fleet.POLICIES for w in ("shared", "saturated", "slowed")}
    assert all(c["ok"] == c["n"] > 0 and sum(c["shares"].values()) == c["ok"] and c["errors"] == [] for c in cells)
    assert all(set(c["shares"]) <= {"gpu-a", "gpu-b", "gpu-c"} and 0 <= c["prefix_hit_rate"] <= 1 for c in cells)
    assert all("slowed_share_before" in c for c in cells if c["workload"] == "slowed")
    # the edge's own view at the end of each cell: every replica, every request sent (and the warm-up)
    assert all(set(c["view"]) == {"gpu-a", "gpu-b", "gpu-c"} and sum(v["sent"] for v in c["view"].values()) == c["n"] + 1
               and all(v["bound"] >= 16 for v in c["view"].values()) for c in cells)
    # what set each cell's tail: its slowest answers, slowest first, with what the replica said it reused
    for c in cells:
        slowest = c["slowest"]
        assert 0 < len(slowest) <= 3 and [o["ttft_s"] for o in slowest] == sorted((o["ttft_s"] for o in slowest), reverse=True)
        assert all(o["replica"] in c["shares"] and 0 <= o["cached"] <= o["prompt"] and 0 <= o["busy_there"] <= o["busy_fleet"] < c["n"]
                   for o in slowest)


def test_the_replica_cache_probe_runs_every_case(tiny_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "probe.json"
    code = probe_replica_cache.main(["--model", str(tiny_model), "--system-tokens", "60", "--trials", "1", "--requests", "8",
                                     "--json", str(out)])
    assert code == 0
    seen = json.loads(out.read_text())
    beside = {"beside, after its first token", "beside, cached before"}
    during = {"beside, during its prefill", "after it ended (a prompt prefilled too fast to catch)"}  # the tiny GGUF is quick
    queued = {"queued, its prompt's slot freed first", "queued, the other slot freed first"}
    assert beside <= set(seen["cases"]) and len(set(seen["cases"]) & during) == len(set(seen["cases"]) & queued) == 1
    assert len(seen["cases"]) == 4
    assert all(len(v) == 1 and 0 <= v[0][0] <= v[0][1] and v[0][1] > 0 for v in seen["cases"].values())
    assert len(seen["agrees"]) == 4 and all(len(a) == 4 and all(0 <= n <= seen["answers"][k] for n in a) for k, a in seen["agrees"].items())
    assert all(n == 8 - probe_replica_cache.APPS for n in seen["answers"].values())
    assert "queued, " in capsys.readouterr().out


def test_the_fleet_benchmark_runs_another_version_of_the_scheduler_beside_this_one(tiny_model: Path, tmp_path: Path,
                                                                                  capsys) -> None:  # type: ignore[no-untyped-def]
    """`--variant NAME=DIR`: policy `scheduler:NAME` is served by an edge run from DIR's code (here
    this checkout's own), the way a change is measured beside what it would replace."""
    out = tmp_path / "cells.json"
    here = Path(__file__).resolve().parents[2]
    code = bench_fleet.main(["--quick", "--model", str(tiny_model), "--system-tokens", "20", "--max-tokens", "4",
                             "--workloads", "shared", "--policies", "scheduler:here", "--variant", f"here={here}", "--json", str(out)])
    assert code == 0, capsys.readouterr().out
    [row] = json.loads(out.read_text())
    assert row["policy"] == "scheduler:here" and row["ok"] == row["n"] > 0
    assert sum(v["sent"] for v in row["view"].values()) == row["n"] + 1  # the variant's edge routed through the pool


def test_the_fleet_benchmark_refuses_a_policy_it_does_not_know(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    for policies in ("fastest", "scheduler:nowhere", "least-in-flight:x"):
        with pytest.raises(SystemExit) as exit_:
            bench_fleet.main(["--quick", "--policies", policies])
        assert exit_.value.code == 2 and "unknown policy" in capsys.readouterr().err
    # a variant's directory must hold code: the edge would otherwise run this checkout's, unnoticed
    for variant in (f"old={tmp_path}", f"={Path(__file__).resolve().parents[2]}", "old"):
        with pytest.raises(SystemExit) as exit_:
            bench_fleet.main(["--quick", "--policies", "scheduler:old", "--variant", variant])
        assert exit_.value.code == 2 and "src/edgellm" in capsys.readouterr().err


def test_the_simulator_runs_the_gateways_own_policies(capsys) -> None:  # type: ignore[no-untyped-def]
    assert sim_fleet.main(["--quick", "--workloads", "shared,slowed"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "replicas" in line and "TTFT" in line]
    assert len(lines) == 2 * (3 + len(sim_fleet.PLACEMENTS))


def test_a_simulated_run_repeats_exactly_and_another_seed_draws_another(capsys) -> None:  # type: ignore[no-untyped-def]
    def run(*seed: str) -> list[str]:
        assert sim_fleet.main(["--quick", "--workloads", "shared", "--policies", "least-in-flight", *seed]) == 0
        return [line.rsplit("(", 1)[0] for line in capsys.readouterr().out.splitlines() if "TTFT" in line]  # less its wall time

    assert run() == run("--seed", "1") != run("--seed", "2")


def test_the_simulator_runs_bounded_replica_caches(capsys) -> None:  # type: ignore[no-untyped-def]
    """The configuration docs/benchmarks.md reports for bench_fleet's fleet: three replicas of two
    slots keeping three of eight applications' prompts, one view."""
    assert sim_fleet.main(["--quick", "--replicas", "3", "--isolates", "1", "--slots", "2", "--cache-tokens", "3200",
                           "--apps", "8", "--popularity", "uniform", "--workloads", "shared", "--placements", "isolates"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "replicas" in line and "TTFT" in line]
    assert len(lines) == 4 and all("hits" in line and "cold" in line for line in lines)


def process_group(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (from /proc: the group is field 5 of stat)."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def test_a_run_stopped_with_sigterm_stops_its_replicas_and_edge(tiny_model: Path, tmp_path: Path) -> None:
    """A run stopped from outside (a CI timeout, `kill`, a closed terminal) takes its replicas
    and its edge with it: none is left serving, orphaned, on a shared machine."""
    root = Path(__file__).resolve().parents[2]
    run = subprocess.Popen([sys.executable, "-m", "bench.bench_fleet", "--quick", "--model", str(tiny_model), "--system-tokens", "20",
                            "--max-tokens", "4", "--workloads", "shared", "--policies", "scheduler", "--json", str(tmp_path / "cells.json")],
                           cwd=root, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while len(process_group(run.pid)) < 5:  # the bench, a cell's three replicas and its edge
            assert run.poll() is None and time.monotonic() < deadline, "the bench never started its replicas"
            time.sleep(0.05)
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) == 130  # ended as Ctrl-C ends it, through its cleanup
        assert process_group(run.pid) == []
    finally:
        if run.poll() is None or process_group(run.pid):
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(10)
