"""The layout is the design: imports run from the CLI edge down to the workload, never back.

Each package sits on a layer (docs/ARCHITECTURE.md draws the same list). A module may import
from its own package and from any lower layer; an import from a higher layer, a cycle, or
one CLI command module importing another fails here, with the offending edge named.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "profkit"

# Lowest first. Modules at the top level of the package are the shared base.
LAYERS: list[tuple[str, ...]] = [
    ("cores", "errors", "files", "formats", "sidecar"),
    ("workload",),
    ("run",),
    ("traces",),
    ("analysis",),
    ("nsys", "torchprof", "memory", "cluster"),
    ("studies",),
    ("report",),
    ("cli",),
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every profkit module ``path`` imports (at any depth of the file, lazy imports too)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("profkit"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("profkit"):
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (ROOT.parent / candidate.replace(".", "/")).with_suffix(".py").exists()
                is_package = (ROOT.parent / candidate.replace(".", "/") / "__init__.py").exists()
                found.add(candidate if is_module or is_package else node.module)
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module name -> the profkit modules it imports (``TYPE_CHECKING`` blocks included)."""
    return {_module_name(p): _imports(p) for p in sorted(ROOT.rglob("*.py"))}


# The entry points stand above every layer: ``profkit.phase`` (the public API) and
# ``python -m profkit`` (the CLI) may reach anything.
ENTRY_POINTS = {"profkit", "profkit.__main__"}


def layer_of(module: str, *, as_target: bool = False) -> int:
    if module == "profkit" and as_target:
        return 0  # ``from profkit import __version__``: the version is a base fact
    if module in ENTRY_POINTS:
        return len(LAYERS)
    key = module.split(".")[1]
    for index, names in enumerate(LAYERS):
        if key in names:
            return index
    raise AssertionError(f"{module} is on no layer: add its package to LAYERS")


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_every_module_is_on_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


def test_no_import_runs_up_a_layer() -> None:
    upward = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if _package(src) != _package(dst) and layer_of(dst, as_target=True) > layer_of(src)
    ]
    assert upward == []


def test_launchers_do_not_import_each_other() -> None:
    peers = {"profkit.nsys", "profkit.torchprof", "profkit.memory"}
    crossing = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if _package(src) in peers and _package(dst) in peers and _package(src) != _package(dst)
    ]
    assert crossing == []


def test_no_cli_command_imports_another() -> None:
    shared = {
        "profkit.cli",
        "profkit.cli.app",
        "profkit.cli._common",
        "profkit.cli.render",
        "profkit.cli.views",
    }
    crossing = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        if src.startswith("profkit.cli.") and src not in shared
        for dst in targets
        if dst.startswith("profkit.cli.") and dst not in shared
    ]
    assert crossing == []


def test_no_import_cycles() -> None:
    nodes = set(import_graph())
    graph = {m: {t for t in ts if t in nodes} for m, ts in import_graph().items()}
    # A package's __init__ importing its own modules is how Python packages work; the cycle
    # that matters is between modules, so edges into a package's own __init__ are dropped.
    for module, targets in graph.items():
        targets.discard(_parent(module))
    cycles = _cycles(graph)
    assert cycles == []


def _parent(module: str) -> str:
    return module.rsplit(".", 1)[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph.get(node, ()):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.mark.parametrize("module", sorted(p.stem for p in ROOT.glob("*.py")))
def test_top_level_holds_only_the_shared_base(module: str) -> None:
    assert module in (*LAYERS[0], "__init__", "__main__"), (
        f"profkit/{module}.py belongs in a package"
    )
