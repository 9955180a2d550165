"""The tree tells the architecture: each package of forge/ imports only the packages below it.

Every ``import forge.X`` / ``from forge.X import`` counts, lazy imports inside functions too. The
top-level modules (``forge.cli``, ``forge.config``, ``forge.llm``, ``forge.main``, ``forge.calibrate``,
``forge.batch``) are the public entry points: they may import anything, and no package imports them except
where listed."""

from __future__ import annotations

import ast
from graphlib import TopologicalSorter
from pathlib import Path

FORGE = Path(__file__).resolve().parent.parent / "forge"

# package -> the forge packages (and top-level modules) it may import; each package's __init__ says the same
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "tokenizers": {"core"},
    "policies": {"core"},
    "kvcache": {"core"},
    "kernels": {"core"},
    "sampling": {"core"},
    "models": {"core", "kernels", "tokenizers"},
    "structured": {"core", "tokenizers"},
    "workloads": {"core", "tokenizers"},
    "sim": {"core", "models"},
    "sched": {"core", "policies", "kvcache"},
    "parallel": {"core", "kernels", "models"},
    "spec": {"core", "models", "kernels", "kvcache", "sampling", "tokenizers"},
    "results": {"core", "sched", "kvcache", "sim"},
    "engine": {
        "config",
        "core",
        "tokenizers",
        "policies",
        "kvcache",
        "kernels",
        "sampling",
        "models",
        "structured",
        "workloads",
        "sim",
        "sched",
        "spec",
        "results",
        "parallel",
    },
    "server": {
        "config",
        "core",
        "tokenizers",
        "kvcache",
        "structured",
        "engine",
        "results",
        "sampling",
        "models",
        "sched",
    },
}
ENTRY_POINTS = {"__init__", "batch", "cli", "config", "llm", "main", "calibrate"}


def forge_imports(path: Path) -> set[str]:
    """The first component after ``forge.`` of every forge import in ``path``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] if node.module != "forge" else [f"forge.{a.name}" for a in node.names]
        found |= {n.split(".")[1] for n in names if n.startswith("forge.")}
    return found


def test_forge_top_holds_only_entry_points_and_packages() -> None:
    loose = {p.stem for p in FORGE.glob("*.py")}
    assert loose <= ENTRY_POINTS, f"loose modules at forge/'s top: {sorted(loose - ENTRY_POINTS)}"
    packages = {p.name for p in FORGE.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(ALLOWED), f"packages without a layering entry: {sorted(packages ^ set(ALLOWED))}"


def test_every_package_imports_only_what_it_may() -> None:
    violations = []
    for package, allowed in ALLOWED.items():
        for path in sorted((FORGE / package).rglob("*.py")):
            for dep in sorted(forge_imports(path) - allowed - {package}):
                violations.append(f"{path.relative_to(FORGE.parent)} imports forge.{dep}")
    assert not violations, "\n".join(violations)


def test_layering_has_no_cycles() -> None:
    graph = {p: {d for d in deps if d in ALLOWED} for p, deps in ALLOWED.items()}
    order = list(TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
    assert set(order) == set(ALLOWED)


def test_every_package_says_what_it_owns() -> None:
    for package in ALLOWED:
        doc = ast.get_docstring(ast.parse((FORGE / package / "__init__.py").read_text()))
        assert doc and len(doc) > 40, f"forge/{package}/__init__.py needs a docstring saying what it owns"
