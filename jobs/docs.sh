#!/usr/bin/env bash
# Build the documentation site strictly: every warning, a link to a page, heading or file that does
# not exist, or an API object that cannot be imported fails the build.
#   bash jobs/docs.sh [OUTDIR]        # default docs/_build/html; open OUTDIR/index.html
# Sphinx with MyST reads the project's root (docs/conf.py says which Markdown is a page).
# Not -n (nitpicky): type hints name numpy's and torch's classes, whose docs are not part of this
# offline build (no intersphinx); a reference to one of mpicd's own objects still resolves or warns.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:-docs/_build/html}
[ -x .venv/bin/sphinx-build ] || { echo "jobs/docs.sh: no .venv/bin/sphinx-build: run bash jobs/setup.sh (it installs the docs extra)" >&2; exit 2; }
exec .venv/bin/sphinx-build -b html -W --keep-going -q -c docs -d "$out/.doctrees" . "$out"
