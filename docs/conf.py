"""Sphinx configuration of mpicd's documentation site (build: ``bash jobs/docs.sh``).

The source folder is the project's root, not docs/: README.md, BENCHMARKS.md and the study's pages are
pages of the site as they are, so every link between them and the docs pages is a checked
cross-reference (a missing page, heading anchor or file is a warning, and jobs/docs.sh turns warnings
into errors). Only the Markdown listed in ``include_patterns`` is read.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "docs" / "_ext")]

import mpicd  # noqa: E402

project = "mpicd"
author = "the mpicd developers"
copyright = "2026, the mpicd developers"
release = version = mpicd.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "mpicd_cli", "mpicd_api"]
source_suffix = {".md": "markdown"}
root_doc = "docs/index"
include_patterns = [
    "README.md",
    "BENCHMARKS.md",
    "docs/*.md",
    "docs/**/*.md",
    "study/*.md",
    "study/**/*.md",
]
exclude_patterns = ["docs/_build", ".venv", "**/.ipynb_checkpoints"]

# Links to headings (page.md#a-heading) resolve and are checked down to level 4.
myst_heading_anchors = 4
myst_enable_extensions = ["dollarmath"]
# The study's generated pages put table headings (###) straight under their title; heading levels are
# style, not a broken promise: every missing page, anchor or file still fails the build.
suppress_warnings = ["myst.header"]

# The Python API: imported from this checkout (autodoc), in the order of the source.
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "ignore-module-all": True}  # each object once: where it is defined
autodoc_typehints = "description"
autodoc_mock_imports = ["opacus", "dp_accounting"]  # the optional privacy extra

html_theme = "alabaster"
html_title = f"mpicd {release}"
html_theme_options = {"description": "federated learning on class-imbalanced images, one MPI rank per client"}
