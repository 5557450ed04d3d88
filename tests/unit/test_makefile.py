"""`make dev` twice in a row: the first run installs (pip, npm, the Pyodide vendor step, the
default model's publish), the second installs nothing and only starts the edge. The real Makefile
runs in a scratch copy of the project whose `.venv/bin` tools, `npm` and `chromium` only record
how they were called, so the test checks make's decisions, not the registries."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = ["Makefile", "pyproject.toml", "package.json", "package-lock.json", "pyodide-wheels.txt", "public/vendor/pyodide.LICENSE",
         "public/vendor/wllama.LICENSE"]

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
"""
# `.venv/bin/python -c ...` writes the wheel index (run it for real) or names the model (any path will do)
PYTHON = RECORDER + """if [ "$1" = "-c" ]; then case "$2" in *index.json*) exec "{real}" "$@";; *) echo /fake/model.gguf;; esac; fi
"""
EDGELLM = RECORDER + """if [ "$1" = publish ]; then mkdir -p .state; fi
"""
NPM = RECORDER + """if [ "$1" = pack ] && [ "${{3#@wllama/wllama@}}" != "$3" ]; then cp "{wllama}" wllama-wllama-"${{3#@wllama/wllama@}}".tgz; exit 0; fi
if [ "$1" = pack ]; then mkdir -p p/package/dist && echo x > p/package/dist/transformers.min.js && echo x > p/package/LICENSE && \
  tar czf huggingface-transformers-"${{3#*@*@}}".tgz -C p package && rm -rf p && exit 0; fi
mkdir -p node_modules/pyodide && for f in pyodide.mjs pyodide.asm.js pyodide.asm.wasm python_stdlib.zip pyodide-lock.json; do echo x > node_modules/pyodide/$f; done
"""


def wllama_tarball(project: Path) -> Path:
    """A stand-in for wllama's npm tarball, with the Makefile's pinned SHA-256 set to its own, so
    the real recipe (checksum, unpack, licence check) runs on it."""
    package = project / "wllama-src" / "package"
    (package / "esm" / "wasm").mkdir(parents=True)
    (package / "esm" / "index.js").write_text("x\n")
    (package / "esm" / "wasm" / "wllama.wasm").write_text("x\n")
    shutil.copy2(project / "public" / "vendor" / "wllama.LICENSE", package / "LICENCE")
    tarball = project / "wllama.tgz"
    subprocess.run(["tar", "czf", str(tarball), "-C", str(package.parent), "package"], check=True)
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    makefile = project / "Makefile"
    makefile.write_text(re.sub(r"^WLLAMA_SHA256 := \w+$", f"WLLAMA_SHA256 := {digest}", makefile.read_text(), flags=re.M))
    return tarball


def tool(path: Path, script: str) -> None:
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    if shutil.which("make") is None:
        pytest.fail("make is missing (it is how the README's two commands run)")
    for name in FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, tmp_path / name)
    log = tmp_path / "calls.log"
    bin_dir, path_dir = tmp_path / ".venv" / "bin", tmp_path / "path"
    bin_dir.mkdir(parents=True)
    path_dir.mkdir()
    tool(bin_dir / "python", PYTHON.format(log=log, real=sys.executable))
    tool(bin_dir / "pip", RECORDER.format(log=log))
    tool(bin_dir / "edgellm", EDGELLM.format(log=log))
    tool(path_dir / "npm", NPM.format(log=log, wllama=wllama_tarball(tmp_path)))
    tool(path_dir / "chromium", RECORDER.format(log=log))
    return tmp_path


def make(project: Path, *targets: str) -> list[str]:
    log = project / "calls.log"
    log.write_text("")
    env = {**os.environ, "PATH": f"{project / 'path'}:{os.environ['PATH']}"}
    done = subprocess.run(["make", "--no-print-directory", *targets], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return log.read_text().splitlines()


def test_a_second_make_dev_installs_nothing(project: Path) -> None:
    first = make(project, "dev")
    assert any(c.startswith("pip install -q -e .[local]") for c in first), first
    assert "npm install --no-audit --no-fund --silent" in first
    assert any(c.startswith("pip download") for c in first) and any(c.startswith("edgellm publish") for c in first)
    assert (project / "public" / "vendor" / "wheels" / "index.json").exists()
    assert (project / "public" / "vendor" / "wllama" / "wllama.wasm").exists()  # checked against its pinned SHA-256
    assert first[-1].startswith("edgellm dev --port 8787")

    second = make(project, "dev")
    assert second == [c for c in first if c.startswith("edgellm dev")] == [first[-1]]


def test_setup_test_reinstalls_only_what_changed(project: Path) -> None:
    first = make(project, "setup-test")
    assert any(c.startswith("npm pack --silent @huggingface/transformers@") for c in first), first
    assert [c for c in make(project, "setup-test") if not c.startswith("chromium")] == []
    os.utime(project / "pyproject.toml")  # a changed dependency list: pip runs again, npm does not
    again = make(project, "setup-test")
    assert any(c.startswith("pip install") for c in again) and not any(c.startswith("npm") for c in again)
