"""`wrangler deploy --dry-run` is the real check of wrangler.toml and of what ships."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from edgellm.config import Config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wrangler = ROOT / "node_modules" / ".bin" / "wrangler"
    assert wrangler.exists(), "run `make setup-test` (npm install) first"
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        [str(wrangler), "deploy", "--dry-run", "--outdir", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**__import__("os").environ, "WRANGLER_SEND_METRICS": "false", "CI": "true"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def test_bundle_holds_the_worker_code_only(bundle: Path) -> None:
    files = sorted(str(p.relative_to(bundle)) for p in bundle.rglob("*.py"))
    assert "entry.py" in files
    assert "edgellm/app.py" in files
    for name in files:
        assert name == "entry.py" or name.startswith("edgellm/"), name
        assert "edgellm_local" not in name and "tests" not in name and "bench" not in name
    text = "\n".join((bundle / f).read_text() for f in files)
    for forbidden in ("xllamacpp", "uvicorn", "sqlite3", "edgellm_local", "pytest"):
        assert f"import {forbidden}" not in text and f"from {forbidden}" not in text, forbidden


def test_core_never_imports_a_runtime() -> None:
    """The core runs in CPython and Pyodide alike: only the adapter may import js/pyodide/workers."""
    import ast

    core = ROOT / "src" / "edgellm"
    banned = {"js", "pyodide", "workers", "sqlite3", "socket", "edgellm_local", "xllamacpp"}
    for path in core.rglob("*.py"):
        if path.parent.name == "runtime" and path.name.startswith("pyodide"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            for name in names:
                assert name.split(".")[0] not in banned, f"{path.relative_to(ROOT)} imports {name}"


def test_no_layer_imports_a_handler_module() -> None:
    """The pipeline's layers (`edgellm.pipeline`) run around every handler and know none: no layer
    reaches a module that holds a route's handler, directly or through what it imports."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_import_cycles import PACKAGES, import_graph

    from edgellm.app import ROUTES

    handlers = {r.handler.__module__ for r in ROUTES.routes} | {"edgellm.app"}
    graph = import_graph(PACKAGES)
    layers = [m for m in graph if m == "edgellm.pipeline" or m.startswith("edgellm.pipeline.")]
    assert len(layers) > 5
    for layer in layers:
        seen, todo = set(), [layer]
        while todo:
            module = todo.pop()
            for target in graph[module] - seen:
                assert target not in handlers, f"{layer} imports the handler module {target} (through {module})"
                seen.add(target)
                todo.append(target)


def test_wrangler_config_names_the_bindings() -> None:
    import tomllib

    config = tomllib.loads((ROOT / "wrangler.toml").read_text())
    assert config["main"] == "src/entry.py"
    assert "python_workers" in config["compatibility_flags"]
    assert config["ai"]["binding"] == "AI"
    assert config["kv_namespaces"][0]["binding"] == "CACHE"
    assert config["r2_buckets"][0]["binding"] == "ARTIFACTS"
    assert config["assets"]["directory"] == "./public"
    # the [vars] as the Worker reads them (strings through Config.from_env), not merely present
    parsed = Config.from_env(config["vars"])
    assert parsed.model == "@cf/meta/llama-2-7b-chat-int8"
    assert parsed.fallback_models == ("@cf/meta/llama-2-7b-chat-hf-lora",)
    assert parsed.cache_namespace == "default" and parsed.cache_default_ttl == 86400
    assert parsed.cache_classes == {"news": 300, "faq": 86400, "template": 604800}
