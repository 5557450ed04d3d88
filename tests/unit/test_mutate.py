"""`make mutate`'s plumbing, without a mutation run (too slow for the suite): which modules a
change touches, which tests are theirs, the configuration cosmic-ray is given, how survivors are
read from its session, and that make parses the target."""

from __future__ import annotations

import json
import subprocess
import tomllib
from pathlib import Path

import pytest

from edgellm_local.mutate import changed_modules, config, survivors, mirroring_tests

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_cores_modules_are_mutated() -> None:
    changed = ["src/edgellm/telemetry/metrics.py", "src/edgellm/telemetry/__init__.py", "docs/observability.md",
               "local/edgellm_local/mutate.py", "tests/unit/test_telemetry.py", "src/edgellm/app.py", "src/edgellm/app.py",
               "src/entry.py", "src/edgellm/static/page.js"]
    assert changed_modules(changed) == ["src/edgellm/app.py", "src/edgellm/telemetry/metrics.py"]


@pytest.mark.parametrize(("modules", "expected"), [
    (["src/edgellm/telemetry/metrics.py"], ["tests/unit/test_telemetry.py"]),  # no test_metrics.py: its package's
    (["src/edgellm/access/analytics_sql.py"], ["tests/unit/test_analytics_sql.py", "tests/unit/test_access.py"]),
    (["src/edgellm/stream.py"], ["tests/unit/test_stream.py"]),  # a top-level module has no package test
    (["src/edgellm/telemetry/metrics.py", "src/edgellm/telemetry/exposition.py"], ["tests/unit/test_telemetry.py"]),  # once
    (["src/edgellm/nowhere.py"], []),
])
def test_a_modules_tests_are_the_unit_tests_that_mirror_it(modules: list[str], expected: list[str]) -> None:
    existing = [str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "unit").glob("test_*.py")]
    assert mirroring_tests(modules, existing) == expected


def test_the_configuration_is_cosmic_rays() -> None:
    parsed = tomllib.loads(config(["src/edgellm/telemetry/metrics.py"], ["tests/unit/test_telemetry.py"], 30, "/py"))["cosmic-ray"]
    assert parsed["module-path"] == ["src/edgellm/telemetry/metrics.py"] and parsed["timeout"] == 30.0
    assert parsed["test-command"].startswith("/py -m pytest -x -q") and parsed["test-command"].endswith(" tests/unit/test_telemetry.py")
    assert parsed["distributor"]["name"] == "local"
    import re

    excluded = re.compile("|".join(parsed["filters"]["operators-filter"]["exclude-operators"]))  # as cr-filter-operators joins them
    assert excluded.match("core/ReplaceBinaryOperator_Add_BitXor") and excluded.match("core/ReplaceBinaryOperator_BitOr_Add")
    assert not excluded.match("core/ReplaceBinaryOperator_Add_Sub") and not excluded.match("core/NumberReplacer")


def test_survivors_are_read_from_the_session() -> None:
    def line(job: str, outcome: str | None, worker: str = "normal") -> str:
        item = {"job_id": job, "mutations": [{"module_path": "src/edgellm/x.py", "operator_name": "core/NumberReplacer",
                                              "occurrence": 0, "start_pos": [12, 4], "end_pos": [12, 5]}]}
        result = None if outcome is None and worker == "normal" else {"worker_outcome": worker, "test_outcome": outcome,
                                                                       "output": "", "diff": f"--- {job}"}
        return json.dumps([item, result])

    dump = "\n".join([line("a", "killed"), line("b", "survived"), line("c", None), line("d", None, "skipped"), ""])
    found, run, pending = survivors(dump)
    assert (run, pending) == (2, 1)
    assert found == [{"module": "src/edgellm/x.py", "operator": "core/NumberReplacer", "line": "12", "diff": "--- b"}]


def test_make_parses_the_target_and_passes_the_selection() -> None:
    out = subprocess.run(["make", "-n", "mutate", "MODULES=src/edgellm/telemetry/metrics.py", "TESTS=tests/unit/test_telemetry.py",
                          "MUTATE_BUDGET=5"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert ('-m edgellm_local.mutate --modules "src/edgellm/telemetry/metrics.py" --tests "tests/unit/test_telemetry.py" '
            "--timeout 60 --budget 5") in out
