"""Results as pandas frames, on real files of one packed mpiexec job (co-distillation and local
training, two seeds each, on the natural-prevalence partition): ``Results.to_frame()`` names the
classes and carries config columns, ``mpicd.results.reader.load`` stacks many files with the config keys
that differ between them, and ``mpicd report --versus-metric recall:<class>`` scores one class's
recall by name. Every expected value is read from the files with h5py and yaml, not with mpicd."""

import csv

import h5py
import numpy as np
import pytest
import yaml

from mpicd.config.sections import DataConfig
from mpicd.data import load_dataset
from mpicd.results.reader import load, Results, ResultsFileError

from conftest import QUICKSTART, mpicd_cli, mpiexec

pd = pytest.importorskip("pandas")

CLIENTS, ROUNDS = 2, 2
RUNS = [(a, s) for a in ("codistill", "local") for s in (0, 1)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(algorithm, seed): results file} of four real runs, one packed job of 4 ranks (2 groups)."""
    folder = tmp_path_factory.mktemp("frame")
    base = yaml.safe_load(QUICKSTART.read_text())
    base.update(clients=CLIENTS, rounds=ROUNDS)
    base["data"].update(skew=0.0, partition="natural")
    (folder / "base.yaml").write_text(yaml.safe_dump(base))
    (folder / "sweep.yaml").write_text(
        f"config: base.yaml\noutput_dir: {folder / 'out'}\ngrid:\n"
        "  algorithm: [{name: codistill}, {name: local}]\n  seed: [0, 1]\n"
    )
    result = mpiexec(4, "-m", "mpicd", "pack", str(folder / "sweep.yaml"), timeout=400)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    files = sorted((folder / "out").glob("*.h5"))
    assert len(files) == len(RUNS), files
    found = {}
    for path in files:
        with h5py.File(path, "r") as f:
            cfg = yaml.safe_load(f.attrs["config"])
        found[(cfg["algorithm"]["name"], cfg["seed"])] = path
    assert set(found) == set(RUNS)
    return found


def raw(path):
    """The metrics, class names and config of a file, read with h5py and yaml only."""
    with h5py.File(path, "r") as f:
        metrics = {n: d[()] for n, d in f["metrics"].items() if not h5py.h5ds.is_scale(d.id)}
        names = [n.decode() if isinstance(n, bytes) else str(n) for n in f.attrs["class_names"]]
        return metrics, names, yaml.safe_load(f.attrs["config"])


def test_to_frame_names_classes_and_carries_config_columns(runs):
    path = runs[("codistill", 1)]
    metrics, names, cfg = raw(path)
    assert names == ["malignant", "benign"]
    frame = Results(path).to_frame()
    assert list(frame.columns) == [
        "algorithm", "seed", "data.name", "clients", "data.partition", "data.skew", "round", "client", "metric", "value"
    ]  # fmt: skip
    expected = {n for n, v in metrics.items() if v.ndim == 2} | {
        f"{n}[{c}]" for n, v in metrics.items() if v.ndim == 3 for c in names
    }
    assert set(frame["metric"]) == expected and "recall[malignant]" in expected and "recall[0]" not in expected
    assert len(frame) == ROUNDS * CLIENTS * len(expected)
    first = frame.iloc[0]
    assert (first["algorithm"], first["seed"], first["data.name"]) == ("codistill", 1, "breast_cancer")
    assert (first["clients"], first["data.partition"], first["data.skew"]) == (2, "natural", 0.0)
    at = frame.set_index(["round", "client", "metric"])["value"]
    assert at[(2, 1, "recall[malignant]")] == metrics["recall"][1, 1, 0]
    assert at[(1, 0, "val_recall[benign]")] == metrics["val_recall"][0, 0, 1]
    assert at[(2, 0, "minority_acc")] == metrics["minority_acc"][1, 0]
    chosen = Results(path).to_frame(keys=["model.name", "algorithm.lambda", "data.label_map", "eval.every"])
    assert list(chosen.columns[2:6]) == ["model.name", "algorithm.lambda", "data.label_map", "eval.every"]
    assert set(chosen["eval.every"]) == {cfg["eval"]["every"]}  # an operational key, asked for by name
    assert set(chosen["model.name"]) == {"mlp"} and set(chosen["algorithm.lambda"]) == {cfg["algorithm"]["lambda"]}
    assert chosen["data.label_map"].isna().all()


def test_load_stacks_many_files_with_the_keys_that_differ_as_columns(runs, tmp_path):
    pattern = str(next(iter(runs.values())).parent / "*.h5")
    frame = load(pattern)
    # co-distillation has keys of its own (lambda, k, ...) that local training lacks; everything else is
    # equal across the four files but the seed and the algorithm, which are always columns
    own = sorted(f"algorithm.{k}" for k in raw(runs[("codistill", 0)])[2]["algorithm"] if k != "name")
    assert own and list(frame.columns) == ["file", "algorithm", "seed", *own, "round", "client", "metric", "value"]
    for (algorithm, seed), path in runs.items():
        metrics, names, cfg = raw(path)
        mine = frame[frame["file"] == str(path)]
        assert set(mine["algorithm"]) == {algorithm} and set(mine["seed"]) == {seed}
        for key in own:
            value = cfg["algorithm"].get(key.removeprefix("algorithm."))
            assert mine[key].map(repr).eq(repr(value)).all(), (key, path)  # None for local: it has no such key
        at = mine.set_index(["round", "client", "metric"])["value"]
        for c, name in enumerate(names):
            for r in range(ROUNDS):
                for client in range(CLIENTS):
                    assert at[(r + 1, client, f"recall[{name}]")] == metrics["recall"][r, client, c]
        per_file = sum(ROUNDS * CLIENTS * (len(names) if v.ndim == 3 else 1) for v in metrics.values())
        assert len(mine) == per_file
    assert len(frame) == sum(len(load([p])) for p in runs.values())
    listed = load([runs[("local", 1)], runs[("codistill", 0)]])  # a list of paths, in its order
    assert list(dict.fromkeys(listed["file"])) == [str(runs[("local", 1)]), str(runs[("codistill", 0)])]
    assert list(load([runs[("local", 1)]]).columns) == [
        "file",
        "algorithm",
        "seed",
        "round",
        "client",
        "metric",
        "value",
    ]
    with pytest.raises(ResultsFileError, match="no file matches"):
        load(str(tmp_path / "*.h5"))
    (tmp_path / "bad.h5").write_text("not HDF5")
    with pytest.raises(ResultsFileError, match="bad.h5"):
        load([runs[("local", 0)], tmp_path / "bad.h5"])


def test_report_versus_recall_of_a_class_by_name_on_real_runs(runs, tmp_path):
    """The mean difference codistill - local by seed of the last round's recall of a class, mean over
    clients, recomputed from the raw datasets, for both classes (on the natural partition every
    client's expertise class is benign, so recall:malignant is also the minority accuracy)."""
    for c, name in enumerate(("malignant", "benign")):
        diffs = []
        for seed in (0, 1):
            scores = [raw(runs[(a, seed)])[0]["recall"][ROUNDS - 1, :, c].mean() for a in ("codistill", "local")]
            diffs.append(scores[0] - scores[1])
        out = tmp_path / f"{name}.csv"
        files = [str(p) for p in runs.values()]
        result = mpicd_cli(
            "report", *files, "--versus", "local", "--versus-metric", f"recall:{name}", "--versus-csv", str(out)
        )
        assert result.returncode == 0, result.stderr
        (row,) = csv.DictReader(out.open())
        assert row["metric"] == f"recall:{name}" and row["pairs"] == "2"
        with h5py.File(files[0], "r") as f:  # the setting is sized per client, not per class
            per_client = int(f["partition/train_counts"][0].sum())
        assert f"breast_cancer, 2 clients, natural partition, {per_client} images/client" in result.stdout
        assert float(row["mean_diff"]) == pytest.approx(sum(diffs) / 2, abs=1e-12)
    unknown = mpicd_cli("report", *files, "--versus", "local", "--versus-metric", "recall:Malignant")
    assert unknown.returncode == 2 and "its classes: malignant, benign" in unknown.stderr


def test_natural_partition_of_a_real_run_keeps_the_training_prevalence(runs):
    counts = np.bincount(load_dataset(DataConfig()).train.y, minlength=2)  # the quickstart's data, loaded alone
    prevalence = counts / counts.sum()
    for path in runs.values():
        with h5py.File(path, "r") as f:
            train = f["partition/train_counts"][()]
            expertise = f["partition/expertise"][()]
        m = train.sum(axis=1)
        assert (m == m[0]).all() and (train == train[0]).all()  # every client the same counts
        assert np.all(np.abs(train - m[:, None] * prevalence) < 1)  # within rounding of the prevalence
        assert expertise.tolist() == [int(np.argmax(counts))] * CLIENTS
        assert m[0] * CLIENTS <= counts.sum() and (m[0] + 1) * CLIENTS > counts.sum() - 2 * CLIENTS
