"""The fleet benchmark's and simulator's plumbing, on the tiny GGUF: every cell of a `--quick`
run answers every request through a real pool of replica processes behind `edgellm dev`, and
the simulator runs every policy and placement. (Multi-turn conversations outgrow the tiny
GGUF's 512-token context by their second turn: that workload runs with SmolLM2 only.) Their figures mean nothing here (no timings are
asserted); the benchmarks themselves are run by hand and their figures are in docs/benchmarks.md."""

from __future__ import annotations

import json
from pathlib import Path

from bench import bench_fleet, sim_fleet


def test_the_fleet_benchmark_runs_every_policy(tiny_model: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "cells.json"
    code = bench_fleet.main(["--quick", "--model", str(tiny_model), "--system-tokens", "20", "--max-tokens", "4",
                             "--workloads", "shared,saturated,slowed", "--json", str(out)])
    cells = json.loads(out.read_text())
    assert code == 0, capsys.readouterr().out
    assert {(c["policy"], c["workload"]) for c in cells} == {(p, w) for p in bench_fleet.POLICIES for w in ("shared", "saturated", "slowed")}
    assert all(c["ok"] == c["n"] > 0 and sum(c["shares"].values()) == c["ok"] for c in cells)
    assert all(set(c["shares"]) <= {"gpu-a", "gpu-b", "gpu-c"} and 0 <= c["prefix_hit_rate"] <= 1 for c in cells)
    assert all("slowed_share_before" in c for c in cells if c["workload"] == "slowed")
    # the edge's own view at the end of each cell: every replica, every request sent (and the warm-up)
    assert all(set(c["view"]) == {"gpu-a", "gpu-b", "gpu-c"} and sum(v["sent"] for v in c["view"].values()) == c["n"] + 1
               and all(v["bound"] >= 16 for v in c["view"].values()) for c in cells)


def test_the_simulator_runs_the_gateways_own_policies(capsys) -> None:  # type: ignore[no-untyped-def]
    assert sim_fleet.main(["--quick", "--workloads", "shared,slowed"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "replicas" in line and "TTFT" in line]
    assert len(lines) == 2 * (3 + len(sim_fleet.PLACEMENTS))


def test_the_simulator_runs_bounded_replica_caches(capsys) -> None:  # type: ignore[no-untyped-def]
    """The configuration docs/benchmarks.md reports for bench_fleet's fleet: three replicas of two
    slots keeping three of eight applications' prompts, one view."""
    assert sim_fleet.main(["--quick", "--replicas", "3", "--isolates", "1", "--slots", "2", "--cache-tokens", "3200",
                           "--apps", "8", "--popularity", "uniform", "--workloads", "shared", "--placements", "isolates"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "replicas" in line and "TTFT" in line]
    assert len(lines) == 4 and all("hits" in line for line in lines)
