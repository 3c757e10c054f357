"""Co-distillation under a real mpiexec: end to end with 1, 2, 4 and 6 ranks, and directly (what a
teacher sends, what a student adds to its loss, which teacher each batch uses) with 2 and 4 ranks."""

import numpy as np
import pytest
import torch

from mpicd.algorithms.codistill import teacher_assignment
from mpicd.results.reader import Results

from conftest import DRIVERS, PNEUMONIA, QUICKSTART, ROOT, mpicd_run, mpiexec, require_pneumonia

PNEUMONIA_CONFIG = ROOT / "configs" / "pneumoniamnist.yaml"

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
    for name in (
        "train_loss",
        "test_acc",
        "balanced_acc",
        "minority_acc",
        "comm_seconds",
        "compute_seconds",
        "train_seconds",
        "eval_seconds",
        "write_seconds",
    ):
        assert res.metrics[name].shape == (ROUNDS, ranks) and np.isfinite(res.metrics[name]).all(), name
    assert res.metrics["recall"].shape == (ROUNDS, ranks, 2)
    assert res.attrs["writer"] == "mpio" and res.attrs["num_classes"] == 2
    assert res.config["algorithm"] == {
        "name": "codistill",
        "lambda": 1.0,
        "k": "all",
        "teacher_per": "round",
        "classes": "expertise",
        "share": "features",
        "term_mean": "matching",
    }
    assert res.config["train"]["lr"] == 0.001 and res.config["clients"] == ranks
    assert "torch" in res.attrs["versions"] and res.attrs["num_parameters"] > 0
    assert np.array_equal(res.partition["expertise"], np.arange(ranks) % 2)
    assert res.partition["train_counts"].shape == (ranks, 2)
    assert (res.outside_rounds >= 0).all()
    # minority accuracy is the recall of the non-expertise class
    other = 1 - res.partition["expertise"]
    np.testing.assert_array_equal(res.metrics["minority_acc"], res.metrics["recall"][:, np.arange(ranks), other])


def test_distillation_pulls_student_features_toward_the_representation(tmp_path):
    def distances(lam):
        folder = tmp_path / str(lam)
        folder.mkdir()
        result = mpiexec(
            4,
            str(DRIVERS / "distill_pull.py"),
            str(QUICKSTART),
            str(lam),
            str(folder),
            "train.local_epochs=3",
            timeout=180,
        )
        assert result.returncode == 0, result.stderr
        rows = np.array(
            [
                [float(v) for v in line.split()]
                for rank in range(4)
                for line in (folder / f"rank{rank}.txt").read_text().splitlines()
            ]
        )
        return rows[:, 1], rows[:, 2]

    before_strong, after_strong = distances(100.0)
    _, after_none = distances(0.0)
    # every rank and round: the epochs pull the class mean toward R (one noisy row may not)
    assert np.mean(after_strong < before_strong) >= 0.9, (before_strong, after_strong)
    assert after_strong.mean() < before_strong.mean()
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
    from mpicd.config.sections import ConfigError

    cls, params = resolve({"name": "codistill", "k": 20, "classes": "all"})
    counts, expertise = np.array([[42, 16], [16, 42]]), np.array([0, 1])
    with pytest.raises(ConfigError, match="client 0 has only 16 images of class 1"):
        cls.check(params, counts, expertise)
    cls.check(resolve({"name": "codistill", "k": 20})[1], counts, expertise)  # expertise classes only: fine


# --- Direct checks of the method: tests/drivers/codistill_probe.py dumps what each rank had, sent,
# received and added to its loss; everything below is recomputed here by hand.


@pytest.fixture(scope="module", params=[2, 4])
def probe(request, tmp_path_factory):
    """(ranks, {variant: (plan, [rank dumps])}) of one probe job under ``mpiexec -n ranks``."""
    from mpicd.config.loading import load_config
    from mpicd.run.plan import prepare

    ranks = request.param
    out = tmp_path_factory.mktemp(f"probe{ranks}")
    data = str(PNEUMONIA) if PNEUMONIA.is_file() else "-"
    result = mpiexec(ranks, str(DRIVERS / "codistill_probe.py"), str(out), data, timeout=180 + 90 * ranks)
    assert result.returncode == 0, f"probe failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    variants = {}
    for first in sorted(out.glob("*_rank0.npz")):
        name = first.name[: -len("_rank0.npz")]
        dumps = [dict(np.load(out / f"{name}_rank{r}.npz")) for r in range(ranks)]
        plan = prepare(load_config(str(dumps[0]["config"]), [str(o) for o in dumps[0]["overrides"]]))
        variants[name] = (plan, dumps)
    assert {"round_all", "round_k5", "batch_k5", "classes_all_k3"} <= set(variants)
    if PNEUMONIA.is_file():
        assert {"pneumonia_all", "pneumonia_k5", "pneumonia_resnet_k5"} <= set(variants)
    return ranks, variants


