"""The runs ledger (mpicd/report/ledger.py, ``mpicd ledger``): a finished run's scores as one JSON
line. The reference is always the results file: its report, its summarize(), or its metrics read
with h5py and averaged by hand here; sweeps and packs skip what the ledger holds, and refuse an
entry of another config.

Real runs: the quick-start MLP on the built-in breast-cancer data, 2 clients, 12 rounds (so that
the last 10 rounds are a window of their own), with the training-split audit on; one pack of 4."""

import dataclasses
import json
import shutil

import h5py
import numpy as np
import pytest
import yaml

from mpicd.config.sections import ConfigError
from mpicd.report import ledger, ReportError, summarize
from mpicd.sweep.grid import is_done, load_sweep

from conftest import QUICKSTART, mpicd_cli, mpiexec

SET = {"clients": 2, "rounds": 12, "eval.train_split": True}


def write_sweep(folder, algorithms, seeds=(0, 1), **extra):
    path = folder / "sweep.yaml"
    spec = {
        "config": str(QUICKSTART),
        "output_dir": str(folder / "out"),
        "set": SET,
        "grid": {"algorithm": algorithms, "seed": list(seeds)},
        **extra,
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A packed sweep of 4 runs (codistill, fedavg x seeds 0, 1) and its ledger (``mpicd ledger``)."""
    folder = tmp_path_factory.mktemp("ledger")
    sweep = write_sweep(folder, [{"name": "codistill", "lambda": 1.0}, {"name": "fedavg"}])
    packed = mpiexec(2, "-m", "mpicd", "pack", str(sweep), timeout=300)
    assert packed.returncode == 0, packed.stdout + packed.stderr
    written = mpicd_cli("ledger", str(sweep))
    assert written.returncode == 0, written.stderr
    path = folder / "sweep.runs.jsonl"  # the default: the sweep file's name, beside it
    assert written.stdout.strip() == f"ledger: {path}: 4 added, 0 unchanged, 0 incomplete or absent (of 4 runs)"
    return sweep, path, [r.output for r in load_sweep(sweep)]


def report(tmp, *args):
    """``mpicd report ARGS --csv tmp/table.csv``: (stdout without the csv line, the CSV's bytes)."""
    tmp.mkdir()
    result = mpicd_cli("report", *map(str, args), "--csv", str(tmp / "table.csv"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.endswith(f"csv: {tmp / 'table.csv'}\n")
    return result.stdout.rsplit("csv: ", 1)[0], (tmp / "table.csv").read_bytes()


@pytest.mark.parametrize(
    "how", [("--last", "10"), ("--select", "best-val"), ("--split", "train", "--last", "10")], ids=" ".join
)
def test_a_ledger_reports_as_the_files_it_was_written_from(study, tmp_path, how):
    sweep, path, outputs = study
    from_files = report(tmp_path / "h5", *outputs, *how)
    from_ledger = report(tmp_path / "ledger", path, *how)
    assert from_ledger == from_files
    assert "4 runs in 2 cells" in from_files[0] and from_files[1].count(b"\n") == 3  # a header and two cells


def test_every_summary_field_equals_the_files(study):
    """Field by field: the path is <ledger>#<name>; the test curves are kept to 6 significant digits
    and the training split's are not kept."""
    _, path, outputs = study
    for last, select in ((10, "last"), (1, "best-val")):
        for split in ("test", "train"):
            held = ledger.summaries(path, last, select, split)
            assert [s.path.name for s in held] == [f"{path.name}#{o.stem}" for o in outputs]
            for s, output in zip(held, outputs):
                reference = summarize(output, last, select, split)
                for f in dataclasses.fields(reference):
                    mine, theirs = getattr(s, f.name), getattr(reference, f.name)
                    if f.name == "curves" and split == "test":
                        assert mine.keys() == theirs.keys()
                        for m in theirs:
                            np.testing.assert_allclose(mine[m], theirs[m], rtol=5e-6, err_msg=f"{output} {m}")
                    elif f.name == "curves":
                        assert mine == {}
                    elif f.name != "path":
                        assert mine == theirs, (last, select, split, output, f.name)


def test_last10_and_best_val_scores_are_the_files_metrics_averaged_by_hand(study):
    _, path, outputs = study
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["name"] for e in lines] == sorted(o.stem for o in outputs)  # one line per run, sorted by name
    for entry, output in zip(lines, outputs):
        with h5py.File(output, "r") as f:
            done = int(f.attrs["completed_rounds"])
            minority = f["metrics/minority_acc"][:done]  # (rounds, clients)
            val = f["metrics/val_minority_acc"][:done].mean(axis=1)
            assert entry["run_id"] == f.attrs["run_id"] and entry["config_hash"] == f.attrs["config_hash"]
        assert done == 12 and entry["rounds"] == entry["planned_rounds"] == 12
        last10 = entry["views"]["test"]["last10"]
        assert last10["scores"]["minority_acc"] == pytest.approx(minority[-10:].mean(axis=1).mean(), rel=1e-12)
        assert last10["selected_round"] is None
        best = entry["views"]["test"]["best-val"]
        assert best["selected_round"] == int(np.argmax(val))  # the first maximum
        assert best["scores"]["minority_acc"] == pytest.approx(minority[np.argmax(val)].mean(), rel=1e-12)
        assert len(entry["curves"]["minority_acc"]) == 12 and "curves" not in entry["views"]["test"]
        assert len(json.dumps(entry)) < 8000  # the study's 100-round, 4-client runs: ~5.6 KB


def test_last10_means_and_final_values_are_the_files_datasets_averaged_by_hand(study, tmp_path):
    """What the study's tuning (val_balanced_acc), mechanism (diag, the term's share of the loss) and
    privacy tables (epsilon, privacy_stopped at the last round) read from a ledger."""
    _, _, outputs = study
    copy = shutil.copy(outputs[0], tmp_path / "private.h5")
    with h5py.File(copy, "r+") as f:  # as a private run writes them: (round, client)
        f["metrics/epsilon"] = np.array([[0.5 * (r + 1), 0.25 * (r + 1)] for r in range(12)])
        f["metrics/privacy_stopped"] = np.array([[0, 0]] * 11 + [[0, 3]])
        f["metrics/train_loss"][11, 0] = 0.0  # a zero loss: no share that round (NaN, left out)
        val = f["metrics/val_balanced_acc"][2:12]
        extra, loss = f["metrics/train_extra"][2:12], f["metrics/train_loss"][2:12]
    entry = ledger.record(copy)
    means = entry["last10"]
    assert means["metrics/val_balanced_acc"] == pytest.approx(float(np.mean(val)), rel=1e-12)
    shares = [extra[r, c] / loss[r, c] for r in range(10) for c in range(2) if loss[r, c] != 0]
    assert len(shares) == 19
    assert means["metrics/train_extra_share"] == pytest.approx(sum(shares) / 19, rel=1e-12)
    assert means["metrics/epsilon"] == pytest.approx(sum(0.75 * (r + 1) for r in range(2, 12)) / 20, rel=1e-12)
    assert entry["final"] == {"metrics/epsilon": [6.0, 3.0], "metrics/privacy_stopped": [0.0, 3.0]}
    with h5py.File(copy, "r") as f:  # the CPU model its ranks ran on: bit-identical files need the same
        assert entry["cpu"] == sorted({c.decode() for c in f["placement/cpu"][()]}) and entry["cpu"][0]
    assert not any(
        k.endswith("_seconds") or k.startswith("metrics/bytes_") for k in means
    )  # not reproducible / elsewhere


def test_diag_curves_are_the_per_round_client_means_of_diag_to_4_digits(study, tmp_path):
    """/diag as eval.diagnostics writes it, (round, client), NaN where a client had no teacher:
    each round's mean over the clients that have a value, null where none has, to 4 significant digits."""
    _, _, outputs = study
    assert "diag_curves" not in ledger.record(outputs[0])  # diagnostics off: nothing claimed
    copy = shutil.copy(outputs[0], tmp_path / "diag.h5")
    cka = np.full((12, 2), np.nan)
    cka[0] = [0.9, 0.7]  # mean 0.8
    cka[1] = [0.123456, np.nan]  # one client: 0.1235 to 4 digits
    cka[11] = [0.33333, 0.0]  # mean 0.166665 -> 0.1667
    with h5py.File(copy, "r+") as f:  # eval.diagnostics was off: /diag is there, all NaN
        assert np.isnan(f["diag/cka_teacher"][()]).all()
        f["diag/cka_teacher"][...] = cka
    entry = ledger.record(copy)
    curve = entry["diag_curves"]["cka_teacher"]
    assert curve[:2] == [0.8, 0.1235] and curve[11] == 0.1667
    assert curve[2:11] == [None] * 9
    assert entry["last10"]["diag/cka_teacher"] == pytest.approx((0.33333 + 0.0) / 2, rel=1e-12)  # rounds 3-12


def test_a_view_the_ledger_does_not_hold_is_refused_naming_the_views_held(study):
    _, path, _ = study
    for how in (("--last", "5"), ()):  # no --last: the last round alone
        refused = mpicd_cli("report", str(path), *how)
        assert refused.returncode == 2, refused.stdout
        assert "holds each run's scores over the last 10 rounds (--last 10) and the best-validation round" in (
            refused.stderr
        ), refused.stderr
        assert str(path) in refused.stderr


def test_a_run_from_a_ledger_and_its_file_is_refused_naming_both(study):
    _, path, outputs = study
    twice = mpicd_cli("report", str(path), str(outputs[2]), "--last", "10")
    assert twice.returncode == 2
    assert f"{path}#{outputs[2].stem}" in twice.stderr and f"and {outputs[2]}:" in twice.stderr, twice.stderr


def test_update_is_idempotent_skips_incomplete_files_and_refuses_another_config(study, tmp_path):
    _, _, outputs = study
    stopped = shutil.copy(outputs[1], tmp_path / "stopped.h5")
    with h5py.File(stopped, "r+") as f:  # what a run that died after round 5 leaves
        f.attrs["completed_rounds"] = 5
    book = tmp_path / "book.jsonl"
    assert ledger.update(book, [outputs[0], stopped]) == (1, 0, 1)
    first = book.read_bytes()
    assert ledger.update(book, [outputs[0], stopped]) == (0, 1, 1)
    assert book.read_bytes() == first and first.count(b"\n") == 1
    with pytest.raises(ReportError, match=r"stopped.h5: 5 of 12 rounds completed"):
        ledger.record(stopped)

    other = tmp_path / "other" / outputs[0].name  # the same name, another lambda
    other.parent.mkdir()
    shutil.copy(outputs[0], other)
    with h5py.File(other, "r+") as f:
        config = yaml.safe_load(f.attrs["config"])
        config["algorithm"]["lambda"] = 0.5
        f.attrs["config"] = yaml.safe_dump(config)
    with pytest.raises(ReportError) as refused:
        ledger.update(book, [outputs[1], other])
    assert f"{book} holds run {outputs[0].stem} of another config than {other}" in str(refused.value)
    assert "algorithm.lambda: the ledger has 1.0, the file 0.5" in str(refused.value)
    assert book.read_bytes() == first  # nothing written, not even the other run


def test_a_run_without_the_training_split_has_no_train_view(study, tmp_path):
    _, _, outputs = study
    plain = shutil.copy(outputs[0], tmp_path / "plain.h5")
    with h5py.File(plain, "r+") as f:  # what eval.train_split=false writes: NaN
        for name in ("train_acc", "train_balanced_acc", "train_minority_acc", "train_personal_acc", "train_recall"):
            f[f"metrics/{name}"][...] = np.nan
    assert set(ledger.record(plain)["views"]) == {"test"}
    book = tmp_path / "book.jsonl"
    ledger.update(book, [plain])
    with pytest.raises(ReportError, match=r"book.jsonl#plain: no training-split scores"):
        ledger.summaries(book, 10, "last", "train")


def test_personal_acc_is_held_in_every_view_and_a_line_older_than_it_still_loads(study, tmp_path):
    """A line holds personal_acc (test and train views, and its curve) as its file's summary does; a
    line written before personal_acc (no score, no curve) loads, and reads as the file without
    /metrics/personal_acc reads: NaN, and no personal_acc column where no run of the report has it."""
    _, path, outputs = study
    entries = ledger.load(path)
    entry = entries[outputs[0].stem]
    for split in ("test", "train"):
        for view, (last, select) in ledger.VIEWS.items():
            held = entry["views"][split][view]["scores"]["personal_acc"]
            assert held == summarize(outputs[0], last, select, split).scores["personal_acc"], (split, view)
    assert len(entry["curves"]["personal_acc"]) == 12
    with h5py.File(outputs[0], "r") as f:  # last10's mean, by hand from the file
        personal = f["metrics/personal_acc"][2:12].mean(axis=1).mean()
    assert entry["views"]["test"]["last10"]["scores"]["personal_acc"] == pytest.approx(personal, rel=1e-12)

    older = tmp_path / "older.jsonl"  # every line as an mpicd before personal_acc wrote it
    lines = []
    for e in entries.values():
        for views in e["views"].values():
            for v in views.values():
                del v["scores"]["personal_acc"]
        del e["curves"]["personal_acc"]
        lines.append(json.dumps(e))
    older.write_text("\n".join(lines) + "\n")
    old_file = shutil.copy(outputs[0], tmp_path / "old.h5")
    with h5py.File(old_file, "r+") as f:
        for name in ("personal_acc", "val_personal_acc", "train_personal_acc"):
            del f[f"metrics/{name}"]
    assert ledger.record(old_file)["views"]["test"]["last10"]["scores"]["personal_acc"] is None
    for split in ("test", "train"):
        held = ledger.summaries(older, 10, "last", split)
        theirs = summarize(old_file, 10, "last", split)
        mine = next(s for s in held if s.path.name == f"{older.name}#{outputs[0].stem}")
        assert np.isnan(mine.scores["personal_acc"]) and np.isnan(theirs.scores["personal_acc"])
        assert {k: v for k, v in mine.scores.items() if k != "personal_acc"} == {
            k: v for k, v in theirs.scores.items() if k != "personal_acc"
        }
        if split == "test":
            assert np.isnan(mine.curves["personal_acc"]).all() and len(mine.curves["personal_acc"]) == 12
    table, csv_bytes = report(tmp_path / "older", older, "--last", "10")
    # no run of the report has it: its tables and CSV are what they were before personal_acc existed
    assert "| test_acc | bytes/round/rank |" in table and "personal_acc" not in table
    header, *rows = csv_bytes.decode().splitlines()
    assert "personal_acc_mean" not in header.split(",") and "test_acc_sd,bytes_per_round_rank" in header
    refused = mpicd_cli("report", str(older), "--last", "10", "--versus", "fedavg", "--versus-metric", "personal_acc")
    assert refused.returncode == 2 and "has no personal_acc" in refused.stderr


def test_a_malformed_line_is_named_by_file_and_line(study, tmp_path):
    _, path, _ = study
    lines = path.read_text().splitlines()
    broken = tmp_path / "broken.jsonl"
    for bad, why in (("{not json", "not JSON"), (json.dumps({"name": "x"}), r"not a ledger entry \(no config")):
        broken.write_text("\n".join([lines[0], bad, *lines[1:]]) + "\n")
        with pytest.raises(ReportError, match=rf"broken.jsonl:2: {why}"):
            ledger.summaries(broken)
    without_views = json.loads(lines[0])
    del without_views["views"]["test"]["best-val"]
    broken.write_text(json.dumps(without_views) + "\n")
    with pytest.raises(ReportError, match=r"broken.jsonl:1: .*views.test.best-val must hold"):
        ledger.load(broken)


def test_pack_skips_ledgered_runs_and_refuses_a_ledger_of_another_config(study, tmp_path):
    """A new machine: the ledger (in git) but no results file. Pack runs nothing and writes no
    file; ``mpicd sweep`` lists both runs done; a changed lambda is refused, naming the ledger."""
    _, _, outputs = study
    sweep = write_sweep(tmp_path, [{"name": "codistill", "lambda": 1.0}])
    runs = load_sweep(sweep)
    assert [r.output.name for r in runs] == [o.name for o in outputs[:2]]
    runs[0].output.parent.mkdir()
    for run, output in zip(runs, outputs):
        shutil.copy(output, run.output)
    written = mpicd_cli("ledger", str(sweep))
    path = tmp_path / "sweep.runs.jsonl"
    assert written.stdout.strip() == f"ledger: {path}: 2 added, 0 unchanged, 0 incomplete or absent (of 2 runs)"
    assert "only: no complete results file" not in mpicd_cli("sweep", str(sweep)).stdout  # the files are there
    for run in runs:
        run.output.unlink()
    assert mpicd_cli("ledger", str(sweep)).stdout.strip() == (
        f"ledger: {path}: 0 added, 2 unchanged, 0 incomplete or absent (of 2 runs)"
    )

    again = mpiexec(2, "-m", "mpicd", "pack", str(sweep), timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 runs in" in again.stdout and ", 0 pending;" in again.stdout and "] start (" not in again.stdout
    assert not any(run.output.exists() for run in runs)
    listed = mpicd_cli("sweep", str(sweep))
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[3] for line in listed.stdout.splitlines()] == ["done", "done"]
    assert all(line.endswith(f"(in {path} only: no complete results file)") for line in listed.stdout.splitlines())
    assert mpicd_cli("sweep", str(sweep), "--pending").stdout.strip() == ""

    write_sweep(tmp_path, [{"name": "codistill", "lambda": 0.5}])
    refused = mpiexec(2, "-m", "mpicd", "pack", str(sweep), timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"ledger: {path} holds run {runs[0].output.stem} of another config" in refused.stderr
    assert "algorithm.lambda: the ledger has 1.0, the sweep 0.5" in refused.stderr
    assert not any(run.output.exists() for run in runs)
    status = mpicd_cli("sweep", str(sweep), "--status", "1")
    assert status.returncode == 2 and str(path) in status.stderr


def test_the_ledger_key_of_a_sweep_file(tmp_path):
    runs = load_sweep(write_sweep(tmp_path, [{"name": "local"}], ledger="books/local.jsonl"))
    assert {r.ledger for r in runs} == {tmp_path / "books" / "local.jsonl"}
    assert not any(is_done(r) for r in runs)  # no ledger file yet, no results file
    for bad in (3, "runs.txt", ["a.jsonl"]):
        with pytest.raises(ConfigError, match=r"ledger: must be a file name ending in .jsonl") as err:
            load_sweep(write_sweep(tmp_path, [{"name": "local"}], ledger=bad))
        assert err.value.key == "ledger"
