"""No import circle in the core (src/) or the local edge (local/), read from the source with `ast`.

A circle held up by an import inside a function (or by import order) works until someone moves a
line. Every import counts, at module level, inside a function, and
under `if TYPE_CHECKING:`: a circle of types is still two modules that cannot be read (or moved)
one without the other, and becomes a real one the day a type is needed at run time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"edgellm": ROOT / "src" / "edgellm", "edgellm_local": ROOT / "local" / "edgellm_local"}


def _modules(packages: dict[str, Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in packages.values():
        for path in root.rglob("*.py"):
            name = ".".join(path.relative_to(root.parent).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, however deep, `if TYPE_CHECKING:` bodies included."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (a `from pkg import name` counts `pkg.name`
    when that is a module, else `pkg`)."""
    modules = _modules(packages)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
                continue
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets.add(module)
            targets |= {f"{module}.{alias.name}" for alias in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_in_src_or_local() -> None:
    found = circles(import_graph(PACKAGES))
    assert found == [], "import circles (every import counts: inside functions and under TYPE_CHECKING too):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return {"pkg": root}


def test_a_circle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    packages = _package(tmp_path, {
        "a.py": "from .b import x\n",
        "b.py": "x = 1\ndef f():\n    from .a import y\n",
        "c.py": "from . import a\n",
    })
    assert circles(import_graph(packages)) == [["pkg.a", "pkg.b"]]


def test_an_import_under_type_checking_is_a_circle_too(tmp_path: Path) -> None:
    packages = _package(tmp_path, {
        "a.py": "from .b import x\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import y\nx = 1\n",
        "sub/__init__.py": "",
        "sub/c.py": "from ..a import x\nimport typing\nif typing.TYPE_CHECKING:\n    from ..d import z\n",
        "d.py": "from .sub import c\n",
    })
    assert circles(import_graph(packages)) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.sub.c"]]


def package_imports(graph: dict[str, set[str]], depth: int = 2) -> dict[str, set[str]]:
    """The graph folded to packages (`edgellm.access`, `edgellm.telemetry`): which package imports
    which other, through any of its modules."""
    def package(module: str) -> str:
        return ".".join(module.split(".")[:depth])

    folded: dict[str, set[str]] = {}
    for module, targets in graph.items():
        folded.setdefault(package(module), set()).update(package(t) for t in targets if package(t) != package(module))
    return folded


@pytest.mark.parametrize("one,other", [
    ("edgellm.access", "edgellm.telemetry"),  # the access log line names its trace; the telemetry layer writes the line
    ("edgellm.deps", "edgellm.telemetry.exposition"),  # the bundle of ports, and the metrics writer that reads it
])
def test_these_two_never_import_each_other(one: str, other: str) -> None:
    graph = import_graph(PACKAGES)
    depth = max(one.count("."), other.count(".")) + 1
    folded = package_imports(graph, depth)
    both = (other in folded.get(one, set()), one in folded.get(other, set()))
    assert both != (True, True), f"{one} and {other} import each other"


def test_a_package_loop_is_found(tmp_path: Path) -> None:
    packages = _package(tmp_path, {
        "one/__init__.py": "", "one/a.py": "from ..two import b\n",
        "two/__init__.py": "", "two/b.py": "x = 1\n", "two/c.py": "from ..one import a\n",
    })
    graph = import_graph(packages)
    assert circles(graph) == [] and circles(package_imports(graph)) == [["pkg.one", "pkg.two"]]
