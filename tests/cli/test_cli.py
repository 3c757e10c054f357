"""The first hour of a new user: --version, mpicd config, reading results without MPI (and as a
pandas table), a wrong rank count refused before torch is imported, sweep progress lines."""

import importlib.metadata
import re
import subprocess
import sys

import h5py
import pytest
import yaml

from mpicd.algorithms import resolve
from mpicd.config.loading import load_config
from mpicd.config.sections import Config
from mpicd.core.durations import duration
from mpicd.results.reader import Results
from mpicd.run.runner import launch_hint
from mpicd.sweep.grid import progress

from conftest import QUICKSTART, ROOT, mpi_env, mpicd_cli, mpicd_run, mpiexec

# Makes ``import NAME`` (and its submodules) fail in a subprocess, as on a machine without it.
BLOCK = """import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is blocked by the test")
sys.meta_path.insert(0, Block())
"""


def python(code: str, *blocked: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", BLOCK.format(blocked=set(blocked)) + code],
        cwd=ROOT,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_help_lists_every_command_and_exits_0():
    from mpicd.cli import _parsers

    for flag in ("--help", "-h", "help"):
        result = mpicd_cli(flag)
        assert result.returncode == 0, result.stderr
        listed = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("  mpicd ")]
        assert listed == list(_parsers()), result.stdout
    assert mpicd_cli().returncode == 2  # no command at all is still a usage error


def test_version():
    result = mpicd_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"mpicd {importlib.metadata.version('mpicd')}"


# --------------------------------------------------------------------------- mpicd config


def test_config_prints_the_defaults_as_a_loadable_commented_yaml(tmp_path):
    result = mpicd_cli("config")
    assert result.returncode == 0, result.stderr
    path = tmp_path / "defaults.yaml"
    path.write_text(result.stdout)
    cfg = load_config(path)
    assert cfg == Config(
        algorithm={
            "name": "codistill",
            "lambda": 1.0,
            "k": "all",
            "teacher_per": "round",
            "classes": "expertise",
            "share": "features",
            "term_mean": "matching",
        }
    )
    assert resolve(cfg.algorithm)[1] == resolve({"name": "codistill"})[1]
    lines = {line.split(":")[0].strip(): line for line in result.stdout.splitlines() if not line.startswith("#")}
    assert re.fullmatch(r"  lr: 0\.001 +# number > 0; learning rate", lines["lr"])
    assert re.fullmatch(r"  skew: 0\.0 +# number in \[0, 1\); each non-expertise class keeps .*", lines["skew"])
    assert re.fullmatch(r"  k: all +# integer >= 1 or all; images the teacher averages per class.*", lines["k"])
    assert re.fullmatch(r"  name: codistill +# codistill \| local \| fedavg \| .*", lines["name"])
    body = [line for line in result.stdout.splitlines() if not line.startswith("#")]
    assert all(re.fullmatch(r"\w+:", line) or " # " in line for line in body)  # a section, or key: value # doc


def test_config_of_another_algorithm():
    result = mpicd_cli("config", "--algorithm", "fedamp")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["algorithm"] == {  # the defaults fedamp.py documents
        "name": "fedamp",
        "lambda": 0.1,
        "sigma": 1e-4,
        "alpha": "auto",
        "similarity": "gaussian",
        "self_weight": 0.5,
        "cosine_scale": 10.0,
        "exchange": "allgather",
    }
    assert "# number in [0, 1]; cosine only: xi_ii" in result.stdout
    assert yaml.safe_load(mpicd_cli("config", "--algorithm", "fedavg").stdout)["algorithm"] == {
        "name": "fedavg",
        "reduction": "mpi",
    }
    wrong = mpicd_cli("config", "--algorithm", "fedsgd")
    assert wrong.returncode == 2 and "codistill, local, fedavg" in wrong.stderr and "fedsgd" in wrong.stderr


# --------------------------------------------------------------------------- reading without MPI


@pytest.fixture(scope="module")
def run_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("read") / "run.h5"
    mpicd_run(2, QUICKSTART, out, "clients=2", "rounds=2")
    return out


def test_results_report_and_check_need_no_mpi4py(run_file):
    code = f"""
from mpicd.cli import main
from mpicd.results import Results
r = Results({str(run_file)!r})
assert r.completed_rounds == 2 and r.metrics["minority_acc"].shape == (2, 2), r
assert main(["report", {str(run_file)!r}]) == 0
assert main(["check", {str(QUICKSTART)!r}, "clients=2"]) == 0
assert "mpi4py" not in sys.modules
print("read without mpi4py")
"""
    result = python(code, "mpi4py")
    assert result.returncode == 0, result.stderr
    assert "read without mpi4py" in result.stdout and "codistill" in result.stdout and "held-out" in result.stdout
    blocked = python("import mpicd.mpi.comm", "mpi4py")  # the blocker works
    assert blocked.returncode != 0 and "mpi4py is blocked by the test" in blocked.stderr


