"""The batch scripts under a real Slurm (the session fixture ``slurm``: slurmctld + slurmd + munge
on loopback): srun and mpirun launches, a job array of a sweep, resubmission, a wrong --ntasks,
scancel. Jobs are submitted exactly as a user would, from the project folder, with sbatch."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from mpicd.results.reader import Results

from conftest import QUICKSTART, ROOT, is_timing, mpi_env

JOB_TIMEOUT = 240


def job_env(slurm, **more) -> dict:
    """What sbatch exports to the job: the test cluster, root's Open MPI consent, unbuffered Python."""
    return {
        **mpi_env(),
        **{k: v for k, v in slurm.env.items() if k in ("SLURM_CONF", "PATH")},
        "PYTHONUNBUFFERED": "1",
        **more,
    }


@pytest.fixture(autouse=True)
def no_job_outlives_its_test(request):
    """A test that submits jobs leaves none behind, whether it passed or failed (a --wait that
    timed out leaves its job running): every job still queued is cancelled when the test ends."""
    yield
    if "slurm" in request.fixturenames:
        left = request.getfixturevalue("slurm").cancel_all()
        assert not left, f"jobs {left} still queued 30 s after scancel"


def sbatch(slurm, *args: str, env: dict, wait: bool = True, timeout: float = JOB_TIMEOUT) -> tuple[int, str]:
    """Submit from the project folder; (sbatch's exit status, which with --wait is the job's, job id)."""
    command = ["sbatch", "--parsable", *(["--wait"] if wait else []), *args]
    try:
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        pytest.fail(
            f"{' '.join(command)} did not finish within {timeout} s\n{err.stdout}\n{err.stderr}\n{slurm.logs()}"
        )
    job = done.stdout.strip().split(";")[0].splitlines()[0] if done.stdout.strip() else ""
    assert job.isdigit(), f"sbatch did not submit: {done.stdout}\n{done.stderr}\n{slurm.logs()}"
    return done.returncode, job


def complete(path: Path, rounds: int) -> None:
    """The results file holds ``rounds`` valid rows: finite losses and accuracies, counted bytes."""
    results = Results(path)
    assert results.completed_rounds == rounds
    valid_rows(path, rounds)


def valid_rows(path: Path, rows: int) -> None:
    with h5py.File(path, "r") as f:
        for name in ("train_loss", "test_acc", "minority_acc"):
            values = f["metrics"][name][:rows]
            assert np.isfinite(values).all(), (name, values)
        assert (f["metrics"]["bytes_sent"][:rows] >= 0).all()


@pytest.mark.slurm
def test_one_run_with_srun_pmix(slurm, tmp_path):
    out = tmp_path / "srun.h5"
    rc, job = sbatch(
        slurm,
        "--ntasks=2",
        f"--output={tmp_path}/%j.out",
        "slurm/mpicd.sbatch",
        str(QUICKSTART),
        "clients=2",
        "rounds=2",
        "--out",
        str(out),
        env=job_env(slurm),
    )
    log = (tmp_path / f"{job}.out").read_text()
    assert rc == 0, log
    assert "launching srun --mpi=pmix --kill-on-bad-exit=1 python -m mpicd run" in log
    assert sorted(re.findall(r"rank (\d) on ", log)) == ["0", "1"], log  # one MPI world of two ranks
    complete(out, 2)


@pytest.mark.slurm
def test_one_run_with_mpirun_inside_the_allocation(slurm, tmp_path):
    out = tmp_path / "mpirun.h5"
    rc, job = sbatch(
        slurm,
        "--ntasks=2",
        f"--output={tmp_path}/%j.out",
        "slurm/mpicd.sbatch",
        str(QUICKSTART),
        "clients=2",
        "rounds=2",
        "--out",
        str(out),
        env=job_env(slurm, MPICD_LAUNCHER="mpirun"),
    )
    log = (tmp_path / f"{job}.out").read_text()
    assert rc == 0, log
    assert re.search(
        r"launching \S*mpi(run|exec) -n 2 (--allow-run-as-root )?(-x MPICD_\w+ )*python -m mpicd run", log
    ), log
    complete(out, 2)


