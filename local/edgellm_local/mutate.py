"""`make mutate`: mutation testing of the modules a change touches, with their own tests.

Each module (default: the `.py` files under `src/edgellm` that differ from `git merge-base HEAD
main`) is mutated one small change at a time by cosmic-ray (an operator swapped, a constant moved,
a condition negated), and its own unit tests run against each mutant: a mutant they pass survived,
a change to the code no test noticed. The tests of `src/edgellm/<package>/<module>.py` are
`tests/unit/test_<module>.py` and `tests/unit/test_<package>.py`, those that exist.

Everything runs in a scratch copy of the project (the files git knows: a mutant is written to the copy's
file, never to the work tree, so an interrupted run leaves nothing mutated), with `PYTHONPATH` putting the
copy's sources before the editable install. The run is bounded: each mutant's tests by
`--timeout` (a mutant that makes them hang is killed), the whole run by `--budget`, after which
what was not reached is reported as not run. Survivors are printed with their diffs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path, PurePosixPath
from typing import Iterable

ROOT = Path(__file__).resolve().parents[2]
CORE = "src/edgellm/"


def changed_modules(paths: Iterable[str]) -> list[str]:
    """Of the paths a change touches (as `git diff --name-only` gives them), the core's modules:
    `.py` files under `src/edgellm`, without package markers (nothing there to mutate)."""
    out = []
    for path in paths:
        p = PurePosixPath(path.strip())
        if str(p).startswith(CORE) and p.suffix == ".py" and p.name != "__init__.py" and str(p) not in out:
            out.append(str(p))
    return sorted(out)


def mirroring_tests(modules: Iterable[str], existing: Iterable[str]) -> list[str]:
    """The unit tests that mirror `modules`: `tests/unit/test_<module>.py`, and for a module in
    a package, `tests/unit/test_<package>.py`; only those in `existing`."""
    have, out = set(existing), []
    for module in modules:
        p = PurePosixPath(module)
        names = [f"tests/unit/test_{p.stem}.py"]
        if p.parent.name != "edgellm":
            names.append(f"tests/unit/test_{p.parent.name}.py")
        out += [n for n in names if n in have and n not in out]
    return out


# cosmic-ray replaces a binary operator by each of the eleven others; a test that tells `+` from
# `-`, `*` and `/` tells it from the rest, so only those four stay (as mutmut's one swap per
# operator), which takes a module's mutants from ~630 to ~330. `|` is not mutated at all: in this
# code it is nearly always a type (`str | None`) in an annotation that `from __future__ import
# annotations` never evaluates, so every such mutant survives and says nothing.
EXCLUDED_OPERATORS = (r"core/ReplaceBinaryOperator_\w+_(Pow|LShift|RShift|BitOr|BitAnd|BitXor|Mod|FloorDiv)$",
                      r"core/ReplaceBinaryOperator_BitOr_\w+$")


def config(modules: list[str], tests: list[str], timeout: float, python: str = sys.executable, pytest_args: str = "") -> str:
    """cosmic-ray's configuration (TOML) for one run."""
    command = f"{python} -m pytest -x -q -p no:cacheprovider -p asyncio -p timeout {pytest_args} ".replace("  ", " ") + " ".join(tests)
    return "\n".join([
        "[cosmic-ray]",
        f"module-path = {json.dumps(modules)}",
        f"timeout = {float(timeout)}",
        "excluded-modules = []",
        f"test-command = {json.dumps(command)}",
        "",
        "[cosmic-ray.distributor]",
        'name = "local"',
        "",
        "[cosmic-ray.filters.operators-filter]",
        f"exclude-operators = {json.dumps(list(EXCLUDED_OPERATORS))}",
        "",
    ])


