"""``eval.train_split``: every client's metrics on its own training images (a memorisation audit).

Under a real mpiexec this file is also the driver (``__main__`` below): ``mpicd run`` in-process,
saving each rank's model right after every round's training (the model that round evaluates), so
the test can score it on the client's training images on its own: the partition rebuilt from the
config (mpicd.run.plan.prepare), the model rebuilt and loaded, predictions and recalls in plain numpy.
The saving touches no random stream and no model, and both sides of the on/off comparison run it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import DRIVERS, QUICKSTART, is_timing, mpiexec

TRAIN = ("train_acc", "train_balanced_acc", "train_minority_acc", "train_personal_acc", "train_recall")
ROUNDS, EVERY = 3, 2
EVALUATED = [1, 2]  # eval.every=2 over 3 rounds: round 2 and the last
COMMON = (f"rounds={ROUNDS}", f"eval.every={EVERY}", "checkpoint.every=0")


def _driven(folder: Path, ranks: int, name: str, *overrides: str) -> Path:
    """One driven run; returns its folder (run.h5 and model_r<round>_rank<rank>.pt)."""
    out = folder / name
    out.mkdir()
    args = (str(QUICKSTART), f"clients={ranks}", *COMMON, *overrides)
    result = mpiexec(ranks, str(DRIVERS / "models_per_round.py"), str(out), *args, timeout=300)
    assert result.returncode == 0, f"driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    (out / "overrides.txt").write_text("\n".join(args[1:]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train_split")
    return {
        "off": _driven(folder, 4, "off"),
        "on": _driven(folder, 4, "on", "eval.train_split=true"),
        "centralized": _driven(folder, 2, "centralized", "eval.train_split=true", "algorithm={name: centralized}"),
    }


def independent_scores(out: Path) -> dict[str, np.ndarray]:
    """train_* recomputed from the saved models and the rebuilt partition, (rounds, clients[, classes])."""
    import torch

    from mpicd.config.loading import load_config
    from mpicd.models.networks import build_model
    from mpicd.run.plan import prepare

    cfg = load_config(QUICKSTART, (out / "overrides.txt").read_text().splitlines())
    plan = prepare(cfg)
    classes = plan.dataset.num_classes
    got = {
        name: np.full((ROUNDS, cfg.clients, classes) if name == "train_recall" else (ROUNDS, cfg.clients), np.nan)
        for name in TRAIN
    }
    for rank in range(cfg.clients):
        own = (  # centralized trains on the union of every client's training split
            np.concatenate(plan.partition.train_indices)
            if plan.algorithm_cls.name == "centralized"
            else plan.partition.train_indices[rank]
        )
        x, y = plan.dataset.train.x[own], plan.dataset.train.y[own]
        expertise = int(plan.partition.expertise[rank])
        for r in EVALUATED:
            model = build_model(
                cfg.model.name, plan.dataset.input_shape, classes, cfg.model.feature_dim, cfg.model.hidden
            )
            model.load_state_dict(torch.load(out / f"model_r{r}_rank{rank}.pt"))
            model.eval()
            with torch.no_grad():
                pred = model(torch.from_numpy(x)).argmax(dim=1).numpy()
            recall = np.array([(pred[y == c] == c).mean() for c in range(classes)])
            got["train_recall"][r, rank] = recall
            got["train_acc"][r, rank] = (pred == y).mean()
            got["train_balanced_acc"][r, rank] = recall.mean()
            got["train_minority_acc"][r, rank] = np.delete(recall, expertise).mean()
            # weighted by the client's own partition's counts, also where it trains on the union
            counts = plan.partition.train_counts[rank]
            got["train_personal_acc"][r, rank] = sum(counts[c] * recall[c] for c in range(classes)) / counts.sum()
    return got


@pytest.mark.parametrize("name", ["on", "centralized"])
def test_train_scores_are_the_models_scores_on_its_own_training_images(runs, name):
    from mpicd.results.reader import Results

    res, expected = Results(runs[name] / "run.h5"), independent_scores(runs[name])
    for metric in TRAIN:
        values = res.metrics[metric]
        assert np.isnan(values[0]).all(), metric  # round 1: not evaluated (eval.every=2)
        np.testing.assert_allclose(values[EVALUATED], expected[metric][EVALUATED], rtol=1e-12, err_msg=metric)
    # an audit of memorisation, not the held-out score under another name
    assert not np.array_equal(res.metrics["train_acc"][EVALUATED], res.metrics["test_acc"][EVALUATED])


def test_off_by_default_and_nan(runs):
    from mpicd.results.reader import Results

    res = Results(runs["off"] / "run.h5")
    assert res.config["eval"]["train_split"] is False
    for metric in TRAIN:
        assert np.isnan(res.metrics[metric]).all(), metric
    assert np.isfinite(res.metrics["minority_acc"][EVALUATED]).all()


def test_on_changes_nothing_else_bit_for_bit(runs):
    import h5py
    import torch

    off, on = runs["off"], runs["on"]
    with h5py.File(off / "run.h5", "r") as a, h5py.File(on / "run.h5", "r") as b:
        names = []
        a.visititems(lambda n, obj: names.append(n) if isinstance(obj, h5py.Dataset) else None)
        compared = 0
        for n in names:
            if n.removeprefix("metrics/") in TRAIN or is_timing(n):
                continue
            np.testing.assert_array_equal(a[n][()], b[n][()], err_msg=n)
            compared += 1
        assert compared > 20
        assert a.attrs["config_hash"] == b.attrs["config_hash"]  # eval is operational: the same run identity
    for r in range(ROUNDS):  # and the models themselves, every round and rank
        for rank in range(4):
            sa, sb = (torch.load(d / f"model_r{r}_rank{rank}.pt") for d in (off, on))
            for key in sa:
                assert torch.equal(sa[key], sb[key]), (r, rank, key)


def test_verify_checks_train_scores_only_when_on(runs, tmp_path):
    import shutil

    import h5py

    from mpicd.results.verify import verify

    assert verify(runs["on"] / "run.h5").ok, verify(runs["on"] / "run.h5").text()
    assert verify(runs["off"] / "run.h5").ok, verify(runs["off"] / "run.h5").text()
    hole, stray = tmp_path / "hole.h5", tmp_path / "stray.h5"
    shutil.copy(runs["on"] / "run.h5", hole)
    shutil.copy(runs["off"] / "run.h5", stray)
    with h5py.File(hole, "r+") as f:
        f["metrics/train_minority_acc"][2, 1] = np.nan
    with h5py.File(stray, "r+") as f:
        f["metrics/train_acc"][1, 0] = 0.5
    assert "/metrics/train_minority_acc is not finite in evaluated rounds 3" in verify(hole).text()
    assert "/metrics/train_acc holds values without eval.train_split in rounds 2" in verify(stray).text()