@pytest.mark.slurm
def test_a_failed_launch_says_what_to_try(slurm, tmp_path):
    rc, job = sbatch(
        slurm,
        "--ntasks=2",
        f"--output={tmp_path}/%j.out",
        "slurm/mpicd.sbatch",
        str(QUICKSTART),
        "clients=2",
        "rounds=2",
        "--out",
        str(tmp_path / "never.h5"),
        env=job_env(slurm, MPICD_SRUN_ARGS="--mpi=none"),
    )  # Open MPI cannot start without PMIx
    log = (tmp_path / f"{job}.out").read_text()
    assert rc not in (0, 2), log
    hint = log.strip().splitlines()[-1]
    assert hint.startswith("mpicd: srun --mpi=none exited with status"), log
    assert 'MPICD_SRUN_ARGS="--mpi=pmix --kill-on-bad-exit=1"' in hint and "MPICD_LAUNCHER=mpirun" in hint, log
    assert MID_RUN not in log, log


# What launch.sh says when the ranks had started (their "mpicd: rank R on HOST" lines) before the
# launcher failed: a lost node, or a rank that died, not a launch problem (no PMI hint).
MID_RUN = "after the ranks had started: not a launch problem"
KILL_RANK_1_IN_ROUND_2 = ["debug.fail_rank=1", "debug.fail_round=1", "debug.fail_kind=kill"]


@pytest.mark.slurm
def test_a_rank_lost_mid_run_is_not_reported_as_a_failed_launch(slurm, tmp_path):
    """A rank SIGKILLed in its second round: to srun the same as a node lost mid-run (tasks ran,
    then some vanished), which the single-node test cluster cannot do for real."""
    out = tmp_path / "lost.h5"
    rc, job = sbatch(
        slurm,
        "--ntasks=2",
        f"--output={tmp_path}/%j.out",
        "slurm/mpicd.sbatch",
        str(QUICKSTART),
        "clients=2",
        "rounds=3",
        *KILL_RANK_1_IN_ROUND_2,
        "--out",
        str(out),
        env=job_env(slurm),
    )
    log = (tmp_path / f"{job}.out").read_text()
    assert rc not in (0, 2), log
    hint = log.strip().splitlines()[-1]
    assert hint.startswith("mpicd: srun --mpi=pmix --kill-on-bad-exit=1 exited with status"), log
    assert MID_RUN in hint and "resumes from the newest checkpoint" in hint, log
    assert "MPICD_SRUN_ARGS" not in hint and "PMI" not in hint, log
    assert Results(out).completed_rounds == 1


