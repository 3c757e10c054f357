"""jobs/gpu_check.sh --cpu as CI runs it (under five minutes, every table printed and written), and the
parts of tools/gpu_check.py that decide a verdict: the comparison that calls two results files equal, and
the placement cases for a node's GPU count."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import h5py
import pytest

from conftest import QUICKSTART, ROOT, mpi_env, mpicd_run

sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402

from mpicd.results.reader import Results  # noqa: E402


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "report.md"
    done = subprocess.run(
        ["bash", "jobs/gpu_check.sh", "--cpu", "--out", str(out)],
        cwd=ROOT,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=300,  # the budget: under five minutes
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return done.stdout, out.read_text()


def test_the_cpu_check_passes_prints_and_writes_every_table(report):
    printed, written = report
    for title in ("## 1. Placement", "## 2. Determinism", "## 3. Throughput", "## 4. Clients in turn"):
        assert title in written and title in printed, title
    assert re.search(r"\| configs/pneumoniamnist.yaml on cpu \| 4 \| \d+ \| yes \|", written), written
    for clients in (1, 8, 32):
        assert re.search(
            rf"\| clients in turn on one rank \| {clients} \| 1 \| [0-9.]+ \| [0-9.]+ \| \d+ \(RSS\) \|", written
        )
    assert re.search(r"\| one rank per core \| 2 \| 2 \| [0-9.]+ \| [0-9.]+ \| – \|", written)
    for k in (8, 32):  # the two forms compute the same parameters (float32 last bits)
        row = re.search(rf"\| {k} \| [0-9.]+ \| [0-9.]+ \| [0-9.]+x \| ([0-9.e+-]+) \|", written)
        assert row and float(row.group(1)) < gpu_check.SAME_UPDATE, written
    seconds = int(re.search(r"Whole check: (\d+) s, every check passed\.", written).group(1))
    assert seconds < 300


def test_two_files_that_differ_in_one_value_are_named_and_equal_files_are_not(tmp_path):
    a = tmp_path / "a.h5"
    mpicd_run(2, QUICKSTART, a, "rounds=2", "clients=2")
    b = tmp_path / "b.h5"
    shutil.copy(a, b)
    assert gpu_check.differing(Results(a), Results(b)) == []
    with h5py.File(b, "r+") as f:
        f["metrics/test_acc"][1, 0] += 1e-12  # one value, one ulp-sized change
        f["metrics/compute_seconds"][0, 0] += 1.0  # a timing: never compared
    assert gpu_check.differing(Results(a), Results(b)) == ["test_acc"]


def test_placement_cases_cover_a_reordered_subset_and_more_ranks_than_gpus():
    four = gpu_check.placement_cases(4, cpu=False)
    assert four == [
        ("every GPU, one rank each", 4, None),
        ("a subset in another order", 2, "3,0"),
        ("more ranks than GPUs", 5, None),
    ]
    one = gpu_check.placement_cases(1, cpu=False)
    assert [c[1:] for c in one] == [(1, None), (1, "0"), (2, None)]
    assert [c[2] for c in gpu_check.placement_cases(0, cpu=True)] == [None, None, ""]
