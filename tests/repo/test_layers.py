"""The package's folders are the pipeline: each imports only from the folders before it, and none in a circle.

Floors, bottom first: the top-level modules every stage uses (errors, settings, hashing, isolation,
progress, program), then ``spec/`` → ``machine/`` → ``targets/`` → ``export/`` → ``runtime/`` → ``validate/`` →
``artifacts/`` (publish) → ``fleet/`` → ``tasks/`` → ``flows/`` → ``cli/``. Every import counts, those
inside functions too (they run); only ``if TYPE_CHECKING:`` blocks are left out. docs/architecture.md
draws the same tree.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from prefect_executorch.spec.options import OPTIONS
from prefect_executorch.targets import TARGETS

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "prefect_executorch"
FLOORS = ("", "spec", "machine", "targets", "export", "runtime", "validate", "artifacts", "fleet", "tasks", "flows", "cli")


def modules_of(root: Path, name: str) -> dict[str, Path]:
    """Every module under ``root`` (links followed: flows/, tasks/ and artifacts/ are linked in) by dotted name."""
    found = {}
    for directory, _, files in os.walk(root, followlinks=True):
        for file in files:
            if file.endswith(".py"):
                relative = (Path(directory) / file).relative_to(root).with_suffix("")
                parts = [name, *relative.parts]
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = Path(directory) / file
    return found


def imports_of(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``path`` imports (a ``from package import submodule`` counts as the submodule)."""

    def owner(dotted: str) -> str:
        while dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted

    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and isinstance(child.test, ast.Name) and child.test.id == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.Import):
                found.update(owner(alias.name) for alias in child.names if alias.name.split(".")[0] == name)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0 \
                    and child.module.split(".")[0] == name:
                submodules = [f"{child.module}.{a.name}" for a in child.names if f"{child.module}.{a.name}" in modules]
                found.update(submodules)
                if len(submodules) < len(child.names):
                    found.add(owner(child.module))
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else 0


def violations(root: Path, name: str) -> tuple[list[str], list[list[str]]]:
    """The upward imports (``a -> b`` with b on a higher floor) and the circles (modules importing each other)."""
    modules = modules_of(root, name)
    graph = {module: imports_of(path, name, modules) - {module} for module, path in modules.items()}
    upward = [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]) if floor(b) > floor(a)]
    # Tarjan's strongly connected components: a component of more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                circles.append(sorted([v, *component]))

    for module in sorted(graph):
        if module not in index:
            strong(module)
    return upward, circles


def test_no_module_imports_upward_or_in_a_circle() -> None:
    upward, circles = violations(PACKAGE, "prefect_executorch")
    assert upward == [] and circles == [], f"upward: {upward}; circles: {circles}"


def test_the_check_catches_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """The check itself, on a package where spec imports the validator and two exporters import each other."""
    package = tmp_path / "pkg"
    for folder in ("spec", "validate", "export"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "spec" / "buildspec.py").write_text("def f():\n    from pkg.validate.validator import g\n")
    (package / "validate" / "validator.py").write_text("def g(): ...\n")
    (package / "export" / "a.py").write_text("from pkg.export import b\n")
    (package / "export" / "b.py").write_text("import pkg.export.a\n")
    upward, circles = violations(package, "pkg")
    assert upward == ["pkg.spec.buildspec -> pkg.validate.validator"]
    assert circles == [["pkg.export.a", "pkg.export.b"]]


@pytest.mark.parametrize(("layer", "not_loaded"), [
    ("prefect_executorch", ["torch", "prefect", "executorch", "prefect_executorch.spec"]),
    ("prefect_executorch.spec.buildspec", ["torch", "prefect", "executorch", "prefect_executorch.targets",
                                           "prefect_executorch.machine"]),
    ("prefect_executorch.machine.toolchain", ["torch", "prefect", "executorch", "prefect_executorch.targets"]),
    ("prefect_executorch.targets", ["torch", "prefect", "executorch", "prefect_executorch.export"]),
    ("prefect_executorch.export.exporter", ["torch", "prefect", "prefect_executorch.validate"]),
    ("prefect_executorch.validate.validator", ["torch", "prefect", "prefect_executorch.artifacts"]),
    ("prefect_executorch.artifacts.publishing", ["torch", "prefect_executorch.fleet", "prefect_executorch.flows"]),
])
def test_each_layer_imports_alone_without_what_comes_after_it(layer: str, not_loaded: list[str]) -> None:
    """Imported in a fresh interpreter: the heavy libraries load where a stage runs, not where it is named."""
    probe = (f"import importlib, sys; importlib.import_module({layer!r}); "
             f"print(sorted(m for m in {not_loaded!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]", f"importing {layer} loaded {loaded}"


def test_the_public_names_load_on_first_use() -> None:
    probe = ("import sys, prefect_executorch as pe; before = 'prefect_executorch.spec.buildspec' in sys.modules; "
             "spec = pe.BuildSpec; print(before, spec.__module__, sorted(pe.__all__) == sorted(set(pe.__all__)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "prefect_executorch.spec.buildspec", "True"]


def test_every_target_brings_the_options_model_the_spec_lists_for_it() -> None:
    assert {name: target.options for name, target in TARGETS.items()} == OPTIONS
