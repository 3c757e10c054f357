"""Where a run starts (mpicd/run/startpoint.py) and per-run checkpoints (mpicd/run/checkpoint.py): the rule
on synthetic inputs, checkpoint retention across runs sharing a folder, then the issue's three
reproductions and the interrupts under real MPI.

Reproductions (quick-start data, 2 ranks):
a) stale checkpoints: a killed run leaves checkpoints, its results file is deleted; a new run to the
   same --out is refused (not resumed from another run's state); --overwrite starts a new run, which
   is killed and resumed, and equals an uninterrupted run;
b) silent overwrite: a second run to an existing file is refused, the file untouched;
c) --resume on a complete file of another config is refused; of the same config: nothing to do.
Interrupts: Ctrl-C through jobs/mpirun.sh, SIGTERM to every rank, Ctrl-C of jobs/sweep.sh, and
``mpicd sweep ... | head -1``.

One MPI job (tests/drivers/runs.py) writes the uninterrupted references every comparison uses.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import yaml

from mpicd.algorithms import resolve
from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError, to_mapping
from mpicd.mpi import launch
from mpicd.results.reader import Results
from mpicd.results.verify import verify
from mpicd.run import checkpoint
from mpicd.run.startpoint import decide, Found, inspect, Start

from conftest import DRIVERS, QUICKSTART, ROOT, is_timing, mpi_env, mpiexec

RUN = "0123456789abcdef"
OTHER = "fedcba9876543210"
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def resolved(*overrides: str) -> dict:
    """A resolved config as a results file stores it (the algorithm section with all its keys)."""
    config = load_config(QUICKSTART, ["clients=2", "rounds=10", *overrides])
    cls, params = resolve(config.algorithm)
    return {**to_mapping(config), "algorithm": {"name": cls.name, **to_mapping(params)}}


def found(tmp_path, state="results", **fields) -> Found:
    values = {"run_id": RUN, "config": resolved(), "algorithm": "codistill", "completed": 7, "rounds": 10}
    if state != "results":
        values = {}
    values.update(fields)
    return Found(tmp_path / "run.h5", state, **values)


def refused(found_: Found, config: dict, mode: str, key: str = "--out") -> str:
    with pytest.raises(ConfigError) as err:
        decide(found_, config, mode)
    assert err.value.key == key, str(err.value)
    return str(err.value)


# ------------------------------------------------------------------ startpoint.decide


@pytest.mark.parametrize("mode", ["new", "resume", "overwrite"])
def test_nothing_there_starts_a_new_run(tmp_path, mode):
    start = decide(found(tmp_path, "absent"), resolved(), mode)
    assert start.fresh and not start.complete and start.bound == 0 and HEX16.match(start.run_id)
    assert start.clear == (mode == "overwrite")
    assert start.note == ("no results file yet; starting at round 1" if mode == "resume" else "")
    assert decide(found(tmp_path, "absent"), resolved(), mode).run_id != start.run_id  # drawn anew


@pytest.mark.parametrize("mode", ["new", "resume"])
def test_checkpoints_without_their_results_file_are_refused(tmp_path, mode):
    stale = found(tmp_path, "absent", checkpoints={OTHER: {0: [7, 6], 1: [7, 6]}})
    message = refused(stale, resolved(), mode)
    folder = str(checkpoint.folder_for(tmp_path / "run.h5"))
    assert folder in message and OTHER in message and "--overwrite" in message, message
    assert "rounds 6, 7" in message and "missing" in message, message


def test_overwrite_clears_stale_checkpoints(tmp_path):
    stale = found(tmp_path, "absent", checkpoints={OTHER: {0: [7, 6], 1: [7, 6]}})
    start = decide(stale, resolved(), "overwrite")
    assert start.fresh and start.clear and start.run_id != OTHER and HEX16.match(start.run_id)
    assert str(checkpoint.folder_for(tmp_path / "run.h5")) in start.note and OTHER in start.note, start.note


@pytest.mark.parametrize("mode", ["new", "resume"])
@pytest.mark.parametrize("with_checkpoints", [False, True])
def test_an_unreadable_file_is_refused(tmp_path, mode, with_checkpoints):
    held = {RUN: {0: [3, 2]}} if with_checkpoints else {}
    bad = found(tmp_path, "unreadable", error="file signature not found", checkpoints=held)
    message = refused(bad, resolved(), mode)
    assert str(tmp_path / "run.h5") in message and "file signature not found" in message, message
    assert "--overwrite" in message and "not a readable results file" in message, message
    assert (str(checkpoint.folder_for(tmp_path / "run.h5")) in message) == with_checkpoints, message


def test_overwrite_replaces_an_unreadable_file(tmp_path):
    start = decide(found(tmp_path, "unreadable", error="truncated"), resolved(), "overwrite")
    assert start.fresh and start.clear and f"replacing {tmp_path / 'run.h5'} (unreadable)" == start.note


def test_overwriting_a_private_run_says_its_releases_stay_out_and_an_older_private_file_is_not_resumed(tmp_path):
    """--overwrite of a private run: a new run (new id, so a new nonce), and a line that the old run's
    releases stay out of its epsilon; --resume of a private file without privacy_nonce (an mpicd
    before nonces draws other noise): refused, naming --overwrite."""
    private = resolved("privacy={noise_multiplier: 1}")
    start = decide(found(tmp_path, config=private, nonce=RUN), private, "overwrite")
    assert start.fresh and start.run_id != RUN
    assert f"private releases of run {RUN} stay with the peers" in start.note and "epsilon" in start.note, start.note
    assert "private releases" not in decide(found(tmp_path), resolved(), "overwrite").note
    for run_id in (RUN, None):  # None: older still, without run ids: not started again either
        message = refused(found(tmp_path, config=private, run_id=run_id), private, "resume", key="--resume")
        assert "without run nonces" in message and "--overwrite" in message, message
    assert decide(found(tmp_path, config=private, nonce=RUN), private, "resume") == Start(False, RUN, bound=7)


@pytest.mark.parametrize("completed", [7, 10])
def test_a_new_run_on_an_existing_file_is_refused_naming_the_run_and_both_options(tmp_path, completed):
    message = refused(found(tmp_path, completed=completed), resolved(), "new")
    assert f"{tmp_path / 'run.h5'} already holds a run" in message, message
    assert f"codistill, {completed} of 10 rounds done, run {RUN}" in message, message
    assert "--resume" in message and "--overwrite" in message, message


def test_the_refusal_lists_the_files_checkpoints(tmp_path):
    message = refused(found(tmp_path, checkpoints={RUN: {0: [7, 6], 1: [7, 6]}}), resolved(), "new")
    assert f"4 of run {RUN} (rounds 6, 7)" in message, message


@pytest.mark.parametrize("completed", [7, 10])
def test_resume_with_another_value_is_refused_naming_the_key(tmp_path, completed):
    message = refused(found(tmp_path, completed=completed), resolved("algorithm.lambda=0.5"), "resume", "--resume")
    assert "algorithm.lambda: the file has 1.0, this run 0.5" in message, message
    assert str(tmp_path / "run.h5") in message and "--overwrite" in message, message


@pytest.mark.parametrize("completed", [7, 10])
def test_resume_with_another_algorithm_is_refused_naming_it(tmp_path, completed):
    message = refused(found(tmp_path, completed=completed), resolved("algorithm=fedavg"), "resume", "--resume")
    assert "algorithm: the file has codistill, this run fedavg" in message, message


def test_resume_with_an_unreadable_config_is_refused(tmp_path):
    message = refused(found(tmp_path, config=None), resolved(), "resume", "--resume")
    assert "the file's config cannot be read" in message, message


@pytest.mark.parametrize("operational", ["checkpoint.every=3", "debug.fail_round=5", "device=cpu", "output=x.h5"])
def test_resume_ignores_operational_keys(tmp_path, operational):
    assert decide(found(tmp_path), resolved(operational), "resume") == Start(False, RUN, bound=7)


def test_resume_of_a_complete_file_of_the_same_config_has_nothing_to_do(tmp_path):
    start = decide(found(tmp_path, completed=10), resolved(), "resume")
    assert start.complete and not start.fresh and not start.clear and start.run_id == RUN


def test_resume_continues_the_files_run_up_to_its_completed_rounds(tmp_path):
    start = decide(found(tmp_path, checkpoints={RUN: {0: [7, 6]}, OTHER: {0: [9, 8]}}), resolved(), "resume")
    assert start == Start(False, RUN, bound=7)


def test_resume_of_a_file_lacking_a_dataset_this_version_writes_is_refused(tmp_path):
    # a file of an mpicd from before /diag: this version's per-round rows could not be written into it
    written = {"metrics/minority_acc", "metrics/recall", "comm/bytes_sent", "comm/teacher", "diag/cka_teacher"}
    from mpicd.results.columns import columns

    every = frozenset(col.path for col in columns(2))
    assert written <= every
    complete = decide(found(tmp_path, num_classes=2, datasets=every), resolved(), "resume")
    assert complete == Start(False, RUN, bound=7)
    message = refused(
        found(tmp_path, num_classes=2, datasets=every - {"diag/cka_teacher"}), resolved(), "resume", "--resume"
    )
    assert "lacks /diag/cka_teacher" in message and "--overwrite" in message


def test_resume_of_a_file_without_run_id_starts_again_with_a_note(tmp_path):
    start = decide(found(tmp_path, run_id=None), resolved(), "resume")
    assert start.fresh and not start.clear and not start.complete and HEX16.match(start.run_id)
    assert str(tmp_path / "run.h5") in start.note and "round 1" in start.note and "run ids" in start.note


def test_overwrite_replaces_an_existing_run(tmp_path):
    start = decide(found(tmp_path, checkpoints={RUN: {0: [7, 6]}}), resolved("algorithm=fedavg"), "overwrite")
    assert start.fresh and start.clear and start.run_id != RUN
    assert start.note.startswith(f"replacing {tmp_path / 'run.h5'} (codistill, 7 of 10 rounds done, run {RUN})")
    assert "deleting the checkpoints" in start.note


def test_an_unknown_mode_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        decide(found(tmp_path), resolved(), "append")


# ------------------------------------------------------------------ startpoint.inspect on tiny files


def tiny_results(path: Path, **attrs) -> Path:
    values = {"config": yaml.safe_dump(resolved()), "run_id": RUN, "algorithm": "codistill", "rounds": 10}
    values.update(completed_rounds=4, **attrs)
    with h5py.File(path, "w") as f:
        for key, value in values.items():
            if value is not None:
                f.attrs[key] = value
    return path


def test_inspect_reads_a_results_file_and_its_checkpoints(tmp_path):
    path = tiny_results(tmp_path / "run.h5")
    checkpoint.save(checkpoint.folder_for(path), 1, 4, {}, RUN)
    seen = inspect(path)
    assert (seen.state, seen.run_id, seen.algorithm, seen.completed, seen.rounds) == (
        "results",
        RUN,
        "codistill",
        4,
        10,
    )
    assert seen.config == resolved() and seen.checkpoints == {RUN: {1: [4]}}
    assert decide(seen, resolved(), "resume") == Start(False, RUN, bound=4)


def test_inspect_of_nothing_sees_stale_checkpoints(tmp_path):
    checkpoint.save(checkpoint.folder_for(tmp_path / "run.h5"), 0, 2, {}, OTHER)
    seen = inspect(tmp_path / "run.h5")
    assert seen.state == "absent" and seen.checkpoints == {OTHER: {0: [2]}}


@pytest.mark.parametrize("content", [b"", b"not HDF5 at all\n", None])
def test_inspect_calls_a_file_it_cannot_read_unreadable(tmp_path, content):
    path = tmp_path / "run.h5"
    if content is None:  # HDF5 with a results file's attributes but its config
        tiny_results(path, config=None)
    else:
        path.write_bytes(content)
    seen = inspect(path)
    assert seen.state == "unreadable" and seen.error, seen
    refused(seen, resolved(), "resume")


def test_inspect_of_a_file_with_a_malformed_run_id_treats_it_as_without_one(tmp_path):
    assert inspect(tiny_results(tmp_path / "run.h5", run_id="not-a-run-id")).run_id is None


# ------------------------------------------------------------------ checkpoint retention


def state(tag: str) -> dict:
    return {"tag": tag, "tensor": torch.arange(3)}


def test_another_runs_checkpoints_are_neither_deleted_nor_counted(tmp_path):
    folder = tmp_path / "run.h5.ckpt"
    for n in (7, 8):  # another run, newer rounds: had they counted, this run would keep none of its own
        checkpoint.save(folder, 0, n, state("other"), OTHER)
    shutil.copyfile(checkpoint.path_for(folder, 0, 7, OTHER), checkpoint.path_for(folder, 0, 6, OTHER))  # a third
    checkpoint.save(folder, 1, 1, state("rank 1"), RUN)
    (folder / "rank0.round9.pt").write_bytes(b"from an mpicd without run ids")
    for n in (1, 2, 3, 4):
        checkpoint.save(folder, 0, n, state(f"mine {n}"), RUN)
        assert checkpoint.available(folder, 0, RUN) == [n, n - 1][: min(n, 2)]
    assert checkpoint.inventory(folder) == {OTHER: {0: [8, 7, 6]}, RUN: {0: [4, 3], 1: [1]}, None: {0: [9]}}
    assert checkpoint.held(folder, 0) == [9, 8, 7, 6, 4, 3]
    assert checkpoint.load(folder, 0, 8, OTHER, torch.device("cpu"))["tag"] == "other"


def test_discard_deletes_only_this_run_and_rank_past_the_point(tmp_path):
    folder = tmp_path / "run.h5.ckpt"
    for n in (3, 4):
        checkpoint.save(folder, 0, n, state("mine"), RUN)
        checkpoint.save(folder, 1, n, state("mine"), RUN)
        checkpoint.save(folder, 0, n, state("other"), OTHER)
    checkpoint.discard(folder, 0, RUN, newer_than=3)
    assert checkpoint.inventory(folder) == {RUN: {0: [3], 1: [4, 3]}, OTHER: {0: [4, 3]}}
    checkpoint.discard(folder, 0, RUN)
    assert checkpoint.inventory(folder) == {RUN: {1: [4, 3]}, OTHER: {0: [4, 3]}}


def test_remove_all_deletes_every_runs_checkpoints_and_torn_files(tmp_path):
    folder = tmp_path / "run.h5.ckpt"
    checkpoint.save(folder, 0, 2, state("mine"), RUN)
    checkpoint.save(folder, 1, 5, state("other"), OTHER)
    (folder / "rank0.round9.pt").write_bytes(b"old")
    (folder / f".rank0.round3.{RUN}.pt.4242.tmp").write_bytes(b"torn")
    assert checkpoint.remove_all(folder) == 4
    assert not folder.exists()
    checkpoint.save(folder, 0, 2, state("mine"), RUN)
    (folder / "notes.txt").write_text("someone else's")
    assert checkpoint.remove_all(folder) == 1
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]
    assert checkpoint.remove_all(tmp_path / "nothing.h5.ckpt") == 0


def test_load_refuses_a_checkpoint_copied_under_another_runs_name(tmp_path):
    folder = tmp_path / "run.h5.ckpt"
    saved = checkpoint.save(folder, 0, 3, state("mine"), RUN)
    cpu = torch.device("cpu")
    assert checkpoint.load(folder, 0, 3, RUN, cpu)["run_id"] == RUN
    shutil.copyfile(saved, checkpoint.path_for(folder, 0, 3, OTHER))
    assert checkpoint.available(folder, 0, OTHER) == [3]
    with pytest.raises(checkpoint.Refused, match="MAC does not verify"):  # its MAC binds it to its run
        checkpoint.load(folder, 0, 3, OTHER, cpu)
    checkpoint.path_for(folder, 0, 2, RUN).write_bytes(b"torn")
    assert checkpoint.load(folder, 0, 2, RUN, cpu) is None


def test_a_failed_save_leaves_no_temporary_file_and_the_older_checkpoints(tmp_path):
    folder = tmp_path / "run.h5.ckpt"
    checkpoint.save(folder, 0, 1, state("mine"), RUN)
    checkpoint.save(folder, 0, 2, state("mine"), RUN)

    def disk_full():
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        checkpoint.save(folder, 0, 3, state("mine"), RUN, during=disk_full)
    assert sorted(p.name for p in folder.iterdir()) == [f"rank0.round1.{RUN}.pt", f"rank0.round2.{RUN}.pt"]


# ------------------------------------------------------------------ under MPI

SHORT = ("clients=2", "rounds=10")
LONG_ROUNDS = 300  # rounds of ~0.01 s (at 60 a run could end before a Ctrl-C sent after round 2 landed)
LONG = ("clients=2", f"rounds={LONG_ROUNDS}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Uninterrupted runs of SHORT and LONG (one MPI job)."""
    folder = tmp_path_factory.mktemp("startpoint")
    files = {"short": folder / "short.h5", "long": folder / "long.h5"}
    jobs = [["run", str(QUICKSTART), *SHORT, "--out", str(files["short"])]]
    jobs.append(["run", str(QUICKSTART), *LONG, "--out", str(files["long"])])
    result = mpiexec(2, str(DRIVERS / "runs.py"), json.dumps(jobs), timeout=300)
    assert result.returncode == 0, f"runs driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return files


