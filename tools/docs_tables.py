"""Regenerate README.md's generated sections from the declarations (what tests/project/test_readme.py and
tests/algorithms/test_payloads.py check): the configuration tables, the "What leaves a rank" tables (payloads,
channels) and the results file's layout.

    .venv/bin/python tools/readme_tables.py
"""

from pathlib import Path

from mpicd.algorithms import payload_table
from mpicd.mpi.channels import table as channel_table
from mpicd.config.text import config_tables
from mpicd.results.columns import layout_table

SECTIONS = {
    "<!-- mpicd config --markdown: begin -->": ("<!-- mpicd config --markdown: end -->", config_tables),
    "<!-- payload table: begin -->": ("<!-- payload table: end -->", payload_table),
    "<!-- channel table: begin -->": ("<!-- channel table: end -->", channel_table),
    "<!-- results layout: begin -->": ("<!-- results layout: end -->", layout_table),
}
readme = Path(__file__).resolve().parents[1] / "README.md"
text = readme.read_text()
for begin, (end, generate) in SECTIONS.items():
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    text = f"{head}{begin}\n{generate()}\n{end}{tail}"
readme.write_text(text)
