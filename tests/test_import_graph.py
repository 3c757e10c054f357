"""The package's import graph, read from the source with ast (imports inside functions included, as
they run sooner or later): no cycle, and no module imports one of a higher layer.

``python tests/test_import_graph.py [ROOT]`` prints the graph's size, its cycles and its upward
imports for the checkout at ROOT (default: this one).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Bottom to top; a module may import its own layer (no cycle) and the layers below. An entry names a
# module and everything under it ("mpicd.algorithms": the registry and every algorithm); "mpicd" is the
# package's own __init__ only.
LAYERS = (
    (
        "foundations: no mpicd imports but each other",
        ("mpicd", "mpicd.schema", "mpicd.seeds", "mpicd.ledger", "mpicd.metrics", "mpicd.optim",
         "mpicd.diagnostics", "mpicd.degenerate", "mpicd.durations", "mpicd.faults", "mpicd.signals",
         "mpicd.checkpoint", "mpicd.watchdog", "mpicd.exclusive", "mpicd.channels"),
    ),
    ("MPI, models, client sampling, privacy maths", ("mpicd.comm", "mpicd.nonfinite", "mpicd.models",
     "mpicd.participation", "mpicd.privacy")),
    ("the algorithms and their registry", ("mpicd.algorithms",)),
    ("the config and what it alone decides", ("mpicd.config", "mpicd.config_text", "mpicd.identity", "mpicd.layout",
     "mpicd.runtime")),
    ("the data", ("mpicd.data", "mpicd.nodeshare")),
    ("an experiment: plan, client, results file", ("mpicd.plan", "mpicd.check", "mpicd.client", "mpicd.evaluation",
     "mpicd.results", "mpicd.startpoint")),
    ("a run and what reads runs", ("mpicd.loop", "mpicd.runner", "mpicd.sweep", "mpicd.verify", "mpicd.report",
                                   "mpicd.release_audit")),
    ("commands built on runs", ("mpicd.pack", "mpicd.bench")),
    ("the command line", ("mpicd.cli", "mpicd.__main__")),
)  # fmt: skip


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package by its __init__)."""
    found = {}
    for path in sorted((root / "mpicd").rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source (``from . import x`` names
    the submodule x; ``from .x import name`` the module x)."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for target in targets:
                while target and target not in known:  # mpicd.algorithms.base.Batch -> mpicd.algorithms.base
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the longest entry that is ``module`` or a package above it."""
    best = None
    for i, (_, entries) in enumerate(LAYERS):
        for entry in entries:
            below = entry != "mpicd" and module.startswith(entry + ".")
            if (module == entry or below) and (best is None or len(entry) > best[1]):
                best = (i, len(entry))
    return None if best is None else best[0]


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of a module from a higher layer than the importer's (modules without a layer skipped)."""
    arrows = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                arrows.append((a, b))
    return arrows


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "mpicd.algorithms" in graph["mpicd.config"]  # _check_method_switch imports the registry lazily
    assert "mpicd.runner" in graph["mpicd.cli"] and "mpicd.bench" in graph["mpicd.cli"]
    assert "mpicd.bench.write" in graph["mpicd.bench"]  # ``from . import write as bench_write`` in bench()


def test_cycles_are_found_on_a_graph_made_by_hand():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e2"}, "e2": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    found = cycles(graph)
    shown = [" ; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c) for c in found]
    assert not found, "import cycles:\n" + "\n".join(shown)


def test_every_module_has_a_layer():
    missing = [m for m in import_graph() if layer_of(m) is None]
    assert not missing, f"add these modules to LAYERS in tests/test_import_graph.py: {missing}"


def test_nothing_imports_upward():
    arrows = upward(import_graph())
    shown = [f"{a} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})" for a, b in arrows]
    assert not arrows, "imports of a higher layer:\n" + "\n".join(shown)


if __name__ == "__main__":
    root = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    graph = import_graph(root)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports")
    for c in cycles(graph):
        print("cycle:", " ; ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a]) if b in c))
    print("without a layer:", [m for m in graph if layer_of(m) is None])
    for a, b in upward(graph):
        print(f"upward: {a} -> {b}")
