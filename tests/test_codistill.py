"""Co-distillation end to end under a real mpiexec with 1, 2, 4 and 6 ranks."""

import numpy as np
import pytest

from mpicd.algorithms.codistill import teacher_assignment
from mpicd.results import Results

from conftest import DRIVERS, QUICKSTART, mpicd_run, mpiexec

ROUNDS = 3


@pytest.fixture(scope="module", params=[1, 2, 4, 6])
def run(request, tmp_path_factory):
    ranks = request.param
    out = tmp_path_factory.mktemp(f"codistill{ranks}") / "run.h5"
    mpicd_run(ranks, QUICKSTART, out, f"clients={ranks}", f"rounds={ROUNDS}")
    return ranks, Results(out)


def test_teacher_assignment_is_shared_and_never_self():
    for clients in (2, 3, 4, 6, 64):
        for r in range(20):
            t = teacher_assignment(7, r, clients)
            assert np.array_equal(t, teacher_assignment(7, r, clients))
            assert np.all(t != np.arange(clients)) and t.min() >= 0 and t.max() < clients
    assert np.all(teacher_assignment(7, 0, 1) == -1)
    draws = np.stack([teacher_assignment(7, r, 4) for r in range(200)])
    assert len({tuple(row) for row in draws}) > 20  # it really varies by round


def test_bytes_per_round_are_exactly_the_protocol(run):
    ranks, res = run
    d = res.attrs["feature_dim"]
    assert res.completed_rounds == ROUNDS
    sent, recv = res.metrics["bytes_sent"], res.metrics["bytes_recv"]
    for r in range(ROUNDS):
        teachers = res.teacher[r]
        students_served = np.bincount(teachers[teachers >= 0], minlength=ranks)
        assert np.array_equal(sent[r], 4 * d * students_served)
        assert np.array_equal(recv[r], np.full(ranks, 4 * d if ranks > 1 else 0))
        assert sent[r].sum() == recv[r].sum()
    p2p = res.kinds.index("p2p")
    others = [k for k in range(len(res.kinds)) if k != p2p]
    assert np.array_equal(res.bytes_sent_by_kind[:, :, p2p], sent)
    assert not res.bytes_sent_by_kind[:, :, others].any() and not res.bytes_recv_by_kind[:, :, others].any()


def test_every_rank_used_the_shared_teacher_assignment(run):
    ranks, res = run
    for r in range(ROUNDS):
        assert np.array_equal(res.teacher[r], teacher_assignment(res.config["seed"], r, ranks))


def test_results_file_holds_the_contract(run):
    ranks, res = run
    for name in ("train_loss", "test_acc", "balanced_acc", "minority_acc", "comm_seconds", "compute_seconds"):
        assert res.metrics[name].shape == (ROUNDS, ranks) and np.isfinite(res.metrics[name]).all(), name
    assert res.metrics["recall"].shape == (ROUNDS, ranks, 2)
    assert res.attrs["writer"] == "mpio" and res.attrs["num_classes"] == 2
    assert res.config["algorithm"] == {"name": "codistill", "lambda": 1.0, "k": "all", "teacher_per": "round",
                                       "classes": "expertise"}
    assert res.config["train"]["lr"] == 0.001 and res.config["clients"] == ranks
    assert "torch" in res.attrs["versions"] and res.attrs["num_parameters"] > 0
    assert np.array_equal(res.partition["expertise"], np.arange(ranks) % 2)
    assert res.partition["train_counts"].shape == (ranks, 2)
    assert (res.outside_rounds >= 0).all()
    # minority accuracy is the recall of the non-expertise class
    other = 1 - res.partition["expertise"]
    np.testing.assert_array_equal(res.metrics["minority_acc"],
                                  res.metrics["recall"][:, np.arange(ranks), other])


def test_distillation_pulls_student_features_toward_the_representation(tmp_path):
    def distances(lam):
        folder = tmp_path / str(lam)
        folder.mkdir()
        result = mpiexec(4, str(DRIVERS / "distill_pull.py"), str(QUICKSTART), str(lam), str(folder),
                         "train.local_epochs=3", timeout=180)
        assert result.returncode == 0, result.stderr
        rows = np.array([[float(v) for v in line.split()] for rank in range(4)
                         for line in (folder / f"rank{rank}.txt").read_text().splitlines()])
        return rows[:, 1], rows[:, 2]

    before_strong, after_strong = distances(100.0)
    _, after_none = distances(0.0)
    assert np.all(after_strong < before_strong)
    assert after_strong.mean() < 0.5 * after_none.mean()


def test_lambda_zero_equals_local_training(tmp_path):
    mpicd_run(4, QUICKSTART, tmp_path / "cd0.h5", "rounds=3", "algorithm.lambda=0")
    mpicd_run(4, QUICKSTART, tmp_path / "local.h5", "rounds=3", "algorithm={name: local}")
    cd0, local = Results(tmp_path / "cd0.h5"), Results(tmp_path / "local.h5")
    for name in ("train_loss", "test_acc", "recall", "minority_acc"):
        np.testing.assert_array_equal(cd0.metrics[name], local.metrics[name], err_msg=name)
    assert cd0.metrics["bytes_sent"].sum() > 0 and local.metrics["bytes_sent"].sum() == 0
    assert local.metrics["bytes_recv"].sum() == 0 and (local.teacher == -1).all()


@pytest.mark.parametrize("option, rows", [("teacher_per: batch", 1), ("classes: all", 2)])
def test_authors_code_options_allgather_their_tables(tmp_path, option, rows):
    out = tmp_path / "run.h5"
    mpicd_run(4, QUICKSTART, out, "rounds=2", f"algorithm={{name: codistill, {option}}}")
    res = Results(out)
    d, allgather = res.attrs["feature_dim"], res.kinds.index("allgather")
    np.testing.assert_array_equal(res.metrics["bytes_sent"], np.full((2, 4), 4 * rows * d))
    np.testing.assert_array_equal(res.metrics["bytes_recv"], np.full((2, 4), 4 * 4 * rows * d))
    np.testing.assert_array_equal(res.bytes_recv_by_kind[:, :, allgather], res.metrics["bytes_recv"])
    if option.startswith("teacher_per"):
        assert (res.teacher == -1).all()
    else:
        assert np.array_equal(res.teacher[1], teacher_assignment(0, 1, 4))
    assert np.isfinite(res.metrics["train_loss"]).all()


def test_k_larger_than_a_shared_class_is_rejected_before_training():
    from mpicd.algorithms import resolve
    from mpicd.config import ConfigError

    cls, params = resolve({"name": "codistill", "k": 20, "classes": "all"})
    counts, expertise = np.array([[42, 16], [16, 42]]), np.array([0, 1])
    with pytest.raises(ConfigError, match="client 0 has only 16 images of class 1"):
        cls.check(params, counts, expertise)
    cls.check(resolve({"name": "codistill", "k": 20})[1], counts, expertise)  # expertise classes only: fine
