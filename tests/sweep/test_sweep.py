"""Sweeps: grid expansion and validation, the workstation runner, and the Slurm scripts' logic
(run directly with bash and MPICD_LAUNCHER=mpirun, since there is no Slurm here)."""

import os
import subprocess
import sys

import pytest
import yaml

from mpicd.config.sections import ConfigError
from mpicd.results.reader import Results
from mpicd.sweep.grid import is_done, load_sweep

from conftest import QUICKSTART, ROOT, mpi_env, mpiexec


def sweep_file(tmp_path, grid, **extra):
    import yaml

    path = tmp_path / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {"config": str(QUICKSTART), "output_dir": str(tmp_path / "out"), "grid": grid, **extra}, sort_keys=False
        )
    )
    return path


def test_grid_expands_in_order_with_named_outputs(tmp_path):
    runs = load_sweep(
        sweep_file(
            tmp_path,
            {
                "algorithm": [{"name": "codistill", "lambda": 0.5}, {"name": "local"}],
                "data.skew": [0.2, 0.9],
                "clients": [2],
            },
        )
    )
    assert [r.overrides for r in runs[:2]] == [
        ("algorithm={lambda: 0.5, name: codistill}", "data.skew=0.2", "clients=2"),
        ("algorithm={lambda: 0.5, name: codistill}", "data.skew=0.9", "clients=2"),
    ]
    assert len(runs) == 4 and all(r.ranks == 2 and r.rounds == 20 for r in runs)
    assert runs[3].output.name == "0003_algorithm=local_skew=0.9_clients=2.h5"
    assert not any(is_done(r) for r in runs)


@pytest.mark.parametrize(
    "grid, extra, match",
    [
        ({"data.skew": [0.2, 1.5]}, {}, "run 1 .*data.skew: must be < 1"),
        ({"algorithm": [{"name": "nope"}]}, {}, "algorithm.name"),
        ({"data.skew": []}, {}, "grid.data.skew"),
        ({"seed": [0]}, {"colour": "red"}, "colour"),
        ({"seed": [0]}, {"set": {"seed": 3}}, "set.seed: is also a grid key"),
        ({"seed": [0]}, {"set": ["eval.every=2"]}, "set: must be a mapping"),
        ({"seed": [0]}, {"set": {"data.skew": 2.0}}, "run 0 .*data.skew: must be < 1"),
    ],
)
def test_bad_sweeps_name_the_run_and_key(tmp_path, grid, extra, match):
    with pytest.raises(ConfigError, match=match):
        load_sweep(sweep_file(tmp_path, grid, **extra))


def test_set_pins_keys_for_every_run_without_naming_them(tmp_path):
    runs = load_sweep(sweep_file(tmp_path, {"seed": [0, 1]}, set={"eval.every": 2, "data.skew": 0.3}))
    assert [r.overrides for r in runs] == [
        ("eval.every=2", "data.skew=0.3", "seed=0"),
        ("eval.every=2", "data.skew=0.3", "seed=1"),
    ]
    assert [r.output.name for r in runs] == ["0000_seed=0.h5", "0001_seed=1.h5"]
    assert all(r.resolved["eval"]["every"] == 2 and r.resolved["data"]["skew"] == 0.3 for r in runs)
    assert [r.resolved["seed"] for r in runs] == [0, 1]


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweep")
    return sweep_file(tmp, {"algorithm": [{"name": "local"}, {"name": "codistill"}], "clients": [2], "rounds": [2]})


