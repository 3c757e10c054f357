"""The README's configuration tables are `mpicd config --markdown`: generated from the declarations
the loader validates against, and they name every key the loader accepts."""

import re

from mpicd.algorithms import REGISTRY
from mpicd.cli import config_tables
from mpicd.config import Config, to_mapping

from conftest import ROOT

BEGIN, END = "<!-- mpicd config --markdown: begin -->", "<!-- mpicd config --markdown: end -->"


def readme_tables() -> str:
    text = (ROOT / "README.md").read_text()
    assert text.count(BEGIN) == 1 and text.count(END) == 1, "README.md lost its table markers"
    return text.split(BEGIN)[1].split(END)[0].strip("\n")


def test_readme_configuration_tables_are_generated():
    assert readme_tables() == config_tables(), "README.md is stale: paste `mpicd config --markdown` between the markers"


def test_every_key_the_loader_accepts_is_in_the_tables():
    def dotted(tree, prefix=""):
        for key, value in tree.items():
            yield from dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]

    tables = readme_tables()
    keys = set(dotted({k: v for k, v in to_mapping(Config()).items() if k != "algorithm"}))
    # 26 + on_nonfinite, debug.fail_{rank,round,kind,at}, timeout.round_seconds, eval.every,
    # data.label_map, train.optimizer_state, train.loss, eval.train_split, eval.diagnostics
    assert len(keys) == 38
    for key in keys | {"algorithm.name"}:
        assert f"| `{key}` |" in tables, key
    for name, cls in REGISTRY.items():
        own = [f.name.rstrip("_") for f in cls.Params.__dataclass_fields__.values()]
        rows = re.findall(rf"^\| `{name}` \| (`\w+`|–) \|", tables, flags=re.M)
        assert rows == ([f"`{k}`" for k in own] or ["–"]), name


def test_readme_results_layout_is_generated():
    from mpicd.results import layout, layout_table

    begin, end = "<!-- results layout: begin -->", "<!-- results layout: end -->"
    text = (ROOT / "README.md").read_text()
    assert text.count(begin) == 1 and text.count(end) == 1, "README.md lost its layout markers"
    table = text.split(begin)[1].split(end)[0].strip("\n")
    assert table == layout_table(), "README.md is stale: run .venv/bin/python jobs/readme_tables.py"
    for d in layout(2):
        assert f"| `/{d.path}` |" in table, d.path
