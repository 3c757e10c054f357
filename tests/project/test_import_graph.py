"""The package's import graph, read from the source with ast (imports inside functions included, as
they run sooner or later): no cycle, and no module imports one of a higher layer.

``python tests/project/test_import_graph.py [ROOT]`` prints the graph's size, its cycles and its upward
imports for the checkout at ROOT (default: this one).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Bottom to top, read from the tree: a layer is one or more of mpicd's packages, and a module's layer is
# its package's. A module may import its own layer (no cycle) and the layers below. The package's own
# __init__ (its version) is below everything and ``python -m mpicd`` above everything.
LAYERS = (
    ("foundations: import nothing else of mpicd", ("core",)),
    ("MPI, the networks, held-out scores", ("mpi", "models", "evaluation")),
    ("privacy maths", ("privacy",)),
    ("the algorithms and their registry", ("algorithms",)),
    ("the configuration", ("config",)),
    ("the data", ("data",)),
    ("the results file", ("results",)),
    ("a run, and what reads runs", ("run", "report")),
    ("commands built on runs", ("sweep", "bench")),
    ("the command line", ("cli",)),
)
TOP_LEVEL = {"mpicd": 0, "mpicd.__main__": len(LAYERS) - 1}  # the only modules directly in mpicd/


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


def packages(root: Path = ROOT) -> set[str]:
    """mpicd's sub-packages as they stand on disk (a folder with an __init__.py)."""
    return {p.parent.name for p in (root / "mpicd").glob("*/__init__.py")}


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer holding ``module``'s package (mpicd.run.loop: run's)."""
    if module in TOP_LEVEL:
        return TOP_LEVEL[module]
    package = module.split(".")[1] if module.startswith("mpicd.") else None
    for i, (_, names) in enumerate(LAYERS):
        if package in names:
            return i
    return None


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of a module from a higher layer than the importer's (modules without a layer skipped)."""
    arrows = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                arrows.append((a, b))
    return arrows


def unexplained_imports_in_functions(root: Path = ROOT) -> list[str]:
    """``file:line`` of each import of an mpicd module inside a function that says nowhere why it is
    there and not at the top (a comment on the import, or on the line just above its block of imports).
    An import hidden in a function hides an arrow from a reader: it needs a reason, such as a measured
    start-up cost (torch, mpi4py.MPI's MPI_Init) or an optional dependency."""
    found = []
    for path in sorted((root / "mpicd").rglob("*.py")):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mpicd"):
                    pass
                elif isinstance(node, ast.Import) and any(a.name.startswith("mpicd") for a in node.names):
                    pass
                else:
                    continue
                first = node.lineno - 1
                while first > 0 and lines[first - 1].strip().startswith(("from ", "import ")):
                    first -= 1  # the block of imports this one is in
                last = node.end_lineno
                while last < len(lines) and lines[last].strip().startswith(("from ", "import ")):
                    last += 1
                block = lines[first:last]
                above = lines[first - 1].strip() if first > 0 else ""
                if not above.startswith("#") and not any("#" in line for line in block):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return sorted(set(found))


def test_every_import_inside_a_function_says_why():
    found = unexplained_imports_in_functions()
    assert not found, "imports of mpicd modules inside functions, without a comment saying why:\n" + "\n".join(found)


def test_a_hidden_import_without_a_reason_is_found(tmp_path):
    (tmp_path / "mpicd").mkdir()
    (tmp_path / "mpicd" / "m.py").write_text(
        "def f():\n    from mpicd.a import b\n\n\ndef g():\n    # torch: seconds of start-up\n    from mpicd.c import d\n"
        "    import mpicd.e\n\n\ndef h():\n    import mpicd.f  # optional\n    import numpy\n"
    )
    assert unexplained_imports_in_functions(tmp_path) == ["mpicd/m.py:2"]


def test_the_algorithms_are_chosen_outside_the_config_and_verify_names_none():
    """The registry is consulted where an algorithm is chosen, not while a config is parsed; mpicd verify
    learns an algorithm's bytes from its declaration, not by naming one (issue 65)."""
    graph = import_graph()
    config = {m: sorted(t for t in targets if t.startswith("mpicd.algorithms")) for m, targets in graph.items()}
    assert not {m: t for m, t in config.items() if m.startswith("mpicd.config") and t}
    named = {f"mpicd.algorithms.{p.stem}" for p in (ROOT / "mpicd" / "algorithms").glob("*.py")} - {
        "mpicd.algorithms.__init__",
        "mpicd.algorithms.base",
    }
    assert not graph["mpicd.results.verify"] & named


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "mpicd.run.client" in graph["mpicd.run.check"]  # batch_bounds, imported lazily (torch)
    assert "mpicd.run.runner" in graph["mpicd.cli"] and "mpicd.bench" in graph["mpicd.cli.bench"]
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
    assert not missing, f"put these modules in a package and the package in LAYERS: {missing}"


def test_the_layers_are_the_packages_on_disk():
    listed = [name for _, names in LAYERS for name in names]
    assert len(listed) == len(set(listed))
    assert set(listed) == packages(), "LAYERS names exactly mpicd's packages"
    loose = sorted(p.name for p in (ROOT / "mpicd").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"], f"modules directly in mpicd/: {loose}"


def test_a_module_takes_its_packages_layer():
    assert layer_of("mpicd.core.schema") == 0 and layer_of("mpicd") == 0
    assert layer_of("mpicd.run.loop") == layer_of("mpicd.report.stats") == 7
    assert layer_of("mpicd.cli") == layer_of("mpicd.__main__") == len(LAYERS) - 1
    assert layer_of("mpicd.nowhere.x") is None and layer_of("numpy") is None


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