def test_workstation_sweep_runs_everything_then_resumes(tiny_sweep):
    env = mpi_env()
    first = subprocess.run(
        ["bash", "jobs/sweep.sh", str(tiny_sweep)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("=== run") == 2
    runs = load_sweep(tiny_sweep)
    assert all(is_done(r) for r in runs)
    assert Results(runs[1].output).attrs["algorithm"] == "codistill"
    again = subprocess.run(
        ["bash", "jobs/sweep.sh", str(tiny_sweep)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0 and "=== run" not in again.stdout

    # The sweep file changes a value its output names do not show (codistill's lambda): the complete
    # file is of another config, so it is neither skipped as done nor overwritten, everywhere.
    spec = yaml.safe_load(tiny_sweep.read_text())
    spec["grid"]["algorithm"][1]["lambda"] = 0.5
    changed = tiny_sweep.with_name("changed.yaml")
    changed.write_text(yaml.safe_dump(spec, sort_keys=False))
    stale = load_sweep(changed)
    assert stale[1].output == runs[1].output and is_done(stale[0])
    with pytest.raises(
        ConfigError, match=r"holds a complete run of another config \(algorithm.lambda: the file has 1.0"
    ):
        is_done(stale[1])
    before = runs[1].output.stat().st_mtime_ns
    for how in (["--pending"], ["--status", "1"]):
        answer = subprocess.run(
            [sys.executable, "-m", "mpicd", "sweep", str(changed), *how],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert answer.returncode == 2 and str(runs[1].output) in answer.stderr, (how, answer.stderr)
    packed = mpiexec(2, "-m", "mpicd", "pack", str(changed), timeout=120)
    assert packed.returncode == 2, packed.stdout + packed.stderr
    assert packed.stderr.count("holds a complete run of another config") == 1, packed.stderr
    assert runs[1].output.stat().st_mtime_ns == before


def test_a_key_older_files_lack_counts_as_what_older_versions_did():
    """Only the keys of ADDED_LATER: on_nonfinite (no check before: abort for a finished run) and
    FedAMP's exchange (always the Allgather before); any other missing key is a difference."""
    from mpicd.algorithms import REGISTRY
    from mpicd.config.sections import Config, config_difference, to_mapping
    from mpicd.report import MISSING, Cell

    def resolved(name, **algorithm):
        params = to_mapping(REGISTRY[name].Params())
        return {**to_mapping(Config()), "algorithm": {"name": name, **params, **algorithm}}

    current = resolved("fedamp")
    older = {k: v for k, v in current.items() if k != "on_nonfinite"}
    older["algorithm"] = {k: v for k, v in current["algorithm"].items() if k != "exchange"}
    assert config_difference(older, current, "the file", "the sweep") is None
    assert Cell.of(older) == Cell.of(current)
    assert config_difference(older, resolved("fedamp", exchange="ring"), "the file", "the sweep") == (
        "algorithm.exchange: the file has 'allgather', the sweep 'ring'"  # the older version's value
    )
    assert config_difference(older, {**current, "on_nonfinite": "skip"}, "the file", "the sweep") == (
        "on_nonfinite: the file has 'abort', the sweep 'skip'"
    )
    assert Cell.of(older) != Cell.of({**current, "on_nonfinite": "skip"})
    # exchange is FedAMP's key only; a key not in ADDED_LATER is never filled in
    codistill = resolved("codistill")
    assert Cell.of(codistill).get("algorithm.exchange") is MISSING
    no_mode = {**codistill, "data": {k: v for k, v in codistill["data"].items() if k != "skew_mode"}}
    assert config_difference(no_mode, codistill, "the file", "the sweep") == (
        "data.skew_mode: the file has '<absent>', the sweep 'symmetric'"
    )
    # both sides may predate a key: a ledger line and its results file, both written before
    # data.display_name existed, compared by a version that has it (the ledger's own check)
    new_data = {**codistill, "data": {**codistill["data"], "display_name": None}}
    old_data = {**codistill, "data": {k: v for k, v in codistill["data"].items() if k != "display_name"}}
    assert config_difference(new_data, old_data, "the ledger", "the file") is None
    assert config_difference(old_data, new_data, "the file", "the sweep") is None
    named = {**codistill, "data": {**codistill["data"], "display_name": "Scans"}}
    assert config_difference(named, old_data, "the ledger", "the file") == (
        "data.display_name: the ledger has 'Scans', the file None"
    )


def test_slurm_scripts_with_mpirun_as_launcher(tmp_path):
    sweep = sweep_file(tmp_path, {"algorithm": [{"name": "local"}, {"name": "fedavg"}], "clients": [2], "rounds": [2]})
    env = {
        **mpi_env(),
        "MPICD_LAUNCHER": "mpirun",
        "SLURM_NTASKS": "2",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}",
    }
    out = tmp_path / "one.h5"
    single = subprocess.run(
        ["bash", "slurm/mpicd.sbatch", str(QUICKSTART), "clients=2", "rounds=2", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert single.returncode == 0, single.stderr
    assert Results(out).completed_rounds == 2

    def array_task(index, **more):
        return subprocess.run(
            ["bash", "slurm/sweep.sbatch", str(sweep)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**env, "SLURM_ARRAY_TASK_ID": str(index), **more},
            timeout=180,
        )

    first = array_task(1)
    assert first.returncode == 0, first.stderr
    runs = load_sweep(sweep)
    assert is_done(runs[1]) and not is_done(runs[0])
    assert Results(runs[1].output).attrs["algorithm"] == "fedavg"
    again = array_task(1)
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr
    wrong = array_task(0, SLURM_NTASKS="3")
    assert wrong.returncode == 2 and "needs 2 tasks, this job has 3" in wrong.stderr
