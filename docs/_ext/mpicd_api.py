"""The ``mpicd-api`` directive: an autodoc section for every module of the package, found on disk when
the site is built and grouped by the layer it belongs to, so a new module is documented without
editing a page (a program's ``__main__`` is left out: importing it runs it)."""

from __future__ import annotations

from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.nodes import nested_parse_with_titles

LAYERS = (  # bottom first, as tests/project/test_import_graph.py declares them
    ("Foundations", "core"),
    ("MPI", "mpi"),
    ("Models", "models"),
    ("Evaluation", "evaluation"),
    ("Privacy", "privacy"),
    ("Algorithms", "algorithms"),
    ("Configuration", "config"),
    ("Data", "data"),
    ("Results file", "results"),
    ("A run", "run"),
    ("Reports", "report"),
    ("Sweeps and packing", "sweep"),
    ("Benchmarks", "bench"),
    ("Command line", "cli"),
)


def modules(package: Path, dotted: str) -> list[str]:
    """The package, then its modules and sub-packages, by name."""
    found = [dotted]
    for path in sorted(package.iterdir()):
        if path.is_dir() and (path / "__init__.py").is_file():
            found += modules(path, f"{dotted}.{path.name}")
        elif path.suffix == ".py" and path.stem not in ("__init__", "__main__"):
            found.append(f"{dotted}.{path.stem}")
    return found


def every_package(root: Path) -> list[tuple[str, list[str]]]:
    """(title, modules) per layer; a package no layer names is an error, not a silent omission."""
    named = {package for _, package in LAYERS}
    on_disk = {p.parent.name for p in (root / "mpicd").glob("*/__init__.py")}
    if on_disk - named:
        raise ValueError(f"docs/_ext/mpicd_api.py: packages of no layer: {sorted(on_disk - named)}")
    return [(title, modules(root / "mpicd" / package, f"mpicd.{package}")) for title, package in LAYERS]


class MpicdApi(SphinxDirective):
    has_content = False

    def run(self) -> list[nodes.Node]:
        root = Path(self.env.srcdir)
        # MyST Markdown (the page that holds the directive is MyST's); autodoc's output is reStructuredText,
        # so each automodule sits in an eval-rst block, where the docstrings are parsed as such.
        lines = []
        for title, names in [*every_package(root), ("The package itself", ["mpicd"])]:
            lines += [f"## {title}", "", "```{eval-rst}"]
            for name in names:
                lines += [f".. automodule:: {name}", ""]
            lines += ["```", ""]
        container = nodes.section()
        container.document = self.state.document
        nested_parse_with_titles(self.state, StringList(lines, source="mpicd-api"), container)
        return container.children


def setup(app):
    app.add_directive("mpicd-api", MpicdApi)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
