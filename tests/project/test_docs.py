"""The README's configuration tables are `mpicd config --markdown`: generated from the declarations
the loader validates against, and they name every key the loader accepts."""

import re

from mpicd.algorithms import REGISTRY
from mpicd.config.sections import Config, to_mapping
from mpicd.config.text import config_tables

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
    # data.label_map, train.optimizer_state, train.loss, eval.train_split, eval.diagnostics,
    # data.partition, data.dirichlet_alpha, data.images_per_client, checkpoint.flush_every,
    # clients_per_rank, participation, eval.shared_models
    assert len(keys) == 45
    for key in keys | {"algorithm.name"}:
        assert f"| `{key}` |" in tables, key
    for name, cls in REGISTRY.items():
        own = [f.name.rstrip("_") for f in cls.Params.__dataclass_fields__.values()]
        rows = re.findall(rf"^\| `{name}` \| (`\w+`|–) \|", tables, flags=re.M)
        assert rows == ([f"`{k}`" for k in own] or ["–"]), name


def test_readme_results_layout_is_generated():
    from mpicd.results.columns import layout, layout_table

    begin, end = "<!-- results layout: begin -->", "<!-- results layout: end -->"
    text = (ROOT / "README.md").read_text()
    assert text.count(begin) == 1 and text.count(end) == 1, "README.md lost its layout markers"
    table = text.split(begin)[1].split(end)[0].strip("\n")
    assert table == layout_table(), "README.md is stale: run .venv/bin/python tools/readme_tables.py"
    for d in layout(2):
        assert f"| `/{d.path}` |" in table, d.path


# --------------------------------------------------------------------------- commands as typed


def running_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Running", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def test_running_commands_are_valid_as_typed(capsys, monkeypatch):
    """Every `jobs/mpirun.sh N run CONFIG ...` line of README's Running block: the config with its
    overrides passes `mpicd check` (no MPI) with `clients` equal to N, and every run writes to its
    own file (a second run onto a file is refused, so lines typed in order must not share one)."""
    import yaml

    from mpicd.cli import main

    monkeypatch.chdir(ROOT)  # as typed: from the project folder (configs name data relative to it)
    lines = running_block()
    runs = [line.split() for line in lines if line.startswith("jobs/mpirun.sh ")]
    assert lines[0].startswith("jobs/mpirun.sh ") and len(runs) >= 4, lines
    outputs = []
    for words in runs:
        ranks, command, config, *rest = words[1:]
        assert command == "run" and (ROOT / config).is_file(), words
        overrides = [w for w in rest if "=" in w and not w.startswith("--")]
        if "pneumoniamnist" in config and not (ROOT.parent / "shared/data/pneumoniamnist.npz").is_file():
            resolved = yaml.safe_load((ROOT / config).read_text())  # real data absent: the file's own keys
            resolved.update(yaml.safe_load(w.replace("=", ": ", 1)) for w in overrides if w.startswith("clients="))
        else:
            capsys.readouterr()
            assert main(["check", config, *overrides]) == 0, words
            resolved = yaml.safe_load(capsys.readouterr().out.split("\nmodel:", 1)[0] + "\n")
        assert resolved["clients"] == int(ranks), words
        out = rest[rest.index("--out") + 1] if "--out" in rest else resolved["output"]
        outputs.append(out)
        assert "--overwrite" in rest or out != "results/quickstart.h5", words  # jobs/quickstart.sh wrote it
    assert len(set(outputs)) == len(outputs), outputs
    data = (ROOT.parent / "shared/data/pneumoniamnist.npz").is_file()
    for line in lines:
        if line.startswith("mpicd ") and line.split()[1] in ("check", "config", "--help", "--version"):
            if data or "pneumoniamnist" not in line:
                assert main(line.split()[1:]) == 0, line
    assert "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in (ROOT / "README.md").read_text()


# --------------------------------------------------------------------------- the guides' worked examples