def test_results_to_frame_is_a_tidy_table(run_file):
    pytest.importorskip("pandas")
    frame = Results(run_file).to_frame()
    config_keys = ["data.name", "clients", "data.partition", "data.skew"]  # Results.FRAME_KEYS
    assert list(frame.columns) == ["algorithm", "seed", *config_keys, "round", "client", "metric", "value"]
    with h5py.File(run_file, "r") as f:
        metrics = {
            name: f["metrics"][name][()] for name in f["metrics"] if not h5py.h5ds.is_scale(f["metrics"][name].id)
        }
        classes = [c.decode() if isinstance(c, bytes) else c for c in f.attrs["class_names"]]
    expected_names = {n for n, v in metrics.items() if v.ndim == 2} | {
        f"{n}[{c}]" for n, v in metrics.items() if v.ndim == 3 for c in classes
    }
    assert set(frame["metric"]) == expected_names
    assert len(frame) == 2 * 2 * len(expected_names)  # rounds x clients x metrics
    assert (frame["algorithm"] == "codistill").all() and (frame["seed"] == 0).all()
    at = frame.set_index(["round", "client", "metric"])["value"]
    assert at[(2, 1, "minority_acc")] == metrics["minority_acc"][1, 1]
    assert at[(1, 0, "bytes_sent")] == metrics["bytes_sent"][0, 0]
    assert classes == ["malignant", "benign"] and at[(2, 0, "recall[benign]")] == metrics["recall"][1, 0, 1]


def test_to_frame_without_pandas_names_the_extra(run_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"pip install 'mpicd\[report\]'"):
        Results(run_file).to_frame()


# --------------------------------------------------------------------------- fail fast on the rank count


def test_launch_hint_names_the_launcher():
    assert launch_hint(4, {}) == "run mpirun -n 4"
    assert launch_hint(6, {"SLURM_JOB_ID": "17"}) == "submit with sbatch --ntasks=6 (inside an allocation: srun -n 6)"


@pytest.mark.parametrize(
    "slurm, hint",
    [
        (False, "run mpirun -n 4, or set clients=2"),
        (True, "submit with sbatch --ntasks=4 (inside an allocation: srun -n 4)"),
    ],
)
def test_a_wrong_rank_count_is_refused_before_torch_is_imported(tmp_path, slurm, hint):
    out = tmp_path / "never.h5"
    code = BLOCK.format(blocked={"torch", "sklearn"}) + (
        "import os\n"
        + ("os.environ['SLURM_JOB_ID'] = '17'\n" if slurm else "")
        + f"from mpicd.cli import main\nsys.exit(main(['run', {str(QUICKSTART)!r}, '--out', {str(out)!r}]))\n"
    )
    result = mpiexec(2, "-c", code, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "the config has 4 clients but the job has 2 MPI ranks: " + hint in result.stderr
    assert result.stderr.count("mpicd: config error") == 1 and "blocked by the test" not in result.stderr
    assert not out.exists()


# --------------------------------------------------------------------------- sweep progress


def test_progress_line():
    assert duration(59.4) == "59s" and duration(61) == "1m01s" and duration(3725) == "1h02m"
    assert progress(0, 0, 6, 3, 0) == "0 of 6 finished, 0 failed; 3s elapsed, time left unknown"
    # 3 runs ended in 90 s of run time: 30 s each; 3 left, 2 at a time: 45 s
    assert progress(2, 1, 6, 125, 90, parallel=2) == "2 of 6 finished, 1 failed; 2m05s elapsed, about 45s left"


def test_workstation_sweep_prints_progress(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        f"config: {QUICKSTART}\noutput_dir: {tmp_path / 'out'}\ngrid:\n  algorithm: [local]\n"
        "  data.images_per_class: [null, 500]\n  clients: [2]\n  rounds: [2]\n"
    )  # 500: run 1 fails
    result = subprocess.run(
        ["bash", "jobs/sweep.sh", str(sweep)], cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(("===", "---"))]
    t = r"(\d+s|\d+m\d\ds|\d+h\d\dm)"  # a duration: 12s, 4m05s, 3h07m
    patterns = [
        rf"=== run 0 \(1 of 2 pending; 0 of 2 finished, 0 failed; {t} elapsed, time left unknown\): run .*",
        rf"--- run 0 finished in {t} \(1 of 2 finished, 0 failed; {t} elapsed, about {t} left\)",
        rf"=== run 1 \(2 of 2 pending; 1 of 2 finished, 0 failed; {t} elapsed, about {t} left\): run .*",
        rf"--- run 1 failed \(exit 2\) in {t} \(1 of 2 finished, 1 failed; {t} elapsed, about 0s left\)",
    ]
    assert len(lines) == 4, result.stdout
    for line, pattern in zip(lines, patterns):
        assert re.fullmatch(pattern, line), line
    took, _, left = re.fullmatch(patterns[1], lines[1]).groups()
    assert took == left  # one run ended, one to go: the estimate is that run's time
    assert "failed runs: 1" in result.stderr


def test_check_prints_each_clients_optimizer_steps_for_the_whole_run():
    # quick start: 37 + 14 = 51 training images per client; batches of 10 -> 10,10,10,10,11 (the
    # trailing single image joins the last batch): 5 steps an epoch, x 3 epochs x 7 rounds = 105
    result = mpicd_cli("check", str(QUICKSTART), "rounds=7", "train.local_epochs=3", "train.batch_size=10")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["client", "expertise"])
    assert lines[header].rstrip().endswith("optimizer steps")
    for row in lines[header + 1 : header + 5]:
        assert row.split()[-1] == "105" and "4x10 + 1x11" in row, row


