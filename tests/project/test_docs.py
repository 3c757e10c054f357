"""The documentation is kept true: the generated tables are the declarations, every command a page
tells the reader to type is valid as typed, the worked examples work, the README stays short, and the
site builds strictly (jobs/docs.sh: a warning or a broken link fails it)."""

import re
import subprocess
import sys

import pytest

from mpicd.algorithms import REGISTRY, params_by_name
from mpicd.config.sections import Config, to_mapping
from mpicd.config.text import config_tables

from conftest import PNEUMONIA, ROOT, mpi_env
from guide_example import apply_edits, copy_of_the_package, write_example_files

DOCS = ROOT / "docs"
BEGIN, END = "<!-- mpicd config --markdown: begin -->", "<!-- mpicd config --markdown: end -->"


def generated(page: str, begin: str, end: str) -> str:
    text = (DOCS / page).read_text()
    assert text.count(begin) == 1 and text.count(end) == 1, f"docs/{page} lost its markers {begin!r}"
    return text.split(begin)[1].split(end)[0].strip("\n")


def config_page_tables() -> str:
    return generated("reference/configuration.md", BEGIN, END)


def test_the_configuration_tables_are_generated():
    assert config_page_tables() == config_tables(params_by_name()), (
        "docs/reference/configuration.md is stale: run .venv/bin/python tools/docs_tables.py"
    )


def test_every_key_the_loader_accepts_is_in_the_tables():
    def dotted(tree, prefix=""):
        for key, value in tree.items():
            yield from dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else [f"{prefix}{key}"]

    tables = config_page_tables()
    keys = set(dotted({k: v for k, v in to_mapping(Config()).items() if k != "algorithm"}))
    # 26 + on_nonfinite, debug.fail_{rank,round,kind,at}, timeout.round_seconds, eval.every,
    # data.label_map, train.optimizer_state, train.loss, eval.train_split, eval.diagnostics,
    # data.partition, data.dirichlet_alpha, data.images_per_client, checkpoint.flush_every,
    # clients_per_rank, participation, eval.shared_models, train.sampler, eval.share_train_metrics
    assert len(keys) == 48
    for key in keys | {"algorithm.name"}:
        assert f"| `{key}` |" in tables, key
    for name, cls in REGISTRY.items():
        own = [f.name.rstrip("_") for f in cls.Params.__dataclass_fields__.values()]
        rows = re.findall(rf"^\| `{name}` \| (`\w+`|–) \|", tables, flags=re.M)
        assert rows == ([f"`{k}`" for k in own] or ["–"]), name


def test_the_results_layout_is_generated():
    from mpicd.results.columns import layout, layout_table

    table = generated("reference/results-file.md", "<!-- results layout: begin -->", "<!-- results layout: end -->")
    assert table == layout_table(), "docs/reference/results-file.md is stale: run .venv/bin/python tools/docs_tables.py"
    for d in layout(2):
        assert f"| `/{d.path}` |" in table, d.path


# --------------------------------------------------------------------------- commands as typed

# The pages whose shell blocks a reader types: every mpirun.sh / sbatch / mpicd line in them is checked.
TYPED = (
    "README.md",
    "docs/how-to/run.md",
    "docs/how-to/install.md",
    "docs/tutorials/first-run.md",
    "docs/tutorials/slurm-cluster.md",
)
SETUP_WAYS = re.search(r'""\|([a-z|-]+)\) ;;', (ROOT / "jobs/setup.sh").read_text()).group(1).split("|")


def sh_blocks(page: str) -> list[list[str]]:
    """Each ```sh block of a page, as its command lines without comments (continuations joined)."""
    text = (ROOT / page).read_text()
    blocks = []
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        blocks.append([line.split("  #")[0].strip() for line in joined.splitlines() if line.split("#")[0].strip()])
    return blocks


def resolved_config(config: str, overrides: list[str], capsys, cwd) -> dict:
    """The config as `mpicd check` resolves it (no MPI); with the real data absent, the file's own keys."""
    import yaml

    from mpicd.cli import main

    if "pneumoniamnist" in config and not PNEUMONIA.is_file():
        resolved = yaml.safe_load((cwd / config).read_text())
        resolved.update(yaml.safe_load(w.replace("=", ": ", 1)) for w in overrides if w.startswith("clients="))
        return resolved
    capsys.readouterr()
    assert main(["check", config, *overrides]) == 0, (config, overrides)
    return yaml.safe_load(capsys.readouterr().out.split("\nmodel:", 1)[0] + "\n")