def quickstart(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """``mpiexec -n 2 python -m mpicd run QUICKSTART ARGS`` whatever its exit status."""
    return mpiexec(2, "-m", "mpicd", "run", str(QUICKSTART), *args, timeout=timeout)


def messages(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("mpicd: config error")]


def attr(path: Path, key: str):
    with h5py.File(path, "r") as f:
        value = f.attrs[key]
    return value.decode() if isinstance(value, bytes) else value


def datasets(path: Path) -> dict[str, np.ndarray]:
    out = {}

    def keep(name, obj):  # returns None: visititems stops at the first value returned
        if isinstance(obj, h5py.Dataset):
            out[name] = obj[()]

    with h5py.File(path, "r") as f:
        f.visititems(keep)
    assert len(out) > 30, sorted(out)
    return out


# What an interrupted and resumed run may hold differently from an uninterrupted one: timings; the
# bytes outside rounds, which add up every job's start-up agreements (a resumed run had two start-ups
# and lost the traffic between its last checkpoint and the crash); and among the attributes its run
# id, resumed_at, start-up seconds and the config as the first job wrote it (debug keys: operational).
OUTSIDE = "comm/outside_rounds"
CHANNELS = "comm/channel_bytes"  # the same, per channel: only the payload's are the uninterrupted run's
OWN_ATTRS = {"run_id", "resumed_at", "startup_seconds", "config"}


def assert_same_as(path: Path, reference: Path) -> None:
    mine, theirs = datasets(path), datasets(reference)
    assert set(mine) == set(theirs)
    for name, values in theirs.items():
        if is_timing(name) or name in (OUTSIDE, CHANNELS):
            continue
        assert values.dtype == mine[name].dtype and values.shape == mine[name].shape, name
        np.testing.assert_array_equal(mine[name], values, err_msg=name)  # NaN == NaN here
    assert (mine[OUTSIDE] >= theirs[OUTSIDE]).all(), (mine[OUTSIDE], theirs[OUTSIDE])
    with h5py.File(reference, "r") as f:
        payload = [n.decode() for n in f["comm/channel"][()]].index("payload")
    np.testing.assert_array_equal(mine[CHANNELS][:, payload], theirs[CHANNELS][:, payload])
    with h5py.File(path, "r") as a, h5py.File(reference, "r") as b:
        assert set(a.attrs) == set(b.attrs)
        for key in set(b.attrs) - OWN_ATTRS:
            np.testing.assert_array_equal(a.attrs[key], b.attrs[key], err_msg=key)


def assert_resumed(stdout: str, run_id: str, at: int, folder: Path) -> None:
    """The one ``mpicd: resuming ...`` line names the run, the round it resumes at and the folder."""
    lines = [line for line in stdout.splitlines() if line.startswith("mpicd: resuming")]
    assert len(lines) == 1, stdout
    assert f"at round {at} from {folder}" in lines[0] and run_id in lines[0], lines[0]


def assert_complete_and_verified(path: Path, rounds: int) -> Results:
    res = Results(path)
    assert res.completed_rounds == rounds and np.isfinite(res.metrics["minority_acc"]).all()
    result = verify(path)
    assert result.ok and not result.notes, result.text()
    assert not checkpoint.folder_for(path).exists(), "a complete run keeps no checkpoints"
    return res


def test_stale_checkpoints_are_refused_then_overwritten_and_the_new_run_resumes(tmp_path, reference):
    out = tmp_path / "run.h5"
    folder = checkpoint.folder_for(out)
    killed = quickstart(*SHORT, "debug.fail_rank=1", "debug.fail_round=7", "debug.fail_kind=kill", "--out", str(out))
    assert killed.returncode != 0, killed.stdout + killed.stderr
    first = attr(out, "run_id")
    assert checkpoint.inventory(folder) == {first: {0: [7, 6], 1: [7, 6]}}
    out.unlink()

    refusal = quickstart(*SHORT, "--out", str(out))
    assert refusal.returncode == 2, refusal.stdout + refusal.stderr
    (message,) = messages(refusal)
    assert str(folder) in message and first in message and "--overwrite" in message, message
    assert not out.exists() and checkpoint.inventory(folder) == {first: {0: [7, 6], 1: [7, 6]}}

    again = quickstart(
        *SHORT, "debug.fail_rank=1", "debug.fail_round=3", "debug.fail_kind=kill", "--out", str(out), "--overwrite"
    )
    assert again.returncode != 0, again.stdout + again.stderr
    second = attr(out, "run_id")
    assert second != first and HEX16.match(second)
    assert checkpoint.inventory(folder) == {second: {0: [3, 2], 1: [3, 2]}}  # the old run's are gone
    assert attr(out, "completed_rounds") == 3
    crashed = verify(out)
    assert crashed.ok, crashed.text()

    resumed = quickstart(*SHORT, "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_resumed(resumed.stdout, second, 4, folder)
    res = assert_complete_and_verified(out, 10)
    assert list(res.attrs["resumed_at"]) == [3] and res.attrs["run_id"] == second
    assert_same_as(out, reference["short"])


def test_a_second_run_to_the_same_file_is_refused_and_the_file_kept(tmp_path, reference):
    out = tmp_path / "a.h5"
    shutil.copy2(reference["short"], out)  # the first run's file
    before, mtime, run_id = out.read_bytes(), out.stat().st_mtime_ns, attr(out, "run_id")
    second = quickstart(*SHORT, "--out", str(out))
    assert second.returncode == 2, second.stdout + second.stderr
    (message,) = messages(second)
    assert f"{out} already holds a run (codistill, 10 of 10 rounds done, run {run_id})" in message, message
    assert "--resume" in message and "--overwrite" in message, message
    assert "results written" not in second.stdout
    assert out.read_bytes() == before and out.stat().st_mtime_ns == mtime
    assert not checkpoint.folder_for(out).exists()

    replaced = quickstart(*SHORT, "--out", str(out), "--overwrite")
    assert replaced.returncode == 0, replaced.stdout + replaced.stderr
    assert f"mpicd: replacing {out} (codistill, 10 of 10 rounds done, run {run_id})" in replaced.stdout
    assert attr(out, "run_id") != run_id and HEX16.match(attr(out, "run_id"))
    assert_complete_and_verified(out, 10)


def test_resume_on_a_complete_file_of_another_algorithm_is_refused_and_of_the_same_does_nothing(tmp_path, reference):
    out = tmp_path / "done.h5"
    shutil.copy2(reference["short"], out)
    before, mtime = out.read_bytes(), out.stat().st_mtime_ns
    other = quickstart(*SHORT, "algorithm=fedavg", "--out", str(out), "--resume")
    assert other.returncode == 2, other.stdout + other.stderr
    (message,) = messages(other)
    assert "algorithm: the file has codistill, this run fedavg" in message and str(out) in message, message

    same = quickstart(*SHORT, "--out", str(out), "--resume")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "nothing to do" in same.stdout and "results written" not in same.stdout, same.stdout
    assert out.read_bytes() == before and out.stat().st_mtime_ns == mtime


# ------------------------------------------------------------------ interrupts


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, from /proc/<pid>/task/*/children."""
    found_, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            for task in os.listdir(f"/proc/{parent}/task"):
                with open(f"/proc/{parent}/task/{task}/children") as fh:
                    kids = [int(k) for k in fh.read().split()]
                found_ += kids
                todo += kids
        except (FileNotFoundError, ProcessLookupError):
            pass
    return found_


def command(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().split("\0")
    except (FileNotFoundError, ProcessLookupError):
        return []


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL to a job we started and all of its descendants (a failed test leaves nothing running)."""
    for pid in [*descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=30)


def wait_for(proc: subprocess.Popen, log: Path, text: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                kill_tree(proc)
            pytest.fail(f"{text!r} never appeared (exit {proc.returncode}):\n{log.read_text()}")
        time.sleep(0.02)


def finish(proc: subprocess.Popen, log: Path, timeout: float = 120) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        pytest.fail(f"the job did not end within {timeout} s of the interrupt:\n{log.read_text()}")


# the resume command as typed: through jobs/mpirun.sh, or bare mpirun (the console script's name)
STOPPED = re.compile(
    r"^mpicd: stopped on request after round (\d+); resume with: (?:jobs/mpirun\.sh 2|mpirun -n 2 mpicd) run .* --resume$",
    re.M,
)


def stopped_round(text: str, rounds: int) -> int:
    stops = [int(m) for m in STOPPED.findall(text)]
    assert len(stops) == 1, text
    assert 2 <= stops[0] < rounds, text
    return stops[0]


def assert_checkpointed_at(out: Path, n: int) -> str:
    run_id = attr(out, "run_id")
    assert attr(out, "completed_rounds") == n
    held = checkpoint.inventory(checkpoint.folder_for(out))
    assert set(held) == {run_id} and all(rounds[0] == n for rounds in held[run_id].values()), held
    assert set(held[run_id]) == {0, 1}, held
    return run_id


def resume_and_compare(out: Path, n: int, run_id: str, reference: Path) -> None:
    resumed = quickstart(*LONG, "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert_resumed(resumed.stdout, run_id, n + 1, checkpoint.folder_for(out))
    res = assert_complete_and_verified(out, LONG_ROUNDS)
    assert list(res.attrs["resumed_at"]) == [n]
    assert_same_as(out, reference)


def as_in_a_terminal() -> None:
    """A script started from a terminal has SIGINT at its default; one started in the background of
    a non-interactive shell (``cmd &``, e.g. a CI runner's) inherits it ignored, and bash cannot
    trap a signal ignored on entry. Ctrl-C tests start their script with the terminal's default."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_of_mpirun_sh_stops_after_a_round_and_resume_completes(tmp_path, reference):
    out, log = tmp_path / "run.h5", tmp_path / "run.log"
    with open(log, "w") as output:
        proc = subprocess.Popen(
            ["bash", "jobs/mpirun.sh", "2", "run", str(QUICKSTART), *LONG, "--out", str(out)],
            cwd=ROOT,
            env=mpi_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=as_in_a_terminal,
        )
    wait_for(proc, log, "round    2/")
    os.kill(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does to the script
    assert finish(proc, log) == 130, log.read_text()
    n = stopped_round(log.read_text(), LONG_ROUNDS)
    resume_and_compare(out, n, assert_checkpointed_at(out, n), reference["long"])


def test_sigterm_to_every_rank_stops_after_a_round_and_resume_completes(tmp_path, reference):
    out, log, codes = tmp_path / "run.h5", tmp_path / "run.log", tmp_path / "codes"
    codes.mkdir()
    # each rank through sh, which writes the rank's exit status to codes/rank<R> and exits with it
    record = 'python=$1; shift; "$python" "$@"; rc=$?; echo $rc > "$CODES/rank$OMPI_COMM_WORLD_RANK"; exit $rc'
    with open(log, "w") as output:
        proc = subprocess.Popen(
            launch.command(2, ["sh", "-c", record, "sh", sys.executable, "-m", "mpicd"], launcher="mpirun")
            + ["run", str(QUICKSTART), *LONG, "--out", str(out)],
            cwd=ROOT,
            env={**mpi_env(), "CODES": str(codes)},
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_for(proc, log, "round    2/")
    ranks = [pid for pid in descendants(proc.pid) if command(pid)[:3] == [sys.executable, "-m", "mpicd"]]
    assert len(ranks) == 2, ranks
    for pid in ranks:
        os.kill(pid, signal.SIGTERM)
    assert finish(proc, log) != 0, log.read_text()
    assert {p.name: p.read_text().strip() for p in codes.iterdir()} == {"rank0": "130", "rank1": "130"}
    n = stopped_round(log.read_text(), LONG_ROUNDS)
    resume_and_compare(out, n, assert_checkpointed_at(out, n), reference["long"])


def sweep_file(folder: Path, grid: dict) -> Path:
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump({"config": str(QUICKSTART), "output_dir": str(folder / "out"), "grid": grid}))
    return path


def test_ctrl_c_of_a_sweep_stops_it_and_the_rerun_resumes_and_completes(tmp_path):
    sweep = sweep_file(tmp_path, {"clients": [2], "rounds": [LONG_ROUNDS, 2]})  # run 0 is interrupted; run 1 is short
    outs = [tmp_path / "out" / f"{i:04d}_clients=2_rounds={rounds}.h5" for i, rounds in enumerate((LONG_ROUNDS, 2))]
    log = tmp_path / "sweep.log"
    with open(log, "w") as output:
        proc = subprocess.Popen(
            ["bash", "jobs/sweep.sh", str(sweep)],
            cwd=ROOT,
            env=mpi_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=as_in_a_terminal,
        )
    wait_for(proc, log, "round    2/")
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C reaches its whole foreground process group
    assert finish(proc, log) == 130, log.read_text()
    text = log.read_text()
    assert "=== sweep interrupted at run 0 " in text and f"continue with: bash jobs/sweep.sh {sweep}" in text, text
    assert "=== run 1" not in text and not outs[1].exists(), text
    n = stopped_round(text, LONG_ROUNDS)
    run_id = assert_checkpointed_at(outs[0], n)

    again = subprocess.run(
        ["bash", "jobs/sweep.sh", str(sweep)], cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=400
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert_resumed(again.stdout, run_id, n + 1, checkpoint.folder_for(outs[0]))
    assert again.stdout.count("=== run ") == 2 and "sweep complete" in again.stdout, again.stdout
    for out, rounds in zip(outs, (LONG_ROUNDS, 2)):
        assert_complete_and_verified(out, rounds)
    assert list(Results(outs[0]).attrs["resumed_at"]) == [n] and list(Results(outs[1]).attrs["resumed_at"]) == []


def test_sweep_listing_into_head_has_no_broken_pipe(tmp_path):
    """Enough output (400 runs, long paths: over 64 KiB) that mpicd still writes after head -1 has
    gone; stdout block-buffered, as in a terminal's pipeline."""
    env = mpi_env()
    env.pop("PYTHONUNBUFFERED")
    folder = tmp_path / ("x" * 200)
    folder.mkdir()
    sweep = sweep_file(folder, {"seed": list(range(400))})
    result = subprocess.run(
        f"{sys.executable} -m mpicd sweep {sweep} | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert re.fullmatch(r"\s+0  ranks\s+4  pending  \S+/0000_seed=0\.h5  seed=0\n", result.stdout), result.stdout