def test_check_warns_when_a_client_takes_fewer_than_100_steps_on_images(tmp_path):
    """train/ 40 + 40 images, validation round(0.1 * 40) = 4 of each: 36 + 36 train. Two clients at
    skew 0 take as many as the rarest class allows, 18 of each class: 36 images, batches 32 + 4, 2
    steps an epoch. 49 rounds are 98 steps (a warning naming the client, its steps and the keys to
    raise), 50 rounds exactly 100 (none). Exit 0 either way: a warning, not an error. The tabular quick
    start (40 steps) draws none: the threshold was measured on images."""
    from fixtures_data import write_imagefolder

    write_imagefolder(tmp_path / "scans", {"train": {"a": 40, "b": 40}, "test": {"a": 5, "b": 5}}, size=(8, 8))
    config = tmp_path / "c.yaml"
    config.write_text(f"clients: 2\ndata:\n  name: imagefolder\n  path: {tmp_path / 'scans'}\nmodel:\n  name: lenet\n")
    few = mpicd_cli("check", str(config), "rounds=49")
    assert few.returncode == 0, few.stderr
    (warning,) = [line for line in few.stdout.splitlines() if line.startswith("warning:")]
    assert warning.startswith("warning: client 0 takes 98 optimizer steps in the whole run, fewer than 100: ")
    assert "raise rounds (now 49), train.local_epochs (now 1)" in warning and "train.batch_size (now 32)" in warning
    enough = mpicd_cli("check", str(config), "rounds=50")
    assert enough.returncode == 0 and "warning:" not in enough.stdout, enough.stdout
    tabular = mpicd_cli("check", str(QUICKSTART))
    assert tabular.returncode == 0 and "warning:" not in tabular.stdout, tabular.stdout


def test_check_names_the_data_its_input_shape_and_what_reading_did(tmp_path):
    from fixtures_data import write_imagefolder

    write_imagefolder(tmp_path / "scans", {"train": {"a": 30, "b": 30}, "test": {"a": 5, "b": 5}}, size=(8, 8))
    config = tmp_path / "c.yaml"
    config.write_text(f"clients: 2\ndata:\n  name: imagefolder\n  path: {tmp_path / 'scans'}\n  display_name: Scans\n")
    result = mpicd_cli("check", str(config))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # validation: round(0.1 * 30) = 3 of each class of train/; the rest (54) trains
    assert "data: Scans (imagefolder), 2 classes, 54 train, 6 validation, 10 test; input 1x8x8" in lines
    assert "images: grey, 1 channel; read at their own size, not resized" in lines
    resized = mpicd_cli("check", str(config), "data.image_size=16")
    assert (
        "images: grey, 1 channel; every image resized to 16x16 (data.image_size; PIL bilinear) from 8x8"
        in resized.stdout
    )


def test_check_warns_when_the_tabular_mlp_is_given_images(tmp_path):
    from fixtures_data import write_imagefolder

    write_imagefolder(tmp_path / "scans", {"train": {"a": 40, "b": 40}, "test": {"a": 5, "b": 5}}, size=(8, 8))
    config = tmp_path / "c.yaml"
    config.write_text(f"clients: 2\nrounds: 100\ndata:\n  name: imagefolder\n  path: {tmp_path / 'scans'}\n")
    mlp = mpicd_cli("check", str(config), "model.name=mlp")
    assert mlp.returncode == 0, mlp.stderr
    assert [line for line in mlp.stdout.splitlines() if line.startswith("warning:")] == [
        "warning: model.name mlp flattens each image into one vector and ignores its 2-D structure: for images a "
        "CNN is the usual choice (model.name lenet, or auto; configs/imagefolder.yaml is a starting config)"
    ]
    lenet = mpicd_cli("check", str(config), "model.name=lenet")
    assert lenet.returncode == 0 and "warning:" not in lenet.stdout, lenet.stdout
