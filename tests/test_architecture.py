"""The tree tells the architecture: each package of forge/ imports only the packages below it.

Every ``import forge.X`` / ``from forge.X import`` counts, lazy imports inside functions too. The
top-level modules (``forge.cli``, ``forge.config``, ``forge.llm``, ``forge.main``, ``forge.calibrate``,
``forge.batch``) are the public entry points: they may import anything, and no package imports them except
where listed. An entry point split into several modules keeps its parts beside it, each named after it
(``forge.config_checks``: part of ``forge.config``); packages import the entry point, not its parts."""

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
    "routers": {"core"},
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
    "capacity": {"cluster", "config", "core", "engine", "results", "workloads"},
    "cluster": {"config", "core", "engine", "models", "results", "routers", "sim", "spec"},
    "frontend": {"core", "sched", "engine"},
    "gateway": {"config", "core", "engine", "routers"},
    "server": {
        "config",
        "core",
        "tokenizers",
        "kvcache",
        "structured",
        "engine",
        "frontend",
        "results",
        "sampling",
        "models",
        "sched",
    },
}
ENTRY_POINTS = {"__init__", "batch", "cli", "config", "llm", "main", "calibrate"}


def is_entry_point_part(stem: str) -> bool:
    """A module split off an entry point, named after it: ``config_checks`` of ``config``."""
    owner, sep, _ = stem.partition("_")
    return bool(sep) and owner in ENTRY_POINTS - {"__init__"}


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
    loose = {p.stem for p in FORGE.glob("*.py") if not is_entry_point_part(p.stem)}
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


def module_name(path: Path) -> str:
    parts = path.relative_to(FORGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (imports for annotations only)."""
    nodes, stack = [], [tree]
    while stack:
        node = stack.pop()
        nodes.append(node)
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return nodes


def module_imports(path: Path, modules: set[str]) -> set[str]:
    """The forge modules ``path`` imports when it runs (lazy imports inside functions too; not those
    for annotations only): ``from forge.a.b import c`` counts ``forge.a.b.c`` when that is a module,
    else ``forge.a.b``."""
    found = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("forge"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
    return found & modules


def test_no_module_imports_itself_through_others() -> None:
    """No import circle between forge's modules (issue 31: clock -> operators -> step_sums -> clock
    was one); a package's ``__init__`` importing its own modules is not a circle."""
    paths = {module_name(p): p for p in FORGE.rglob("*.py")}
    modules = set(paths)
    graph = {
        name: {dep for dep in module_imports(path, modules) if dep != name and not name.startswith(dep + ".")}
        for name, path in paths.items()
    }
    order = list(TopologicalSorter(graph).static_order())  # raises CycleError naming the circle
    assert set(order) == modules


MAX_FUNCTION_LINES = 80
MAX_COMPLEXITY = 20
# function -> why it is longer (issue 31 asks for exceptions listed with a reason); each still to be split
LONG_FUNCTIONS = {
    "forge/kernels/cuda/ops_attention.py:attention": "one kernel launch's arguments, straight-line (complexity 5)",
}
# packages held to tighter bounds (issue 31: the server as small handlers), with no exceptions
TIGHTER = {"forge/server": (60, 15)}


def complexity(fn: ast.AST) -> int:
    """McCabe's number as the mccabe tool (ruff's C901) counts it: 1 + the branches (``if``/``elif``),
    loops, exception handlers and match cases in the function, its nested functions' excluded."""
    count, stack = 1, list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        if isinstance(node, ast.If | ast.For | ast.AsyncFor | ast.While | ast.ExceptHandler | ast.match_case):
            count += 1
        stack.extend(ast.iter_child_nodes(node))
    return count


def function_sizes(root: Path) -> dict[str, tuple[int, int]]:
    """Every function under ``root`` by ``path:name``: its lines (nested functions' included) and complexity."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found[f"{path.relative_to(FORGE.parent)}:{node.name}"] = (lines, complexity(node))
    return found


def test_functions_stay_short_and_simple() -> None:
    sizes = function_sizes(FORGE)
    found = {k: v for k, v in sizes.items() if v[0] > MAX_FUNCTION_LINES or v[1] > MAX_COMPLEXITY}
    unlisted = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS}
    assert not unlisted, f"functions over {MAX_FUNCTION_LINES} lines or complexity {MAX_COMPLEXITY}: {unlisted}"
    assert set(LONG_FUNCTIONS) <= set(found), f"listed but now within bounds: {set(LONG_FUNCTIONS) - set(found)}"


def test_tighter_packages_keep_their_bounds() -> None:
    for package, (max_lines, max_complexity) in TIGHTER.items():
        sizes = function_sizes(FORGE.parent / package)
        over = {k: v for k, v in sizes.items() if v[0] > max_lines or v[1] > max_complexity}
        assert not over, f"{package}: functions over {max_lines} lines or complexity {max_complexity}: {over}"
