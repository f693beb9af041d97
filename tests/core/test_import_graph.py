"""No import cycles inside cblight: a lower layer never imports a higher one (the project's style rule).

The graph is read from the source (``ast``), function-local imports included, since a lazy import is still
a dependency and only hides a cycle until the day someone moves it to the top. Importing a submodule also
runs its packages' ``__init__``, so those are edges too.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

PACKAGE = ROOT / "cblight"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The cblight module that ``import name`` loads (``a.b.attr`` -> ``a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name if is_package else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                if not target.startswith("cblight"):
                    continue
                resolved = _resolve(target, modules)
                # importing a.b.c runs a/__init__ and a/b/__init__ first
                parts = (resolved or "").split(".")
                for i in range(1, len(parts) + 1):
                    dep = ".".join(parts[:i])
                    if dep in modules and dep != name and not name.startswith(dep + "."):
                        graph[name].add(dep)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_cblight_has_no_import_cycles():
    graph = import_graph()
    assert "cblight.truncation" in graph["cblight.generate.inputs"]  # the graph sees real edges
    found = cycles(graph)
    detail = "\n".join(
        " <-> ".join(c) + "\n    " + "; ".join(f"{m} imports {sorted(graph[m] & set(c))}" for m in c)
        for c in found
    )
    assert not found, f"import cycles in cblight:\n{detail}"


@pytest.mark.parametrize("module", ["cblight.runs", "cblight.generate.inputs", "cblight.truncation"])
def test_formerly_cyclic_modules_import_alone(module):
    """Each of the modules that were in a cycle imports first, alone, in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


WINGS = ("cblight.evaluate", "cblight.generate", "cblight.tune")
# The commands and integrations above the wings: they may import any wing (docs/design.md, "Layers").
APPS = ("cblight.cli", "cblight.__main__", "cblight.demo", "cblight.contrast", "cblight.lmeval")


def _layer(module: str) -> str:
    for wing in WINGS:
        if module == wing or module.startswith(wing + "."):
            return wing
    for app in APPS:
        if module == app or module.startswith(app + "."):
            return "app"
    return "core"


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, deps in sorted(graph.items()):
        layer = _layer(module)
        for dep in sorted(deps):
            target = _layer(dep)
            if layer == "core" and target != "core":
                bad.append(f"core module {module} imports {dep} ({target})")
            elif layer in WINGS and target not in ("core", layer):
                bad.append(f"{module} ({layer}) imports {dep} ({target})")
    return bad


def test_wings_import_only_the_core():
    """Each wing (evaluate, generate, tune) imports the shared core, never another wing nor a command;
    the core imports neither (docs/design.md, "Layers")."""
    bad = layer_violations(import_graph())
    assert not bad, "layer violations:\n" + "\n".join(bad)


def test_layer_rule_sees_violations():
    graph = {
        "cblight.generate.decode": {"cblight.boosting", "cblight.tune.loss"},
        "cblight.scoring": {"cblight.evaluate.methods"},
        "cblight.tune.loss": {"cblight.cli"},
        "cblight.cli": {"cblight.tune.loss", "cblight.generate.decode"},
    }
    assert layer_violations(graph) == [
        "cblight.generate.decode (cblight.generate) imports cblight.tune.loss (cblight.tune)",
        "core module cblight.scoring imports cblight.evaluate.methods (cblight.evaluate)",
        "cblight.tune.loss (cblight.tune) imports cblight.cli (app)",
    ]
