"""mpicd pack: a sweep's runs in one MPI job, the world split into groups; each packed run equals
the same run launched alone with the same threads per rank, finished runs are skipped, a rank count
below a run's size is refused.

Threads per rank are pinned (SLURM_CPUS_PER_TASK=PINNED_THREADS for both launches compared), because
equality holds only for equal threads: measured on the quick-start MLP, 2 threads per rank instead
of 1 change the training losses (train_loss, train_ce, train_extra) in their last bits. Unpinned, a
4-rank pack and a 2-rank launch alone get different threads on most machines (the cores divided by
the ranks on the node: 1 and 2 on 4 cores), and only a 2-core box would have compared equals."""

import re

import numpy as np
import pytest

from mpicd.results.reader import Results
from mpicd.sweep.grid import load_sweep

from conftest import QUICKSTART, is_timing, mpicd_run, mpiexec


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pack")
    path = folder / "sweep.yaml"
    path.write_text(
        f"config: {QUICKSTART}\noutput_dir: {folder / 'out'}\ngrid:\n"
        "  clients: [2]\n  rounds: [3]\n"
        "  algorithm: [{name: codistill}, {name: fedavg}, {name: fedproto}]\n  seed: [0, 1]\n"
    )
    return path


PINNED_THREADS = 1


@pytest.fixture
def pinned_threads():
    """Every launch in the with-block gets PINNED_THREADS torch threads per rank (mpicd's threads
    follow SLURM_CPUS_PER_TASK where it is set; mpiexec passes the environment on)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CPUS_PER_TASK", str(PINNED_THREADS))
        yield


@pytest.fixture(scope="module")
def packed(sweep):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CPUS_PER_TASK", str(PINNED_THREADS))
        result = mpiexec(4, "-m", "mpicd", "pack", str(sweep), timeout=400)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result


def test_every_run_is_done_once_by_two_groups(sweep, packed):
    runs = load_sweep(sweep)
    assert "6 pending; 4 ranks = 2 groups of 2" in packed.stdout
    starts = [line for line in packed.stdout.splitlines() if "] start (" in line]
    assert len(starts) == len(runs)
    assert {line.split("]")[0].split()[-1] for line in starts} == {str(r.index) for r in runs}
    assert {line.split()[1] for line in starts} == {"0", "1"}  # both groups took work
    t = r"(\d+s|\d+m\d\ds|\d+h\d\dm)"  # a duration: 12s, 4m05s, 3h07m
    for line in starts:
        assert re.search(
            rf"\] start \([1-6] of 6 pending; [0-5] of 6 finished, 0 failed; {t} elapsed, "
            rf"(about {t} left|time left unknown)\): ",
            line,
        ), line
    done = [
        re.search(rf"\] done in {t} \(([1-6]) of 6 finished, 0 failed; {t} elapsed, about {t} left\)$", line)
        for line in packed.stdout.splitlines()
        if "] done in " in line
    ]
    assert all(done) and sorted(int(m.group(2)) for m in done) == [1, 2, 3, 4, 5, 6]  # counted over both groups
    assert "about 0s left)" in packed.stdout  # the last run to end leaves nothing
    for run in runs:
        assert Results(run.output).completed_rounds == 3


def test_a_packed_run_equals_the_run_launched_alone(sweep, packed, tmp_path, pinned_threads):
    """Bit for bit (timings aside), with the same threads per rank in both launches: pinned, since
    with other threads the losses differ (see the module docstring)."""
    for run in load_sweep(sweep)[::2]:
        alone = tmp_path / run.output.name
        mpicd_run(2, run.config, alone, *run.overrides)
        a, b = Results(run.output), Results(alone)
        assert list(a.placement["threads"]) == list(b.placement["threads"]) == [PINNED_THREADS] * 2
        for name in a.metrics:
            if not is_timing(name):
                np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=f"{run.output} {name}")
        np.testing.assert_array_equal(a.bytes_sent_by_kind, b.bytes_sent_by_kind)
        np.testing.assert_array_equal(a.bytes_recv_by_kind, b.bytes_recv_by_kind)


def test_a_second_pack_skips_the_finished_runs(sweep, packed):
    runs = load_sweep(sweep)
    runs[1].output.unlink()
    again = mpiexec(5, "-m", "mpicd", "pack", str(sweep), timeout=300)
    assert again.returncode == 0, again.stderr
    assert "1 pending; 5 ranks = 2 groups of 2 (1 idle)" in again.stdout
    starts = [line for line in again.stdout.splitlines() if "] start (" in line]
    assert len(starts) == 1 and f"run {runs[1].index}]" in starts[0]
    assert "start (1 of 1 pending; 0 of 1 finished, 0 failed; " in starts[0] and "time left unknown" in starts[0]
    assert Results(runs[1].output).completed_rounds == 3


def test_too_few_ranks_is_refused(sweep):
    result = mpiexec(1, "-m", "mpicd", "pack", str(sweep), timeout=120)
    assert result.returncode == 2
    assert "each run needs 2 ranks" in result.stderr


def test_no_one_sided_window_is_one_error_that_names_the_fix(sweep):
    """Where MPI cannot make the run counter's window (Open MPI across nodes over TCP; here osc/pt2pt,
    which refuses windows under MPI_THREAD_MULTIPLE, stands in for it), pack says what to export."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMPI_MCA_osc", "pt2pt")
        result = mpiexec(2, "-m", "mpicd", "pack", str(sweep), timeout=120)
    assert result.returncode != 0
    assert "MPI_ERR_WIN" in result.stderr and "export OMPI_MCA_osc=sm,ucx" in result.stderr, result.stderr[-2000:]


