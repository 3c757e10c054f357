"""Regenerate the documentation's generated tables from the declarations (what tests/project/test_docs.py,
tests/mpi/test_channels.py and tests/algorithms/test_payloads.py check): the configuration tables, the
"What leaves a rank" tables (payloads, channels) and the results file's layout.

    .venv/bin/python tools/docs_tables.py
"""

from pathlib import Path

from mpicd.algorithms import params_by_name, payload_table
from mpicd.config.text import config_tables
from mpicd.mpi.channels import table as channel_table
from mpicd.results.columns import layout_table

DOCS = Path(__file__).resolve().parents[1] / "docs"
TABLES = {  # page: (begin marker, end marker, generator)
    "reference/configuration.md": [
        (
            "<!-- mpicd config --markdown: begin -->",
            "<!-- mpicd config --markdown: end -->",
            lambda: config_tables(params_by_name()),
        )
    ],
    "explanation/what-leaves-a-rank.md": [
        ("<!-- payload table: begin -->", "<!-- payload table: end -->", payload_table),
        ("<!-- channel table: begin -->", "<!-- channel table: end -->", channel_table),
    ],
    "reference/results-file.md": [("<!-- results layout: begin -->", "<!-- results layout: end -->", layout_table)],
}
for page, tables in TABLES.items():
    path = DOCS / page
    text = path.read_text()
    for begin, end, generate in tables:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = f"{head}{begin}\n{generate()}\n{end}{tail}"
    path.write_text(text)
    print(f"docs_tables: {path.relative_to(DOCS.parent)}")