def teacher_model(plan, dump: dict, r: int):
    """The rank's model as it was in round ``r``, rebuilt from its dumped state, in float64."""
    from mpicd.models.networks import build_model

    cfg = plan.config
    model = build_model(
        cfg.model.name, plan.dataset.input_shape, plan.dataset.num_classes, cfg.model.feature_dim, cfg.model.hidden
    )
    prefix = f"state_{r}/"
    model.load_state_dict({k[len(prefix) :]: torch.from_numpy(v) for k, v in dump.items() if k.startswith(prefix)})
    return model.double()


def features_one_by_one(model, x: np.ndarray) -> np.ndarray:
    """Eval-mode features, one image per forward pass, in float64."""
    model.eval()
    with torch.no_grad():
        return np.stack([model.features(torch.from_numpy(x[i : i + 1]).double())[0].numpy() for i in range(len(x))])


def rounds_of(dump: dict) -> list[int]:
    return sorted({int(k.split("_")[1]) for k in dump if k.startswith("teachers_")})


def test_each_student_receives_its_teachers_eval_mode_mean_over_k_images(probe):
    ranks, variants = probe
    for name, (plan, dumps) in variants.items():
        params, num_classes = plan.algorithm_params, plan.dataset.num_classes
        expertise = np.arange(ranks) % num_classes  # round-robin, by the spec
        checked, means, models = 0, {}, {}

        def mean_of(t: int, r: int, c: int) -> np.ndarray:
            """Teacher t's eval-mode mean feature of class c in round r, from its state and data."""
            if (t, r, c) not in means:
                d = dumps[t]
                index, y = d[f"subset_{r}_{c}"], d["train_y"]
                if params.k == "all":
                    assert np.array_equal(np.sort(index), np.flatnonzero(y == c)), (name, t, r, c)
                else:  # k distinct images, all of class c
                    assert len(index) == params.k == len(set(index.tolist())) and (y[index] == c).all(), (name, t, r)
                if (t, r) not in models:
                    models[(t, r)] = teacher_model(plan, d, r)
                model = models[(t, r)]
                means[(t, r, c)] = features_one_by_one(model, d["train_x"][index]).mean(axis=0)
                if any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()):
                    # eval mode matters here: the training-mode mean (batch statistics) is far off
                    model.train()
                    with torch.no_grad():
                        batch = model.features(torch.from_numpy(d["train_x"][index]).double()).mean(dim=0).numpy()
                    assert np.abs(batch - means[(t, r, c)]).max() > 1e-3
            return means[(t, r, c)]

        for s in range(ranks):
            for r in rounds_of(dumps[s]):
                teachers = dumps[s][f"teachers_{r}"]
                got = {int(k.split("_")[2]) for k in dumps[s] if k.startswith(f"received_{r}_")}
                if params.teacher_per == "round" and params.classes == "expertise":
                    assert got == {int(teachers[s])} and teachers[s] != s, (name, s, r)
                else:  # Allgather: every other rank's table
                    assert got == set(range(ranks)) - {s}, (name, s, r)
                for t in got:
                    if not any(k.startswith(f"state_{r}/") for k in dumps[t]):
                        continue
                    shared = range(num_classes) if params.classes == "all" else [int(expertise[t])]
                    received = dumps[s][f"received_{r}_{t}"]
                    assert received.shape[0] == len(shared) and received.dtype == np.float32
                    for row, c in enumerate(shared):
                        np.testing.assert_allclose(
                            received[row],
                            mean_of(t, r, c),
                            rtol=1e-4,
                            atol=1e-5,
                            err_msg=f"{name}: R from {t} to {s} in round {r}, class {c}",
                        )
                        checked += 1
        assert checked >= ranks, name
        if params.k != "all":  # the k images are redrawn each round
            assert any(
                not np.array_equal(dumps[t]["subset_0_" + str(expertise[t])], dumps[t]["subset_1_" + str(expertise[t])])
                for t in range(ranks)
            ), name


