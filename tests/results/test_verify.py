"""``mpicd verify FILE...`` (mpicd/results/verify.py): real runs' files pass; a copy broken in exactly one of
the promises verify claims to check fails (exit 1) naming that problem and no other.

One MPI job of 3 ranks (tests/drivers/runs.py) writes the three files every test starts from:
co-distillation, FedAvg, and co-distillation with ``eval.every=2`` (rounds 2, 4 and the last, 5,
evaluated; rounds 1 and 3 hold NaN metrics). The expected bytes are derived here by hand from the
quick-start MLP's layer shapes, not read from mpicd. The corruptions are checked in-process through
``mpicd.cli.main`` (the entry point of ``python -m mpicd``); the exit statuses of the real command
are checked once for good files, a non-HDF5 file and a missing one.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import h5py
import numpy as np
import pytest
import yaml

from mpicd import cli
from mpicd.mpi.channels import CHANNELS
from mpicd.results.columns import is_scale

from conftest import DRIVERS, QUICKSTART, ROOT, mpi_env, mpicd_run, mpiexec

RANKS, ROUNDS, EVERY = 3, 5, 2
EVALUATED = [1, 3, 4]  # 0-based rounds 2 and 4 (every 2nd) and 5 (the last) of the eval.every=2 run
# The quick-start model, by hand from mpicd/models/networks.py's mlp(): the 30 breast-cancer features ->
# Linear(30, 64) -> ReLU -> Linear(64, D = 200) -> Tanh, then the head Linear(200, C = 2).
D = 200
MLP_P = (30 * 64 + 64) + (64 * D + D) + (D * 2 + 2)
FEDAVG_BYTES = 4 * (MLP_P + 1)  # Allreduce of [n_i theta_i ; n_i], float32: sent = received, per rank-round
MESSAGE = 4 * D  # co-distillation: one (1, D) float32 vector per student served, one from its teacher
HELD_OUT = (
    "test_acc",
    "balanced_acc",
    "minority_acc",
    "personal_acc",
    "val_acc",
    "val_balanced_acc",
    "val_minority_acc",
    "val_personal_acc",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("verify")
    common = ["run", str(QUICKSTART), f"clients={RANKS}", f"rounds={ROUNDS}"]
    files = {
        "codistill": (folder / "codistill.h5", []),
        "fedavg": (folder / "fedavg.h5", ["algorithm=fedavg"]),
        "every": (folder / "every.h5", [f"eval.every={EVERY}"]),
    }
    jobs = [[*common, *extra, "--out", str(path)] for path, extra in files.values()]
    result = mpiexec(RANKS, str(DRIVERS / "runs.py"), json.dumps(jobs), timeout=300)
    assert result.returncode == 0, f"runs driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return {name: path for name, (path, _) in files.items()}


def verdict(capsys, *paths) -> tuple[int, list[str], list[str], str]:
    """(exit status, problems, notes, output) of ``mpicd verify PATHS``, in this process."""
    code = cli.main(["verify", *map(str, paths)])
    out = capsys.readouterr().out
    problems = [line[len("  problem: ") :] for line in out.splitlines() if line.startswith("  problem: ")]
    notes = [line[len("  note: ") :] for line in out.splitlines() if line.startswith("  note: ")]
    return code, problems, notes, out


def broken(source, tmp_path, change, name="broken.h5"):
    """A copy of ``source`` with ``change(h5py.File)`` applied in place."""
    path = tmp_path / name
    shutil.copyfile(source, path)
    with h5py.File(path, "r+") as f:
        change(f)
    return path


def kind_index(f, kind: str) -> int:
    return [k.decode() if isinstance(k, bytes) else k for k in f["comm/bytes_sent"].attrs["kinds"]].index(kind)


def add_bytes(f, side: str, r: int, c: int, kind: str, delta: int, total: bool = True) -> None:
    """``delta`` more bytes of ``kind`` in round r for client c, and in its total unless ``total`` is False."""
    k = kind_index(f, kind)
    f[f"comm/bytes_{side}"][r, c, k] += delta
    if total:
        f[f"metrics/bytes_{side}"][r, c] += delta


def students(f, r: int, c: int) -> int:
    return int((f["comm/teacher"][r] == c).sum())


def assert_one_problem(capsys, path, pattern: str) -> str:
    code, problems, _, out = verdict(capsys, path)
    assert code == 1, out
    assert len(problems) == 1 and re.fullmatch(pattern, problems[0]), out
    assert out.startswith(f"{path}: 1 problem(s)"), out
    return problems[0]


# ------------------------------------------------------------------ the files as written


def test_the_runs_files_hold_what_the_tests_assume(runs):
    """Independent of verify: the hand-derived bytes, the teachers and the NaN pattern of eval.every."""
    with h5py.File(runs["fedavg"], "r") as f:
        assert int(f.attrs["num_parameters"]) == MLP_P == 15_386
        p = kind_index(f, "allreduce")
        assert (f["comm/bytes_sent"][:, :, p] == FEDAVG_BYTES).all() and (f["comm/bytes_recv"][:, :, p] == 61_548).all()
        assert (f["comm/bytes_sent"][()].sum(axis=2) == FEDAVG_BYTES).all()  # no other kind moved a byte
        assert (f["comm/teacher"][()] == -1).all()
    with h5py.File(runs["codistill"], "r") as f:
        teacher, p = f["comm/teacher"][()], kind_index(f, "p2p")
        assert (teacher != np.arange(RANKS)).all() and ((teacher >= 0) & (teacher < RANKS)).all()
        for r in range(ROUNDS):
            for c in range(RANKS):
                assert f["comm/bytes_sent"][r, c, p] == MESSAGE * students(f, r, c)
                assert f["comm/bytes_recv"][r, c, p] == MESSAGE
        served = {students(f, r, c) for r in range(ROUNDS) for c in range(RANKS)}
        assert {0, 1} <= served and max(served) >= 2, served  # teachers of 0, 1 and 2 students occur
    with h5py.File(runs["every"], "r") as f:
        for name in HELD_OUT:
            values = f[f"metrics/{name}"][()]
            assert np.isfinite(values[EVALUATED]).all() and np.isnan(values[[0, 2]]).all(), name


@pytest.mark.parametrize("name", ["codistill", "fedavg", "every"])
def test_personal_acc_is_the_recalls_weighted_by_the_clients_own_training_counts(runs, name):
    """Recomputed here, client by client, from /metrics/recall and /partition/train_counts:
    sum_c p_c recall_c / sum_c p_c, p_c the client's training images of class c (every class is in
    the quick start's test and validation splits)."""
    with h5py.File(runs[name], "r") as f:
        counts = f["partition/train_counts"][()]
        assert (counts > 0).all() and not (counts == counts[:1]).all()  # clients weigh differently
        for prefix in ("", "val_"):
            recall, personal = f[f"metrics/{prefix}recall"][()], f[f"metrics/{prefix}personal_acc"][()]
            for r in range(ROUNDS):
                for c in range(RANKS):
                    if name == "every" and r not in EVALUATED:
                        assert np.isnan(personal[r, c]) and np.isnan(recall[r, c]).all()
                        continue
                    p = [int(n) for n in counts[c]]
                    expected = sum(n * float(v) for n, v in zip(p, recall[r, c])) / sum(p)
                    assert personal[r, c] == pytest.approx(expected, rel=1e-12, abs=1e-12), (prefix, r, c)


