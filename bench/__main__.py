"""`python -m bench`: run every benchmark in turn, each printing its figures and ratios.

Each one also runs alone: `python -m bench.bench_gateway`, `bench.bench_cache`,
`bench.bench_artifacts`, `bench.bench_browser`, `bench.bench_device`, `bench.bench_routing`, `bench.bench_conversations`,
`bench.bench_coalescing`, `bench.bench_guardrails` (DLP detectors), `bench.bench_replay` (a streamed HIT), `bench.bench_semantic` (the semantic cache), `bench.bench_abuse`, `bench.bench_models` (the stand-in models scored on
30 questions; one not installed is skipped), `bench.count_hit` (a HIT's instructions, under valgrind).
"""

from __future__ import annotations

import subprocess
import sys

BENCHMARKS = ("bench.bench_gateway", "bench.bench_cache", "bench.bench_replay", "bench.bench_coalescing", "bench.bench_artifacts", "bench.bench_browser", "bench.bench_device",
              "bench.bench_routing", "bench.bench_conversations", "bench.bench_abuse", "bench.bench_guardrails",
              "bench.bench_semantic", "bench.bench_models", "bench.count_hit")


def main() -> int:
    failed = []
    for module in BENCHMARKS:
        print(f"\n=== {module} ===", flush=True)
        if subprocess.run([sys.executable, "-m", module]).returncode != 0:
            failed.append(module)
    if failed:
        print(f"\nmissed a target or failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