def test_outside_slurm_a_failed_launch_and_a_rank_lost_mid_run_get_different_messages(tmp_path):
    """mpirun, no SLURM_*: a launcher that fails before any rank starts gets the launcher hint; a
    job whose rank dies in round 2 gets the mid-run message instead."""
    env = {k: v for k, v in mpi_env().items() if not k.startswith("SLURM_")}
    env["OMPI_MCA_rmaps_base_oversubscribe"] = "1"
    script = ["bash", "slurm/mpicd.sbatch", str(QUICKSTART), "clients=2"]
    failed = subprocess.run(
        [*script, "rounds=1", "--out", str(tmp_path / "never.h5")],
        cwd=ROOT,
        env={**env, "MPICD_MPIRUN_ARGS": "--no-such-option"},  # mpirun refuses it: no rank starts
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
    )
    assert failed.returncode not in (0, 2), failed.stdout + failed.stderr
    hint = failed.stderr.strip().splitlines()[-1]
    assert re.match(
        r"mpicd: \S*mpi(run|exec) -n 2 (--allow-run-as-root )?(-x MPICD_\w+ )*--no-such-option exited with status", hint
    ), hint
    assert "If the ranks did not start, try MPICD_MPIRUN_ARGS" in hint and MID_RUN not in failed.stderr
    lost = subprocess.run(
        [*script, "rounds=3", *KILL_RANK_1_IN_ROUND_2, "--out", str(tmp_path / "lost.h5")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
    )
    assert lost.returncode not in (0, 2), lost.stdout + lost.stderr
    hint = lost.stderr.strip().splitlines()[-1]
    assert re.match(r"mpicd: \S*mpi(run|exec) -n 2 (--allow-run-as-root )?(-x MPICD_\w+ )*exited with status", hint), (
        hint
    )
    assert MID_RUN in hint, lost.stderr
    assert "MPICD_MPIRUN_ARGS" not in hint, lost.stderr
    assert "mpicd: rank 0 on " in lost.stdout  # the launcher's output still reaches the job's output
    assert Results(tmp_path / "lost.h5").completed_rounds == 1


SWEEP_RUNS = 3


@pytest.fixture(scope="module")
def swept(slurm, tmp_path_factory):
    """A 3-run sweep (2 clients, 2 rounds each) submitted as one job array: (sweep file, folder, job id)."""
    tmp = tmp_path_factory.mktemp("sweep")
    sweep = tmp / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "config": str(QUICKSTART),
                "output_dir": str(tmp / "out"),
                "grid": {
                    "algorithm": [{"name": "local"}, {"name": "fedavg"}, {"name": "codistill"}],
                    "clients": [2],
                    "rounds": [2],
                },
            }
        )
    )
    rc, job = sbatch(
        slurm,
        f"--array=0-{SWEEP_RUNS - 1}",
        "--ntasks=2",
        f"--output={tmp}/first-%A_%a.out",
        "slurm/sweep.sbatch",
        str(sweep),
        env=job_env(slurm),
    )
    assert rc == 0, "\n".join(p.read_text() for p in sorted(tmp.glob("first-*.out")))
    return sweep, tmp, job


def sweep_outputs(sweep: Path) -> list[Path]:
    from mpicd.sweep.grid import load_sweep

    return [run.output for run in load_sweep(sweep)]


@pytest.mark.slurm
def test_job_array_every_task_writes_its_complete_file(swept):
    sweep, tmp, job = swept
    files = sweep_outputs(sweep)
    assert len(files) == SWEEP_RUNS
    for i, path in enumerate(files):
        log = (tmp / f"first-{job}_{i}.out").read_text()
        assert "launching srun" in log and "already complete" not in log, log
        complete(path, 2)
    assert [Results(p).attrs["algorithm"] for p in files] == ["local", "fedavg", "codistill"]


@pytest.mark.slurm
def test_resubmitted_array_reruns_exactly_the_missing_run(slurm, swept):
    sweep, tmp, _ = swept
    files = sweep_outputs(sweep)
    before = [p.stat().st_mtime_ns for p in files]
    files[1].unlink()
    rc, job = sbatch(
        slurm,
        f"--array=0-{SWEEP_RUNS - 1}",
        "--ntasks=2",
        f"--output={tmp}/again-%A_%a.out",
        "slurm/sweep.sbatch",
        str(sweep),
        env=job_env(slurm),
    )
    logs = [(tmp / f"again-{job}_{i}.out").read_text() for i in range(SWEEP_RUNS)]
    assert rc == 0, "\n".join(logs)
    ran = [i for i, log in enumerate(logs) if "launching srun" in log]
    skipped = [i for i, log in enumerate(logs) if f"run {i} of {sweep} is already complete" in log]
    assert (ran, skipped) == ([1], [0, 2]), "\n".join(logs)
    assert [files[i].stat().st_mtime_ns for i in (0, 2)] == [before[0], before[2]]
    complete(files[1], 2)


