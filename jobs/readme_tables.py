"""Regenerate README.md's configuration tables from the declarations (what tests/test_readme.py checks).

    .venv/bin/python jobs/readme_tables.py
"""

from pathlib import Path

from mpicd.cli import config_tables

BEGIN, END = "<!-- mpicd config --markdown: begin -->", "<!-- mpicd config --markdown: end -->"
readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
head, rest = text.split(BEGIN, 1)
_, tail = rest.split(END, 1)
readme.write_text(f"{head}{BEGIN}\n{config_tables()}\n{END}{tail}")