def survivors(dump: str) -> tuple[list[dict[str, str]], int, int]:
    """From `cosmic-ray dump`'s lines: the survivors (module, operator, line, diff), how many
    mutants were run, and how many were not reached."""
    out, run, pending = [], 0, 0
    for line in dump.splitlines():
        if not line.strip():
            continue
        item, result = json.loads(line)
        if result is None:
            pending += 1
            continue
        if result.get("worker_outcome") == "skipped":  # an excluded operator
            continue
        run += 1
        if result.get("worker_outcome") == "normal" and result.get("test_outcome") == "survived":
            (mutation,) = item["mutations"][:1] or [{}]
            out.append({"module": mutation.get("module_path", ""), "operator": mutation.get("operator_name", ""),
                        "line": str((mutation.get("start_pos") or [0])[0]), "diff": result.get("diff") or ""})
    return out, run, pending


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def default_modules() -> list[str]:
    base = _git("merge-base", "HEAD", "main").strip()
    changed = _git("diff", "--name-only", base).splitlines() + _git("ls-files", "--others", "--exclude-standard").splitlines()
    return changed_modules(p for p in changed if (ROOT / p).is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make mutate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", default="", help="space-separated module paths (default: src/edgellm files changed since main)")
    parser.add_argument("--tests", default="", help="space-separated test files (default: each module's own unit tests)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for one mutant's tests (past it: killed)")
    parser.add_argument("--budget", type=float, default=1800.0, help="seconds for the whole run (past it: the rest is not run)")
    parser.add_argument("--pytest-args", default="", help="more pytest options for each run (e.g. --noconftest)")
    args = parser.parse_args(argv)
    modules = args.modules.split() or default_modules()
    if not modules:
        print("make mutate: no module under src/edgellm changed since main (MODULES= names some)")
        return 0
    existing = [str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "unit").glob("test_*.py")]
    tests = args.tests.split() or mirroring_tests(modules, existing)
    if not tests:
        print(f"make mutate: no unit test mirrors {' '.join(modules)} (TESTS= names them)", file=sys.stderr)
        return 2
    print(f"mutating {' '.join(modules)}\nwith {' '.join(tests)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="edgellm-mutate-") as scratch:
        work = Path(scratch)
        for name in _git("ls-files", "--cached", "--others", "--exclude-standard").splitlines():  # the project's files, as a clone has them
            if (ROOT / name).is_file():
                (work / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, work / name)
        (work / "mutate.toml").write_text(config(modules, tests, args.timeout, pytest_args=args.pytest_args))
        # every module compiled once, checking its source's hash on import: cosmic-ray runs the tests
        # with PYTHONDONTWRITEBYTECODE, and a mutant written within the same second as its module's
        # pyc, at the same size, would otherwise be read from that stale pyc
        subprocess.run([sys.executable, "-m", "compileall", "-q", "--invalidation-mode", "checked-hash", "src", "local", "tests"],
                       cwd=work, check=True)
        # only the plugins the unit tests use (auto-loading every installed one, Playwright's among
        # them, took most of each run's time)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(work / p) for p in ("src", "local", "")),
               "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        cosmic = [sys.executable, "-m", "cosmic_ray.cli"]
        subprocess.run([*cosmic, "init", "mutate.toml", "session.sqlite"], cwd=work, env=env, check=True)
        subprocess.run([str(Path(sys.executable).parent / "cr-filter-operators"), "session.sqlite", "mutate.toml"], cwd=work, env=env, check=True)
        baseline = subprocess.run([*cosmic, "baseline", "mutate.toml"], cwd=work, env=env)
        if baseline.returncode != 0:
            print("make mutate: the tests fail on the unmutated code; fix them first", file=sys.stderr)
            return 2
        started = time.monotonic()
        runner = subprocess.Popen([*cosmic, "exec", "mutate.toml", "session.sqlite"], cwd=work, env=env, start_new_session=True)
        try:
            runner.wait(timeout=args.budget)
        except subprocess.TimeoutExpired:
            os.killpg(runner.pid, 15)
            runner.wait()
        dump = subprocess.run([*cosmic, "dump", "session.sqlite"], cwd=work, env=env, check=True, capture_output=True, text=True).stdout
    found, run, pending = survivors(dump)
    for s in found:
        print(f"\nSURVIVED {s['module']}:{s['line']} ({s['operator']})\n{s['diff'].rstrip()}")
    print(f"\n{run} mutants run in {time.monotonic() - started:.0f} s: {run - len(found)} killed, {len(found)} survived"
          + (f"; {pending} not run (past --budget)" if pending else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