@pytest.mark.slurm
@pytest.mark.parametrize("script", ["mpicd.sbatch", "sweep.sbatch"])
def test_wrong_ntasks_is_one_message_naming_ntasks(slurm, tmp_path, script):
    out = tmp_path / "never.h5"
    if script == "mpicd.sbatch":  # quickstart has 4 clients
        args = ["--ntasks=3", f"slurm/{script}", str(QUICKSTART), "rounds=2", "--out", str(out)]
    else:
        sweep = tmp_path / "sweep.yaml"
        sweep.write_text(
            yaml.safe_dump({"config": str(QUICKSTART), "output_dir": str(tmp_path), "grid": {"clients": [2]}})
        )
        args = ["--ntasks=3", "--array=0", f"slurm/{script}", str(sweep)]
    rc, _ = sbatch(slurm, f"--output={tmp_path}/%x.out", *args, env=job_env(slurm))
    log = next(tmp_path.glob("*.out")).read_text()
    assert rc == 2, log
    lines = log.strip().splitlines()
    needed = 4 if script == "mpicd.sbatch" else 2
    assert len(lines) == 1 and "this job has 3 (--ntasks=3)" in lines[0] and f"sbatch --ntasks={needed}" in lines[0], (
        log
    )
    assert not any(tmp_path.glob("*.h5"))


def job_processes(job: str) -> list[str]:
    """Command lines of the processes that belong to Slurm job ``job`` (by SLURM_JOB_ID in their environment)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            if f"SLURM_JOB_ID={job}".encode() in environ:
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:  # exited meanwhile
            continue
    return found


@pytest.mark.slurm
def test_scancel_leaves_nothing_running_and_a_readable_file(slurm, tmp_path):
    out = tmp_path / "long.h5"
    log = tmp_path / "long.out"
    _, job = sbatch(
        slurm,
        "--ntasks=2",
        f"--output={log}",
        "slurm/mpicd.sbatch",
        str(QUICKSTART),
        "clients=2",
        "rounds=100000",
        "--out",
        str(out),
        env=job_env(slurm),
        wait=False,
    )
    deadline = time.monotonic() + JOB_TIMEOUT
    while not (log.is_file() and re.search(r"round\s+3/", log.read_text())):
        assert time.monotonic() < deadline, (
            f"no third round within {JOB_TIMEOUT} s:\n{log.read_text() if log.is_file() else ''}"
        )
        time.sleep(0.5)
    assert job_processes(job), "the job's processes are not visible"
    cancel = slurm.run("scancel", job)
    assert cancel.returncode == 0, cancel.stderr
    deadline = time.monotonic() + 60
    while (queued := slurm.run("squeue", "--noheader", f"--jobs={job}").stdout.strip()) or job_processes(job):
        assert time.monotonic() < deadline, f"still running 60 s after scancel: {queued}\n{job_processes(job)}"
        time.sleep(0.5)
    with h5py.File(out, "r") as f:
        rounds = int(f.attrs["completed_rounds"])
    assert 3 <= rounds < 100000
    valid_rows(out, rounds)


def test_scripts_run_outside_slurm_under_set_u(tmp_path):
    """No SLURM_* at all: mpirun is the launcher, the config's clients the rank count."""
    env = {k: v for k, v in mpi_env().items() if not k.startswith("SLURM_")}
    out = tmp_path / "plain.h5"
    done = subprocess.run(
        ["bash", "slurm/mpicd.sbatch", str(QUICKSTART), "clients=2", "rounds=1", "--out", str(out)],
        cwd=ROOT,
        env={**env, "OMPI_MCA_rmaps_base_oversubscribe": "1"},
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(
        r"launching \S*mpi(run|exec) -n 2 (--allow-run-as-root )?(-x MPICD_\w+ )*python -m mpicd run", done.stdout
    ), done.stdout
    complete(out, 1)


def wait_for(condition, timeout: float, what: str, pause: float = 0.25):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(pause)


def job_state(slurm, job: str) -> tuple[str, str]:
    text = slurm.run("scontrol", "show", "job", job).stdout
    state = re.search(r"JobState=(\S+)", text)
    reason = re.search(r"Reason=(\S+)", text)
    return (state.group(1) if state else "GONE"), (reason.group(1) if reason else "")


def follow_requeue(slurm, job: str, log: Path, timeout: float = JOB_TIMEOUT) -> None:
    """Wait until the requeued job has run again and finished. Slurm holds a requeued job for
    cred_expire + 1 s (BeginTime) so that the previous run is gone before the next starts; the
    test cluster sets cred_expire=15 (default 120) and leaves the hold alone: lifting it early
    once let the new step abort at launch. The first run's end passes through transient
    states, so wait for the second launch in the (appended) log first."""

    def finished() -> bool:
        state, _ = job_state(slurm, job)
        relaunched = log.read_text().count("mpicd: launching") >= 2
        return relaunched and state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "GONE")

    wait_for(finished, timeout, f"job {job} to run again and finish after its requeue")