def test_clients_packed_on_ranks_run_on_fewer_ranks_and_equal_one_client_per_rank(tmp_path, pinned_threads):
    """A sweep whose runs pack their clients (clients_per_rank balanced) runs each 4-client run on the 2
    ranks the job has, and every such run's scores equal the same run with one client per rank on 4."""
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"config: {QUICKSTART}\noutput_dir: {tmp_path / 'out'}\nset:\n  clients_per_rank: balanced\ngrid:\n"
        "  clients: [4]\n  rounds: [2]\n  algorithm: [{name: fedavg}, {name: codistill}]\n  seed: [0]\n"
    )
    result = mpiexec(2, "-m", "mpicd", "pack", str(path), timeout=300)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert "2 pending; 2 ranks = 1 groups of 2" in result.stdout
    for run in load_sweep(path):
        packed = Results(run.output)
        assert packed.completed_rounds == 2 and packed.attrs["ranks"] == 2  # 2 ranks ran it
        alone = tmp_path / run.output.name
        mpicd_run(4, run.config, alone, *[o for o in run.overrides if not o.startswith("clients_per_rank")])
        one = Results(alone)
        assert one.attrs["ranks"] == 4
        assert set(packed.metrics) == set(one.metrics)
        for name in packed.metrics:
            if not is_timing(name):
                np.testing.assert_array_equal(packed.metrics[name], one.metrics[name], err_msg=f"{run.output} {name}")
        np.testing.assert_array_equal(packed.bytes_sent_by_kind, one.bytes_sent_by_kind)  # per client


def test_a_packing_sweep_refuses_nothing_below_its_clients_but_one_per_rank_does(tmp_path):
    """Fewer ranks than clients: refused with one client per rank, naming clients_per_rank as the way out."""
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"config: {QUICKSTART}\noutput_dir: {tmp_path / 'out'}\ngrid:\n  clients: [3]\n  rounds: [1]\n  seed: [0]\n"
    )
    result = mpiexec(2, "-m", "mpicd", "pack", str(path), timeout=120)
    assert result.returncode == 2
    assert "each run needs 3 ranks but the job has 2" in result.stderr and "clients_per_rank: balanced" in result.stderr