def test_real_files_are_ok_from_the_command_line(runs):
    paths = [str(runs[name]) for name in ("codistill", "fedavg", "every")]
    result = subprocess.run(
        [sys.executable, "-m", "mpicd", "verify", *paths],
        cwd=ROOT,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    for path, algorithm in zip(paths, ("codistill", "fedavg", "codistill")):
        assert re.fullmatch(
            rf"{re.escape(path)}: ok \(run [0-9a-f]{{16}}, {algorithm}, {ROUNDS} of {ROUNDS} rounds\)", lines.pop(0)
        ), result.stdout
    assert lines == ["3 of 3 files ok"], result.stdout
    assert "problem" not in result.stdout and "note" not in result.stdout


@pytest.mark.parametrize("name", ["codistill", "fedavg", "every"])
def test_each_real_file_is_ok(capsys, runs, name):
    code, problems, notes, out = verdict(capsys, runs[name])
    assert (code, problems, notes) == (0, [], []), out


def test_a_single_client_fedavg_file_is_ok(capsys, tmp_path):
    """One rank alone still runs FedAvg's Allreduce (4 (P + 1) bytes each way, as its declaration
    says for N = 1): verify must not expect 0 bytes because there is no peer."""
    out = tmp_path / "single.h5"
    mpicd_run(1, QUICKSTART, out, "clients=1", "rounds=2", "algorithm=fedavg")
    with h5py.File(out, "r") as f:
        p = kind_index(f, "allreduce")
        assert (f["comm/bytes_sent"][:, :, p] == FEDAVG_BYTES).all()
    code, problems, _, text = verdict(capsys, out)
    assert (code, problems) == (0, []), text


# ------------------------------------------------------------------ one broken promise each


def nan_at(name, r, c):
    def change(f):
        f[f"metrics/{name}"][r, c] = np.nan

    return change


def value_at(name, r, c, value=0.5):
    def change(f):
        f[f"metrics/{name}"][r, c] = value

    return change


@pytest.mark.parametrize(
    "source, change, pattern",
    [
        # a completed, evaluated round without a finite held-out metric
        ("codistill", nan_at("minority_acc", 2, 1), r"/metrics/minority_acc is not finite in evaluated rounds 3"),
        ("every", nan_at("minority_acc", 3, 0), r"/metrics/minority_acc is not finite in evaluated rounds 4"),
        ("every", nan_at("test_acc", 4, 2), r"/metrics/test_acc is not finite in evaluated rounds 5"),  # the last
        ("fedavg", nan_at("val_minority_acc", 0, 2), r"/metrics/val_minority_acc is not finite in evaluated rounds 1"),
        ("codistill", value_at("balanced_acc", 1, 0, np.inf), r"/metrics/balanced_acc is not finite .* rounds 2"),
        # a value in a round that eval.every did not evaluate
        ("every", value_at("minority_acc", 2, 1), r"/metrics/minority_acc holds values in rounds not evaluated: 3"),
        ("every", value_at("val_acc", 0, 0), r"/metrics/val_acc holds values in rounds not evaluated: 1"),
        # a non-finite training loss in a round whose update was not skipped
        ("codistill", nan_at("train_loss", 3, 2), r"/metrics/train_loss is not finite in rounds 4"),
    ],
    ids=[
        "nan-evaluated",
        "nan-evaluated-every",
        "nan-last-round-every",
        "nan-validation",
        "inf-evaluated",
        "value-not-evaluated",
        "validation-value-not-evaluated",
        "nan-loss",
    ],
)
def test_a_broken_metric_is_named(capsys, tmp_path, runs, source, change, pattern):
    assert_one_problem(capsys, broken(runs[source], tmp_path, change), pattern)


def test_a_missing_metric_is_named(capsys, tmp_path, runs):
    path = broken(runs["codistill"], tmp_path, lambda f: f.__delitem__("metrics/val_balanced_acc"))
    assert_one_problem(capsys, path, r"/metrics/val_balanced_acc is missing")


@pytest.mark.parametrize("prefix", ["", "val_"])
def test_a_personal_acc_that_is_not_the_weighted_recall_is_named(capsys, tmp_path, runs, prefix):
    """A finite value, but not sum_c p_c recall_c / sum_c p_c (0.5 is no client's weighted recall here)."""
    path = broken(runs["codistill"], tmp_path, value_at(f"{prefix}personal_acc", 2, 1, 0.5))
    assert_one_problem(
        capsys,
        path,
        rf"/metrics/{prefix}personal_acc is not sum_c p_c {prefix}recall_c / sum_c p_c "
        r"\(p: /partition/train_counts\) in rounds 3",
    )


def test_uniform_weights_are_not_the_personal_acc(capsys, tmp_path, runs):
    """The balanced accuracy (uniform p) written as personal_acc: verify tells them apart."""

    def change(f):
        f["metrics/personal_acc"][...] = f["metrics/balanced_acc"][()]

    assert_one_problem(
        capsys, broken(runs["fedavg"], tmp_path, change), r"/metrics/personal_acc is not .* rounds 1, .*"
    )


def test_a_personal_acc_missing_beside_the_others_is_named(capsys, tmp_path, runs):
    path = broken(runs["codistill"], tmp_path, lambda f: f.__delitem__("metrics/personal_acc"))
    assert_one_problem(capsys, path, r"/metrics/personal_acc is missing")


def test_a_file_older_than_personal_acc_is_ok_with_a_note(capsys, tmp_path, runs):
    def change(f):
        for name in ("personal_acc", "val_personal_acc", "train_personal_acc"):
            del f[f"metrics/{name}"]

    code, problems, notes, out = verdict(capsys, broken(runs["every"], tmp_path, change))
    assert (code, problems) == (0, []), out
    assert notes == ["no /metrics/personal_acc (an older mpicd): personalised accuracy not checked"], out


def test_a_skipped_update_may_have_a_nan_loss_and_fewer_bytes(capsys, tmp_path, runs):
    """on_nonfinite: skip: the client's loss may be NaN and, as a teacher, it sends its students
    empty messages (0 bytes each way of the p2p pair): at most the declared bytes is fine."""

    def change(f):
        r = 2
        teacher = int(next(c for c in range(RANKS) if students(f, r, c) > 0))
        f["metrics/skipped"][r, teacher] = 1
        f["metrics/train_loss"][r, teacher] = np.nan
        add_bytes(f, "sent", r, teacher, "p2p", -MESSAGE * students(f, r, teacher))
        for student in np.nonzero(f["comm/teacher"][r] == teacher)[0]:
            add_bytes(f, "recv", r, int(student), "p2p", -MESSAGE)

    code, problems, _, out = verdict(capsys, broken(runs["codistill"], tmp_path, change))
    assert (code, problems) == (0, []), out


def test_a_skipped_round_may_not_send_more_than_declared(capsys, tmp_path, runs):
    def change(f):
        f["metrics/skipped"][1, 0] = 1
        add_bytes(f, "sent", 1, 2, "allreduce", 4)

    path = broken(runs["fedavg"], tmp_path, change)
    assert_one_problem(
        capsys,
        path,
        rf"bytes of kind allreduce \(declared {FEDAVG_BYTES} sent, {FEDAVG_BYTES} received\) differ in rounds 2",
    )


def crashed_after(done: int):
    """Make the file look like a run that crashed with ``done`` rounds in it: every per-round row from
    ``done`` on back to its fill value, and /comm/outside_rounds and /comm/channel_bytes (written at
    the end) never written (-1); the dimension scales as they were made."""

    def change(f):
        f.attrs.modify("completed_rounds", done)
        for group in ("metrics", "comm"):
            for name, dset in f[group].items():
                if name not in ("outside_rounds", "channel_bytes") and not is_scale(dset):
                    dset[done:] = dset.fillvalue
        f["comm/outside_rounds"][...] = -1
        f["comm/channel_bytes"][...] = -1

    return change


def test_a_crashed_file_is_ok(capsys, tmp_path, runs):
    code, problems, _, out = verdict(capsys, broken(runs["codistill"], tmp_path, crashed_after(2)))
    assert (code, problems) == (0, []), out
    assert "2 of 5 rounds" in out


def test_a_torn_row_right_after_completed_rounds_is_allowed(capsys, tmp_path, runs):
    """A crash between a round's row write and the update of completed_rounds leaves that row."""

    def change(f):
        crashed_after(2)(f)
        f["metrics/test_acc"][2, 1] = 0.5
        f["comm/teacher"][2, 0] = 1

    code, problems, _, out = verdict(capsys, broken(runs["codistill"], tmp_path, change))
    assert (code, problems) == (0, []), out


@pytest.mark.parametrize("name, value", [("metrics/test_acc", 0.5), ("comm/teacher", 1), ("metrics/recall", 0.25)])
def test_data_two_rows_past_completed_rounds_is_named(capsys, tmp_path, runs, name, value):
    def change(f):
        crashed_after(2)(f)
        f[name][3, 1] = value  # row 3 (round 4): two past the 2 completed rounds

    path = broken(runs["codistill"], tmp_path, change)
    assert_one_problem(capsys, path, rf"/{name} holds data past completed_rounds \(2\) in rounds 4")


def test_one_byte_too_many_of_one_kind_is_named_with_the_declared_bytes(capsys, tmp_path, runs):
    """Per kind and total changed together (so the total is still the sum): only the declaration catches it."""
    with h5py.File(runs["codistill"], "r") as f:
        r, c = next((r, c) for r in range(ROUNDS) for c in range(RANKS) if students(f, r, c) == 2)
    path = broken(runs["codistill"], tmp_path, lambda f: add_bytes(f, "sent", r, c, "p2p", 1))
    pattern = rf"bytes of kind p2p \(declared {2 * MESSAGE} sent, {MESSAGE} received\) differ in rounds {r + 1}"
    assert_one_problem(capsys, path, pattern)


def test_one_byte_too_few_received_is_named(capsys, tmp_path, runs):
    path = broken(runs["fedavg"], tmp_path, lambda f: add_bytes(f, "recv", 3, 1, "allreduce", -1))
    assert_one_problem(
        capsys,
        path,
        rf"bytes of kind allreduce \(declared {FEDAVG_BYTES} sent, {FEDAVG_BYTES} received\) differ in rounds 4",
    )


@pytest.mark.parametrize("side", ["sent", "recv"])
def test_a_total_that_is_not_the_sum_of_its_kinds_is_named(capsys, tmp_path, runs, side):
    def change(f):
        f[f"metrics/bytes_{side}"][1, 2] += 1

    path = broken(runs["codistill"], tmp_path, change)
    assert_one_problem(capsys, path, rf"/metrics/bytes_{side} differs from the sum over kinds of /comm/bytes_{side}")


def test_one_kind_off_alone_breaks_both_the_sum_and_the_declaration(capsys, tmp_path, runs):
    path = broken(runs["fedavg"], tmp_path, lambda f: add_bytes(f, "sent", 0, 0, "allreduce", 1, total=False))
    code, problems, _, out = verdict(capsys, path)
    assert code == 1 and len(problems) == 2, out
    assert problems[0] == "/metrics/bytes_sent differs from the sum over kinds of /comm/bytes_sent", out
    assert re.fullmatch(
        rf"bytes of kind allreduce \(declared {FEDAVG_BYTES} sent, .*\) differ in rounds 1", problems[1]
    )


def scale_all_bytes(factor: int):
    def change(f):
        for name in ("comm/bytes_sent", "comm/bytes_recv", "metrics/bytes_sent", "metrics/bytes_recv"):
            f[name][...] = f[name][()] * factor

    return change


def test_bytes_scaled_consistently_still_differ_from_the_declared_payload(capsys, tmp_path, runs):
    """Twice FedAvg's bytes everywhere, totals and kinds alike: every sum still holds, so only the
    declaration, 4 (P + 1) with P from the model's layer shapes, can tell."""
    path = broken(runs["fedavg"], tmp_path, scale_all_bytes(2))
    rounds = ", ".join(str(r + 1) for r in range(ROUNDS))
    pattern = (
        rf"bytes of kind allreduce \(declared {FEDAVG_BYTES} sent, {FEDAVG_BYTES} received\) differ in rounds {rounds}"
    )
    assert_one_problem(capsys, path, pattern)


def test_codistill_bytes_scaled_consistently_are_named(capsys, tmp_path, runs):
    path = broken(runs["codistill"], tmp_path, scale_all_bytes(2))
    problems = verdict(capsys, path)[1]
    assert problems and all(
        re.fullmatch(r"bytes of kind p2p \(declared \d+ sent, 800 received\) differ in rounds .*", p) for p in problems
    )


def test_bytes_booked_under_another_kind_are_named(capsys, tmp_path, runs):
    """FedAvg's Allreduce counted as an Allgather: same totals, wrong kinds."""

    def change(f):
        for side in ("sent", "recv"):
            add_bytes(f, side, 2, 0, "allreduce", -FEDAVG_BYTES, total=False)
            add_bytes(f, side, 2, 0, "allgather", FEDAVG_BYTES, total=False)

    code, problems, _, out = verdict(capsys, broken(runs["fedavg"], tmp_path, change))
    assert code == 1, out
    assert sorted(problems) == [
        "bytes of kind allgather (declared 0 sent, 0 received) differ in rounds 3",
        f"bytes of kind allreduce (declared {FEDAVG_BYTES} sent, {FEDAVG_BYTES} received) differ in rounds 3",
    ], out


@pytest.mark.parametrize("new", ["self", RANKS, -2])
def test_a_teacher_that_is_not_another_client_is_named(capsys, tmp_path, runs, new):
    """The bytes are moved along with the teacher (its old teacher sends one message fewer; as its own
    teacher a client would send itself one), so the teacher column is the only thing wrong."""

    def change(f):
        r, c = 3, 1
        old = int(f["comm/teacher"][r, c])
        f["comm/teacher"][r, c] = c if new == "self" else new
        add_bytes(f, "sent", r, old, "p2p", -MESSAGE)
        if new == "self":
            add_bytes(f, "sent", r, c, "p2p", MESSAGE)

    assert_one_problem(
        capsys, broken(runs["codistill"], tmp_path, change), r"/comm/teacher names no other client in rounds 4"
    )


def with_config(section: str | None, key: str, value):
    """Set one key of the stored config (parsed and dumped again), leaving config_hash as it was."""

    def change(f):
        config = yaml.safe_load(f.attrs["config"])
        where = config[section] if section else config
        assert key in where and where[key] != value, (section, key, where)
        where[key] = value
        f.attrs["config"] = yaml.safe_dump(config, sort_keys=False)

    return change


@pytest.mark.parametrize(
    "section, key, value", [("algorithm", "lambda", 0.5), (None, "seed", 3), ("train", "lr", 0.01)]
)
def test_a_config_changed_without_its_hash_is_named(capsys, tmp_path, runs, section, key, value):
    with h5py.File(runs["codistill"], "r") as f:
        stored = f.attrs["config_hash"]
    problem = assert_one_problem(
        capsys,
        broken(runs["codistill"], tmp_path, with_config(section, key, value)),
        r"config_hash '[0-9a-f]{64}' is not the hash of the stored config \([0-9a-f]{64}\)",
    )
    assert problem.startswith(f"config_hash '{stored}' ") and problem.count(stored) == 1, problem


def test_a_changed_hash_is_named(capsys, tmp_path, runs):
    path = broken(runs["fedavg"], tmp_path, lambda f: f.attrs.__setitem__("config_hash", "0" * 64))
    assert_one_problem(capsys, path, r"config_hash '0{64}' is not the hash of the stored config \([0-9a-f]{64}\)")


@pytest.mark.parametrize(
    "section, key, value",
    [
        (None, "output", "elsewhere.h5"),
        ("checkpoint", "every", 3),
        ("train", "eval_batch_size", 64),
        (None, "device", "cpu"),
    ],
)
def test_an_operational_key_is_outside_the_hash(capsys, tmp_path, runs, section, key, value):
    """The hash covers what a run computes: where it wrote its file or checkpoints, or on what, is not part of it."""
    code, problems, _, out = verdict(capsys, broken(runs["codistill"], tmp_path, with_config(section, key, value)))
    assert (code, problems) == (0, []), out


@pytest.mark.parametrize(
    "run_id", ["XYZ", "0123456789abcde", "0123456789ABCDEF", "0123456789abcdeg", "0123456789abcdef0"]
)
def test_a_run_id_that_is_not_16_hex_digits_is_named(capsys, tmp_path, runs, run_id):
    path = broken(runs["codistill"], tmp_path, lambda f: f.attrs.__setitem__("run_id", run_id))
    assert_one_problem(capsys, path, rf"run_id '{run_id}' is not 16 hex digits")


def test_a_file_with_a_hash_but_no_run_id_is_named(capsys, tmp_path, runs):
    path = broken(runs["codistill"], tmp_path, lambda f: f.attrs.__delitem__("run_id"))
    assert_one_problem(capsys, path, r"run_id None is not 16 hex digits")


def test_a_file_without_run_identity_is_ok_with_a_note(capsys, tmp_path, runs):
    def change(f):
        del f.attrs["run_id"], f.attrs["config_hash"]

    code, problems, notes, out = verdict(capsys, broken(runs["codistill"], tmp_path, change))
    assert (code, problems) == (0, []), out
    assert notes == ["no run id or config hash: written by an mpicd older than run identities"], out
    assert ": ok (run ?, codistill, 5 of 5 rounds)" in out


def test_a_file_without_payload_sizes_is_ok_with_a_note(capsys, tmp_path, runs):
    code, problems, notes, out = verdict(
        capsys, broken(runs["fedavg"], tmp_path, lambda f: f.attrs.__delitem__("payload_sizes"))
    )
    assert (code, problems) == (0, []) and len(notes) == 1 and "payload_sizes" in notes[0], out


def with_size(name: str, value_of):
    def change(f):
        sizes = yaml.safe_load(f.attrs["payload_sizes"])
        sizes[name] = value_of(sizes[name])
        f.attrs.modify("payload_sizes", yaml.safe_dump(sizes, sort_keys=False))

    return change


def test_a_declaration_of_another_model_is_named(capsys, tmp_path, runs):
    # the model's parameter count alone changed: its declaration no longer matches the file's attrs
    with h5py.File(runs["fedavg"], "r") as f:
        parameters = int(f.attrs["num_parameters"])
    path = broken(runs["fedavg"], tmp_path, lambda f: f.attrs.modify("num_parameters", parameters + 1))
    assert_one_problem(
        capsys, path, rf"payload_sizes declares P = {parameters}, but the file's num_parameters is {parameters + 1}: .*"
    )
    # a declaration of one more parameter: named, and so are the bytes it no longer explains
    code, problems, _, out = verdict(capsys, broken(runs["fedavg"], tmp_path, with_size("P", lambda p: p + 1), "p.h5"))
    assert code == 1 and problems[0].startswith(f"payload_sizes declares P = {parameters + 1}, but"), out
    assert len(problems) > 1, out
    path = broken(runs["codistill"], tmp_path, with_size("D", lambda d: d * 2), "d.h5")
    code, problems, _, out = verdict(capsys, path)
    assert code == 1 and any(p.startswith("payload_sizes declares D = ") for p in problems), out


def test_more_completed_rounds_than_rows_is_named(capsys, tmp_path, runs):
    path = broken(runs["codistill"], tmp_path, lambda f: f.attrs.modify("completed_rounds", ROUNDS + 1))
    assert_one_problem(
        capsys, path, rf"{re.escape(str(path))}: completed_rounds is {ROUNDS + 1}, but /metrics holds {ROUNDS} rounds"
    )


def test_more_completed_rounds_than_the_runs_rounds_is_named(capsys, tmp_path, runs):
    path = broken(runs["codistill"], tmp_path, lambda f: f.attrs.modify("rounds", ROUNDS - 1))
    assert_one_problem(capsys, path, rf"completed_rounds is {ROUNDS}, more than the run's {ROUNDS - 1} rounds")


@pytest.mark.parametrize("value", [2, -1])
def test_skipped_other_than_0_or_1_is_named(capsys, tmp_path, runs, value):
    path = broken(runs["codistill"], tmp_path, value_at("skipped", 2, 1, value))
    assert_one_problem(capsys, path, r"/metrics/skipped holds values other than 0 and 1")


def test_a_complete_file_without_its_outside_bytes_is_named(capsys, tmp_path, runs):
    def change(f):
        f["comm/outside_rounds"][1, 0] = -1

    path = broken(runs["every"], tmp_path, change)
    assert_one_problem(capsys, path, r"a complete file without its bytes outside rounds \(/comm/outside_rounds is -1\)")


# ------------------------------------------------------------------ bytes per channel (mpicd.mpi.channels)


def channel_index(f, name: str) -> int:
    return [n.decode() for n in f["comm/channel"][()]].index(name)


def test_the_channels_hold_the_payload_in_rounds_and_the_rows_reach_only_the_writer(runs):
    """By hand: FedAvg's payload channel carries its rounds' Allreduce and nothing else, on every
    rank; the rows go to rank 0 alone (the others send theirs, receive none); the stop agreement is
    one int64 per round, sent and received by every rank; every channel's class is its declared one."""
    with h5py.File(runs["fedavg"], "r") as f:
        names = [n.decode() for n in f["comm/channel"][()]]
        values = f["comm/channel_bytes"][()]
        classes = [c.decode() if isinstance(c, bytes) else c for c in f["comm/channel_bytes"].attrs["classes"]]
    at = {n: i for i, n in enumerate(names)}
    assert classes[at["payload"]] == classes[at["stop"]] == classes[at["layout"]] == "protocol"
    assert classes[at["rows"]] == classes[at["progress"]] == classes[at["placement"]] == "instrumentation"
    for rank in range(RANKS):
        assert tuple(values[rank, at["payload"]]) == (ROUNDS * FEDAVG_BYTES, ROUNDS * FEDAVG_BYTES)
        assert tuple(values[rank, at["stop"]]) == (8 * ROUNDS + 8, 8 * ROUNDS + 8)  # + the checkpoints' removal
        assert values[rank, at["rows"], 0] > 0 and values[rank, at["progress"], 0] == 8 * 3 * ROUNDS
        assert (values[rank, at["rows"], 1] > 0) == (rank == 0) and (values[rank, at["progress"], 1] > 0) == (rank == 0)
        assert values[rank, at["diagnostics"]].tolist() == [0, 0]
    assert values[0, at["progress"], 1] == 8 * 3 * ROUNDS * RANKS


def test_rows_received_by_a_rank_that_is_not_the_writer_are_named(capsys, tmp_path, runs):
    def change(f):
        f["comm/channel_bytes"][1, channel_index(f, "rows"), 1] += 800
        f["comm/outside_rounds"][1, 1] += 800  # the totals still add up: only the reach is wrong

    path = broken(runs["codistill"], tmp_path, change)
    assert_one_problem(capsys, path, r"channel 'rows' reaches only the writer, but rank\(s\) \[1\] received rows bytes")


def test_payload_bytes_outside_the_rounds_are_named(capsys, tmp_path, runs):
    def change(f):
        f["comm/channel_bytes"][2, channel_index(f, "payload"), 0] += 16
        f["comm/channel_bytes"][2, channel_index(f, "layout"), 0] -= 16  # the rank's total unchanged

    path = broken(runs["fedavg"], tmp_path, change)
    want = ROUNDS * FEDAVG_BYTES
    assert_one_problem(
        capsys,
        path,
        rf"rank 2: payload bytes sent \({want + 16}\) are not its bytes in rounds \({want}\): something else crossed "
        r"MPI inside a round",
    )


def test_channels_that_do_not_add_up_to_the_ranks_bytes_are_named(capsys, tmp_path, runs):
    def change(f):
        f["comm/channel_bytes"][0, channel_index(f, "progress"), 1] -= 8

    path = broken(runs["every"], tmp_path, change)
    assert_one_problem(
        capsys, path, r"rank 0: its channels' bytes recv \(\d+\) are not its bytes in rounds plus outside them .*"
    )


def test_a_channel_of_another_class_is_named(capsys, tmp_path, runs):
    def change(f):
        classes = [c.decode() if isinstance(c, bytes) else c for c in f["comm/channel_bytes"].attrs["classes"]]
        classes[channel_index(f, "progress")] = "protocol"
        f["comm/channel_bytes"].attrs["classes"] = np.array(classes, dtype=h5py.string_dtype())

    path = broken(runs["codistill"], tmp_path, change)
    assert_one_problem(
        capsys, path, r"/comm/channel_bytes says channel 'progress' is protocol, but it is declared instrumentation"
    )


def test_a_complete_file_without_its_channel_bytes_is_named(capsys, tmp_path, runs):
    def change(f):
        f["comm/channel_bytes"][2, 0, 0] = -1

    path = broken(runs["codistill"], tmp_path, change)
    assert_one_problem(capsys, path, r"a complete file without its bytes per channel \(/comm/channel_bytes is -1\)")


def test_a_file_older_than_channels_is_ok_with_a_note(capsys, tmp_path, runs):
    def change(f):
        del f["comm/channel_bytes"]

    code, problems, notes, out = verdict(capsys, broken(runs["codistill"], tmp_path, change))
    assert code == 0 and problems == [], out
    assert "no /comm/channel_bytes (an older mpicd): bytes not checked per channel" in notes


# ------------------------------------------------------------------ files that are not results


def run_verify(*paths) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mpicd", "verify", *map(str, paths)],
        cwd=ROOT,
        env=mpi_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_file_that_is_not_hdf5_exits_1_naming_it(tmp_path):
    path = tmp_path / "notes.h5"
    path.write_text("not an HDF5 file\n")
    result = run_verify(path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (
        result.stdout.startswith(f"{path}: 1 problem(s)")
        and f"problem: {path}: not a readable HDF5 file" in result.stdout
    )


def test_a_missing_file_exits_1_naming_it(tmp_path):
    path = tmp_path / "absent.h5"
    result = run_verify(path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [f"{path}: 1 problem(s)", f"  problem: {path}: no such file"]


def test_one_bad_file_among_good_ones_fails_the_command(capsys, tmp_path, runs):
    bad = broken(runs["codistill"], tmp_path, value_at("skipped", 0, 0, 7))
    code, problems, _, out = verdict(capsys, runs["fedavg"], bad, runs["every"])
    assert code == 1 and len(problems) == 1, out
    assert out.splitlines()[-1] == "2 of 3 files ok"


def test_channels_lists_each_channel_with_its_class_and_bytes(capsys, runs):
    """``mpicd verify --channels``: one line per channel of the file; FedAvg's payload line holds
    the bytes derived by hand (every rank, every round: one Allreduce of the weighted parameters)."""
    code = cli.main(["verify", "--channels", str(runs["fedavg"])])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = {line.split()[1]: line.split()[2:] for line in out.splitlines() if line.startswith("  channel: ")}
    assert set(lines) == set(CHANNELS), out
    total = RANKS * ROUNDS * FEDAVG_BYTES
    assert lines["payload"] == ["protocol", "payload", "sent", f"{total:,d}", "received", f"{total:,d}"], out
    assert lines["rows"][:2] == ["instrumentation", "instrumentation"] and lines["stop"][:2] == ["protocol", "control"]
    assert lines["diagnostics"][2:] == ["sent", "0", "received", "0"], out
    assert "  channel: " not in cli.main(["verify", str(runs["fedavg"])]) * "" + capsys.readouterr().out