def check_typed(lines: list[str], capsys, cwd) -> int:
    """Every `jobs/mpirun.sh N run CONFIG ...` line: its config and overrides pass `mpicd check` with
    `clients` equal to N, and no two runs of the block write one file (a second run onto a file is
    refused, so lines typed in order must not share one); every `sbatch ... --ntasks=N slurm/X.sbatch`
    line names a script that exists and a config (or a sweep whose runs) of N clients; every `mpicd
    check | config | sweep | --help | --version` line exits 0. Returns the lines checked."""
    from mpicd.cli import main

    checked, outputs = 0, []
    for line in lines:
        words = line.split()
        if words[0] == "jobs/mpirun.sh" and words[2] == "run":
            ranks, _, config, *rest = words[1:]
            overrides = [w for w in rest if "=" in w and not w.startswith("--")]
            resolved = resolved_config(config, overrides, capsys, cwd)
            assert resolved["clients"] == int(ranks), line
            out = rest[rest.index("--out") + 1] if "--out" in rest else resolved["output"]
            assert "--overwrite" in rest or out not in outputs, line
            outputs.append(out)
            assert "--overwrite" in rest or out != "results/quickstart.h5", line  # jobs/quickstart.sh wrote it
        elif words[0] == "sbatch":
            script = next(w for w in words if w.startswith("slurm/"))
            assert (ROOT / script).is_file(), line
            ntasks = int(next(w for w in words if w.startswith("--ntasks=")).split("=")[1])
            target, *rest = words[words.index(script) + 1 :]
            if script == "slurm/mpicd.sbatch":
                overrides = [w for w in rest if "=" in w and not w.startswith("--")]
                assert resolved_config(target, overrides, capsys, cwd)["clients"] == ntasks, line
            else:
                from mpicd.sweep.grid import load_sweep

                runs = load_sweep(cwd / target)
                ranks = {run.ranks for run in runs}
                assert len(ranks) == 1, line  # every run of a sweep has one rank count (pack groups by it)
                assert ranks == {ntasks} or (script == "slurm/pack.sbatch" and ntasks % min(ranks) == 0), line
                if "--array=" in line:
                    last = int(re.search(r"--array=0-(\d+)", line).group(1))
                    assert last == len(runs) - 1, f"{line}: the sweep has {len(runs)} runs"
        elif "jobs/setup.sh" in words and words[words.index("jobs/setup.sh") - 1] == "bash":
            named = [w.split("=", 1)[1] for w in words if w.startswith("--mpi=")]
            assert all(way in SETUP_WAYS for way in named), (line, SETUP_WAYS)
            assert all("=" in w for w in words[: words.index("bash")]), line  # only VAR=value before it
        elif words[0] in ("mpicd", ".venv/bin/mpicd") and words[1] in (
            "check",
            "config",
            "sweep",
            "--help",
            "--version",
        ):
            if PNEUMONIA.is_file() or "pneumoniamnist" not in line:
                assert main(words[1:]) == 0, line
        else:
            continue
        checked += 1
    return checked