def test_the_term_is_lambda_mse_over_the_batch_samples_of_the_teachers_class(probe):
    ranks, variants = probe
    cases = {"none": 0, "partial": 0, "full": 0}
    for name, (plan, dumps) in variants.items():
        params = plan.algorithm_params
        expertise = np.arange(ranks) % plan.dataset.num_classes
        for s, d in enumerate(dumps):
            for r in rounds_of(d):
                batches = sorted(int(k.split("_")[2]) for k in d if k.startswith(f"y_{r}_"))
                assert batches == list(range(len(batches))) and batches, (name, s, r)
                for j in batches:
                    y, f = d[f"y_{r}_{j}"], d[f"f_{r}_{j}"].astype(np.float64)
                    teacher, term = int(d[f"teacher_{r}_{j}"]), float(d[f"term_{r}_{j}"])
                    assert 0 <= teacher < ranks and teacher != s, (name, s, r, j)
                    if params.teacher_per == "round":
                        assert teacher == d[f"teachers_{r}"][s]
                    table = d[f"received_{r}_{teacher}"].astype(np.float64)
                    if params.classes == "all":
                        expected = params.lambda_ * np.mean((f - table[y]) ** 2)
                    else:
                        mask = y == expertise[teacher]
                        if not mask.any():
                            assert np.isnan(term), f"{name}: a term without samples of the teacher's class"
                            cases["none"] += 1
                            continue
                        cases["partial" if not mask.all() else "full"] += 1
                        expected = params.lambda_ * np.mean((f[mask] - table[0]) ** 2)
                    np.testing.assert_allclose(term, expected, rtol=1e-5, atol=1e-9, err_msg=f"{name} {s} {r} {j}")
    # every branch was exercised, and batches mixing classes tell a wrong mask from the right one
    assert min(cases.values()) > 0, cases


def test_a_per_batch_teacher_is_never_the_client_and_follows_its_own_stream(probe):
    from mpicd.core import seeds

    ranks, variants = probe
    plan, dumps = variants["batch_k5"]
    seed, sequences = plan.config.seed, {}
    for s, d in enumerate(dumps):
        everyone = []
        for r in rounds_of(d):
            drawn = [int(d[f"teacher_{r}_{j}"]) for j in range(sum(k.startswith(f"y_{r}_") for k in d))]
            assert len(drawn) >= 10 and all(0 <= t < ranks and t != s for t in drawn), (s, r, drawn)
            everyone += drawn
            # one draw per batch from this rank's own stream (seed, BATCH_TEACHERS, round, rank),
            # uniform over 0..N-2, skipping the rank itself
            stream = seeds.rng(seed, seeds.BATCH_TEACHERS, r, s)
            expected = [int(v) + (int(v) >= s) for v in (stream.integers(0, ranks - 1) for _ in drawn)]
            assert drawn == expected, (s, r)
            shared = seeds.rng(seed, seeds.TEACHERS, r).bit_generator.state
            assert seeds.rng(seed, seeds.BATCH_TEACHERS, r, s).bit_generator.state != shared
            sequences[(s, r)] = tuple(t - (t > s) for t in drawn)  # back to the draws 0..N-2
        assert set(everyone) == set(range(ranks)) - {s}, s  # uniform over the others: all appear
    if ranks > 2:  # with two ranks the only other client is always drawn
        assert len(set(sequences.values())) == len(sequences)


@pytest.mark.parametrize("data", ["quickstart", "pneumonia"])
def test_an_integer_k_runs_end_to_end(tmp_path, data):
    out = tmp_path / "run.h5"
    if data == "quickstart":
        ranks, config, extra = 4, QUICKSTART, []
    else:
        ranks, config, extra = 2, PNEUMONIA_CONFIG, [f"data.path={require_pneumonia()}", "data.images_per_class=40"]
    mpicd_run(ranks, config, out, f"clients={ranks}", "rounds=2", "algorithm.k=5", *extra)
    res = Results(out)
    assert res.completed_rounds == 2 and res.config["algorithm"]["k"] == 5
    assert np.isfinite(res.metrics["train_loss"]).all()
    d = res.attrs["feature_dim"]
    for r in range(2):
        served = np.bincount(res.teacher[r], minlength=ranks)
        assert np.array_equal(res.metrics["bytes_sent"][r], 4 * d * served)
        assert np.array_equal(res.metrics["bytes_recv"][r], np.full(ranks, 4 * d))
