"""``mpicd run`` as a user runs it: determinism, failure handling, bad input, the quick start."""

import re
import subprocess
import time

import h5py
import numpy as np
import pytest

from mpicd.results.reader import Results

from conftest import DRIVERS, QUICKSTART, ROOT, is_timing, mpi_env, mpicd_cli, mpicd_run, mpiexec


def contents(path):
    """Every dataset and attribute of a results file except timings (and the versions line)."""
    found = {}
    with h5py.File(path, "r") as f:
        found.update({f"attr:{k}": v for k, v in f.attrs.items() if k not in ("startup_seconds", "run_id")})
        f.visititems(
            lambda name, obj: (
                found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) and not is_timing(name) else None
            )
        )
    return found


def same(a, b):
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k], equal_nan=isinstance(a[k], np.ndarray) and a[k].dtype.kind == "f") for k in a
    )


def test_same_seed_same_file_different_seed_different(tmp_path):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        mpicd_run(4, QUICKSTART, tmp_path / f"{name}.h5", "rounds=3", f"seed={seed}")
    a, b, c = (contents(tmp_path / f"{n}.h5") for n in "abc")
    assert same(a, b)
    assert not np.array_equal(a["metrics/train_loss"], c["metrics/train_loss"])


def test_a_failing_rank_aborts_the_job_promptly_and_keeps_completed_rounds(tmp_path):
    """An algorithm of one's own that raises (tests/run/test_faults.py times every built-in fault kind
    from the fault to the job's end; here the bound is the subprocess timeout)."""
    out = tmp_path / "crash.h5"
    result = mpiexec(4, str(DRIVERS / "crash.py"), str(QUICKSTART), str(out), timeout=90)
    assert result.returncode != 0
    assert "injected failure on rank 1 in round 2" in result.stderr and "Traceback" in result.stderr
    res = Results(out)
    assert res.completed_rounds == 2
    assert np.isfinite(res.metrics["train_loss"]).all() and res.metrics["train_loss"].shape == (2, 4)


@pytest.mark.parametrize(
    "ranks, overrides, message",
    [
        (2, [], "the config has 4 clients but the job has 2 MPI ranks"),
        (2, ["clients=2", "data.skew=1.5"], "data.skew: must be < 1"),
        (2, ["clients=2", "algorithm.lambda=-1"], "algorithm.lambda: must be >= 0"),
        (2, ["clients=2", "algorithm.k=0"], "algorithm.k: must be >= 1"),
        (2, ["clients=2", "algorithm.k=1000"], "algorithm.k: is 1000, but client 0 has only"),
        (2, ["clients=2", "rounds=0"], "rounds: must be >= 1"),
        (2, ["clients=2", "data.name=medmnist", "data.path=/nonexistent/pneumonia.npz"], "/nonexistent/pneumonia.npz"),
        (4, ["data.images_per_class=500"], "data.images_per_class"),
        (2, ["clients=2", "learning_rate=0.1"], "learning_rate: unknown key"),
    ],
)
def test_bad_input_exits_2_with_one_clear_message(tmp_path, ranks, overrides, message):
    out = tmp_path / "never.h5"
    result = mpiexec(ranks, "-m", "mpicd", "run", str(QUICKSTART), *overrides, "--out", str(out), timeout=120)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert message in result.stderr
    assert result.stderr.count("mpicd: config error") == 1, result.stderr
    assert not out.exists()


def test_check_prints_resolved_config_and_partition_without_mpi():
    result = mpicd_cli("check", str(QUICKSTART), "data.skew=0.5")
    assert result.returncode == 0, result.stderr
    assert "skew: 0.5" in result.stdout and "lambda: 1.0" in result.stdout
    lines = result.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["client", "expertise"])
    rows = [line.split() for line in lines[header + 1 : header + 5]]
    assert [row[1] for row in rows] == ["malignant", "benign", "malignant", "benign"]
    base = int(rows[0][2])
    assert int(rows[0][3]) == int(np.floor(0.5 * base + 1e-9)) and int(rows[1][3]) == base
    assert "held-out" in result.stdout


def test_check_rejects_bad_input_with_exit_2():
    result = mpicd_cli("check", str(QUICKSTART), "data.skew=1")
    assert result.returncode == 2 and "data.skew" in result.stderr
    result = mpicd_cli("check", "no/such/config.yaml")
    assert result.returncode == 2 and "no/such/config.yaml" in result.stderr


def test_the_quickstart_command_end_to_end():
    started = time.monotonic()
    result = subprocess.run(
        ["bash", "jobs/quickstart.sh", "--out", "results/test-quickstart.h5", "--overwrite"],
        cwd=ROOT,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    round_lines = [line for line in result.stdout.splitlines() if line.startswith("round ")]
    assert len(round_lines) == 20 and "minority_acc" in round_lines[0] and "bytes" in round_lines[0]
    assert all(re.search(r"\(\S+ elapsed, about \S+ left\)$", line) for line in round_lines), round_lines
    assert round_lines[-1].endswith("about 0s left)")
    res = Results(ROOT / "results" / "test-quickstart.h5")
    assert res.completed_rounds == 20
    print(f"quick start: {elapsed:.1f} s wall")