@pytest.mark.parametrize("page", TYPED)
def test_the_commands_a_page_shows_are_valid_as_typed(page, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # as typed: from the project folder (configs name data relative to it)
    blocks = sh_blocks(page)
    assert blocks, f"{page} shows no commands"
    checked = sum(check_typed(block, capsys, ROOT) for block in blocks)
    assert checked >= {"README.md": 8, "docs/how-to/run.md": 8}.get(page, 3), (page, checked)
    if page == "README.md":
        tour = (ROOT / page).read_text().split("## A short tour", 1)[1].split("```sh\n", 1)[1]
        assert tour.startswith("jobs/mpirun.sh 4 run configs/quickstart.yaml --overwrite"), tour[:80]
        assert "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1" in (ROOT / page).read_text()


# --------------------------------------------------------------------------- the guides' worked examples

GUIDE_EDITS = {  # what each guide tells the reader to change in existing files: (file, old, new)
    "docs/how-to/add-a-dataset.md": [
        (
            "mpicd/data/__init__.py",
            "from mpicd.data import aptos, breast_cancer, covid, imagefolder, medmnist\n",
            "from mpicd.data import aptos, breast_cancer, covid, imagefolder, medmnist, table\n",
        ),
        (
            "mpicd/data/__init__.py",
            '    "covid": covid.load,\n',
            '    "covid": covid.load,\n    "table": table.load,\n',
        ),
        (
            "mpicd/config/sections.py",
            '    name: Literal["breast_cancer", "medmnist", "imagefolder", "aptos", "covid"] = spec(\n',
            '    name: Literal["breast_cancer", "medmnist", "imagefolder", "aptos", "covid", "table"] = spec(\n',
        ),
    ],
    "docs/how-to/add-an-algorithm.md": [
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


def test_the_guides_worked_examples_work_in_a_copy_of_the_package(tmp_path):
    """Both guides carried out as written, in a copy of mpicd: their new files, their edits (each shown
    in the guide), `mpicd check` with the new format and the new algorithm, and the examples' tests
    (all but the one that starts mpiexec)."""
    copy = copy_of_the_package(tmp_path)
    tests = []
    for guide, edits in GUIDE_EDITS.items():
        files = write_example_files(guide, copy)
        assert len(files) == 2, guide  # the module and its test
        tests += [path for path in files if path.startswith("tests/")]
        apply_edits(guide, copy, edits)
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
    section = (DOCS / "reference" / "source-tree.md").read_text()
    named = set(re.findall(r"^    (\S+)/ ", section, re.M))
    packages = {f"mpicd/{p.parent.name}" for p in (ROOT / "mpicd").glob("*/__init__.py")}
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    folders = {f.split("/", 1)[0] for f in tracked.stdout.split() if "/" in f and not f.startswith(".")} - {"mpicd"}
    assert packages <= named, f"packages missing from docs/reference/source-tree.md: {sorted(packages - named)}"
    assert folders <= named, f"folders missing from docs/reference/source-tree.md: {sorted(folders - named)}"
    assert all((ROOT / name).is_dir() for name in named), [n for n in named if not (ROOT / n).is_dir()]


# --------------------------------------------------------------------------- the README and the site

LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def test_the_readme_is_short_and_every_page_it_links_exists():
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= 15 * 1024, f"README.md is {readme.stat().st_size} bytes: keep it <= 15 KB"
    targets = [t for t, _ in LINK.findall(readme.read_text()) if "://" not in t]
    assert len(targets) >= 25, targets  # the map of the docs: every page by purpose
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    pages = {t for t in targets if t.startswith("docs/") and t.endswith(".md")}
    every = {
        p.relative_to(ROOT).as_posix() for p in DOCS.rglob("*.md") if "_build" not in p.parts and p.name != "index.md"
    }
    assert every <= pages, f"pages the README's map leaves out: {sorted(every - pages)}"


def test_the_cli_page_states_the_exit_codes_the_code_returns():
    from mpicd.run import signals, watchdog
    from mpicd.run.runner import EXIT_BAD_INPUT

    page = " ".join((DOCS / "reference" / "cli.md").read_text().split())
    for code, meaning in (
        (EXIT_BAD_INPUT, "bad input"),
        (signals.EXIT_STOPPED, "stopped before Slurm's time limit"),
        (watchdog.EXIT_TIMEOUT, "the round watchdog"),
        (signals.EXIT_INTERRUPTED, "stopped on request"),
    ):
        assert f"{code} {meaning}" in page, (code, meaning)


def test_the_site_builds_strictly(tmp_path):
    """jobs/docs.sh as CI runs it: Sphinx with -W, so a warning, a broken link to a page, heading or file,
    or a module autodoc cannot import fails; then every page of the docs and the README is in the site."""
    import time

    started = time.monotonic()
    result = subprocess.run(
        ["bash", "jobs/docs.sh", str(tmp_path / "html")], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-6000:]}"
    print(f"docs: built in {time.monotonic() - started:.1f} s")
    for page in [*DOCS.rglob("*.md"), ROOT / "README.md", ROOT / "BENCHMARKS.md"]:
        if "_build" in page.parts:
            continue
        html = tmp_path / "html" / page.relative_to(ROOT).with_suffix(".html")
        assert html.is_file(), f"{page.relative_to(ROOT)} is not a page of the site"
    cli = (tmp_path / "html" / "docs" / "reference" / "cli.html").read_text()
    assert all(f"mpicd {name}" in cli for name in ("run", "check", "report", "verify", "pack")), "CLI page"
    api = (tmp_path / "html" / "docs" / "reference" / "api.html").read_text()
    documented = set(re.findall(r'id="module-(mpicd[\w.]*)"', api))
    assert every_module() <= documented, f"modules the API reference leaves out: {sorted(every_module() - documented)}"
    assert 'id="mpicd.algorithms.base.Payload"' in api, "the API page lost the algorithms' Payload"


def every_module() -> set[str]:
    """Every module of the package but a program's __main__ (importing it runs it)."""
    found = set()
    for path in (ROOT / "mpicd").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] != "__main__":
            found.add(".".join(parts))
    return found


# --------------------------------------------------------------------------- the tutorial on your own images


def test_the_own_images_tutorial_works_as_typed(tmp_path):
    """docs/tutorials/your-own-data.md carried out as a new user would, on real images: PNGs of
    PneumoniaMNIST (250 training and 60 test images per class) in ~/xrays/train and ~/xrays/test, every
    ```sh block run by bash exactly as the page types it, from a project folder; what the page shows
    of mpicd check, the report and a bad image's error is what the commands print."""
    import numpy as np
    from PIL import Image

    if not PNEUMONIA.is_file():
        pytest.skip(f"real data absent: {PNEUMONIA} (see ../shared/data/README.md)")
    page = (DOCS / "tutorials" / "your-own-data.md").read_text()
    home, work = tmp_path / "home", tmp_path / "work"
    data = np.load(PNEUMONIA)
    for split, n in (("train", 250), ("test", 60)):
        images, labels = data[f"{split}_images"], data[f"{split}_labels"].ravel()
        for label, name in enumerate(("normal", "pneumonia")):
            (home / "xrays" / split / name).mkdir(parents=True)
            for i in np.flatnonzero(labels == label)[:n]:
                Image.fromarray(images[i]).save(home / "xrays" / split / name / f"{i:05d}.png")
    work.mkdir()
    for shared in ("jobs", ".venv", "configs"):
        (work / shared).symlink_to(ROOT / shared)

    def bash(block: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["bash", "-c", "set -euo pipefail\n" + block],
            cwd=work,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin", **{k: v for k, v in mpi_env().items() if "OMPI" in k}},
            capture_output=True,
            text=True,
            timeout=900,
        )

    blocks = re.findall(r"```sh\n(.*?)```", page, flags=re.S)
    shown = re.findall(r"```text\n(.*?)```", page, flags=re.S)
    assert len(blocks) == 4 and len(shown) == 4, (len(blocks), len(shown))
    look, check, runs, compare = (bash(b) for b in blocks)
    assert look.returncode == 0 and look.stdout.split().count("pneumonia") == 2, look.stderr
    assert check.returncode == 0, check.stderr
    printed = check.stdout.splitlines()
    for line in shown[1].splitlines():  # the page's excerpt of mpicd check, line for line
        assert line == "..." or line in printed, line
    assert not [line for line in printed if line.startswith("warning:")]
    assert runs.returncode == 0, runs.stdout[-2000:] + runs.stderr[-2000:]
    assert (work / "results" / "xrays-codistill.h5").is_file() and (work / "results" / "xrays-fedavg.h5").is_file()
    assert compare.returncode == 0, compare.stderr
    report = compare.stdout.splitlines()
    title, _, header, rule, codistill, fedavg = shown[3].splitlines()
    assert title in report and header in report and rule in report
    for row in (codistill, fedavg):  # the scores depend on the CPU model; the bytes do not
        cells = row.split(" | ")
        assert any(r.startswith(" | ".join(cells[:2])) and r.endswith(" | ".join(cells[-1:])) for r in report), row
    # the page's example of a broken image, as mpicd check prints it for a file that is not an image
    broken = home / "xrays" / "train" / "normal" / "0042.png"
    broken.write_text("not an image")
    bad = bash(blocks[1])
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines() == [shown[2].strip().replace("/home/you", str(home))], bad.stderr