@pytest.mark.slurm
def test_usr1_near_the_time_limit_requeues_and_the_run_resumes_exactly(slurm, tmp_path):
    """Slurm's --signal=B:USR1 reaches the batch script, which passes it to srun and the ranks:
    they checkpoint at a round boundary and exit 75, the script requeues the job, the requeued
    job resumes; the file equals an uninterrupted run's (timings aside)."""
    from mpicd.run import checkpoint

    from conftest import mpicd_run

    args = [str(QUICKSTART), "clients=2", "rounds=600"]  # long enough that USR1 always lands mid-run
    reference = tmp_path / "reference.h5"
    mpicd_run(2, *args[:1], reference, *args[1:], timeout=JOB_TIMEOUT)
    out, log = tmp_path / "requeued.h5", tmp_path / "requeued.out"
    _, job = sbatch(
        slurm,
        "--ntasks=2",
        f"--output={log}",
        "slurm/mpicd.sbatch",
        *args,
        "--out",
        str(out),
        env=job_env(slurm),
        wait=False,
    )
    folder = checkpoint.folder_for(out)
    wait_for(
        lambda: all(max(checkpoint.held(folder, r), default=-1) >= 3 for r in (0, 1)),
        JOB_TIMEOUT,
        "the third round's checkpoint",
    )
    signalled = slurm.run("scancel", "--signal=USR1", "--batch", job)  # what --signal=B:USR1@120 does
    assert signalled.returncode == 0, signalled.stderr
    follow_requeue(slurm, job, log)
    text = log.read_text()
    assert job_state(slurm, job)[0] == "COMPLETED", text
    assert "passing it to the ranks" in text and "requeueing job" in text, text
    assert re.search(r"resuming at round (\d+)", text), text
    a, b = Results(out), Results(reference)
    assert a.completed_rounds == b.completed_rounds == 600
    for name in a.metrics:
        if not is_timing(name):
            np.testing.assert_array_equal(a.metrics[name], b.metrics[name], err_msg=name)
    np.testing.assert_array_equal(a.bytes_sent_by_kind, b.bytes_sent_by_kind)
    assert len(a.attrs["resumed_at"]) == 1 and 3 <= a.attrs["resumed_at"][0] < 600


@pytest.mark.slurm
def test_pack_runs_a_sweep_in_one_allocation(slurm, tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(
        yaml.safe_dump(
            {
                "config": str(QUICKSTART),
                "output_dir": str(tmp_path / "out"),
                "grid": {
                    "algorithm": [{"name": "local"}, {"name": "fedavg"}, {"name": "codistill"}],
                    "clients": [2],
                    "rounds": [2],
                    "seed": [0, 1],
                },
            }
        )
    )
    rc, job = sbatch(
        slurm, "--ntasks=4", f"--output={tmp_path}/%j.out", "slurm/pack.sbatch", str(sweep), env=job_env(slurm)
    )
    log = (tmp_path / f"{job}.out").read_text()
    assert rc == 0, log
    assert "launching srun --mpi=pmix --kill-on-bad-exit=1 python -m mpicd pack" in log, log
    assert "6 pending; 4 ranks = 2 groups of 2" in log, log
    for path in sweep_outputs(sweep):
        complete(path, 2)
    rc, job = sbatch(
        slurm, "--ntasks=4", f"--output={tmp_path}/%j.out", "slurm/pack.sbatch", str(sweep), env=job_env(slurm)
    )
    log = (tmp_path / f"{job}.out").read_text()
    assert rc == 0 and "0 pending" in log, log