GUIDE_EDITS = {  # what each guide tells the reader to change in existing files: (file, old, new)
    "docs/add-a-dataset.md": [
        (
            "mpicd/data/__init__.py",
            "from mpicd.data import aptos, breast_cancer, covid, medmnist\n",
            "from mpicd.data import aptos, breast_cancer, covid, medmnist, table\n",
        ),
        (
            "mpicd/data/__init__.py",
            '    "covid": covid.load,\n',
            '    "covid": covid.load,\n    "table": table.load,\n',
        ),
        (
            "mpicd/config/sections.py",
            '    name: Literal["breast_cancer", "medmnist", "aptos", "covid"] = spec(\n',
            '    name: Literal["breast_cancer", "medmnist", "aptos", "covid", "table"] = spec(\n',
        ),
    ],
    "docs/add-an-algorithm.md": [
        (
            "mpicd/algorithms/__init__.py",
            "from mpicd.algorithms.fedproto import FedProto\n",
            "from mpicd.algorithms.fedproto import FedProto\nfrom mpicd.algorithms.fedprox import FedProx\n",
        ),
        (
            "mpicd/algorithms/__init__.py",
            "    FedAMP.name: FedAMP,\n",
            "    FedAMP.name: FedAMP,\n    FedProx.name: FedProx,\n",
        ),
    ],
}
GUIDE_FILE = re.compile(r"<!-- example file: (\S+) -->\n```python\n(.*?)```", flags=re.S)


def test_the_guides_worked_examples_work_in_a_copy_of_the_package(tmp_path):
    """Both guides carried out as written, in a copy of mpicd: their new files, their edits (each shown
    in the guide), `mpicd check` with the new format and the new algorithm, and the examples' tests
    (all but the one that starts mpiexec)."""
    import shutil
    import subprocess
    import sys

    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "mpicd", copy / "mpicd", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "configs", copy / "configs")
    (copy / "tests").mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", copy / "tests")
    shutil.copy(ROOT / "pyproject.toml", copy)
    tests = []
    for guide, edits in GUIDE_EDITS.items():
        text = (ROOT / guide).read_text()
        files = GUIDE_FILE.findall(text)
        assert len(files) == 2, guide  # the module and its test
        for path, body in files:
            assert not (copy / path).exists(), f"{guide}: {path} already exists: the example is in the package"
            (copy / path).parent.mkdir(parents=True, exist_ok=True)
            (copy / path).write_text(body)
            tests += [path] if path.startswith("tests/") else []
        for path, old, new in edits:
            for line in set(new.splitlines()) - set(old.splitlines()):
                assert line in text, f"{guide} does not show the edit {line.strip()!r}"
            source = (copy / path).read_text()
            assert source.count(old) == 1, f"{guide}: {path} no longer has {old.strip()!r}: update the guide"
            (copy / path).write_text(source.replace(old, new))
    rows = [f"{i % 7},{(i * 3) % 11},{i % 5},{'sick' if i % 3 == 0 else 'well'}" for i in range(300)]
    (copy / "cases.csv").write_text("\n".join(["f1,f2,f3,label", *rows]) + "\n")
    checks = (
        "from mpicd.cli import main\n"
        "assert main(['check', 'configs/quickstart.yaml', 'data.name=table', 'data.path=cases.csv']) == 0\n"
        "assert main(['check', 'configs/quickstart.yaml', 'algorithm=fedprox', 'algorithm.mu=0.1']) == 0\n"
    )
    run = [sys.executable, "-c", checks], [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    for command in (run[0], [*run[1], "-k", "not real_run"]):
        result = subprocess.run(command, cwd=copy, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        if command[1] == "-c":
            assert "sick" in result.stdout and "fedprox" in result.stdout


def test_the_source_tree_section_names_every_package_and_top_level_folder():
    import subprocess

    section = (ROOT / "README.md").read_text().split("## Source tree\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^    (\S+)/ ", section, re.M))
    packages = {f"mpicd/{p.parent.name}" for p in (ROOT / "mpicd").glob("*/__init__.py")}
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    folders = {f.split("/", 1)[0] for f in tracked.stdout.split() if "/" in f and not f.startswith(".")} - {"mpicd"}
    assert packages <= named, f"packages missing from README's Source tree: {sorted(packages - named)}"
    assert folders <= named, f"folders missing from README's Source tree: {sorted(folders - named)}"
    assert all((ROOT / name).is_dir() for name in named), [n for n in named if not (ROOT / n).is_dir()]
