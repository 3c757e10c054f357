"""Each distinct model evaluated once (mpicd.evaluation.predictors, mpicd.run.client.evaluate_clients).

The expected scores are computed here from the model's own forward pass and the recall's definition
(the share of a class's images predicted as that class), not through mpicd's evaluation code; the
file test compares a packed 64-client run evaluated once per model against the same run with every
client's model evaluated itself (``eval.shared_models: per_client``, the code path of before).
"""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mpicd.evaluation import predictors as evaluation
from mpicd.config.loading import load_config
from mpicd.run.client import Client, evaluate_clients
from mpicd.run.plan import prepare

from conftest import PNEUMONIA, QUICKSTART, mpicd_run, require_pneumonia
from same_results import compared, differences

CLIENTS = 4


def rank_of(algorithm: str) -> list[Client]:
    """The quick start's 4 clients of ``algorithm``, all on one rank, without MPI (nothing below
    exchanges: a stand-in communicator with a rank and a size is all the code under test touches)."""
    plan = prepare(load_config(QUICKSTART, [f"clients={CLIENTS}", "device=cpu", f"algorithm={{name: {algorithm}}}"]))
    comm = SimpleNamespace(rank=0, size=1)
    shared: dict = {}
    owner = np.zeros(CLIENTS, dtype=np.int64)
    return [Client(plan, comm, "cpu", i, owner, shared) for i in range(CLIENTS)]


def trained_alike(clients: list[Client]) -> None:
    """Client 0 trains a round; every client then holds its model, bit for bit (FedAvg's end of round)."""
    clients[0].local_epochs(0)
    for c in clients[1:]:
        c.model.load_state_dict(clients[0].model.state_dict())


def by_hand(model: torch.nn.Module, x: torch.Tensor, y: np.ndarray, expertise: int, classes: int, counts=None) -> dict:
    """The scores of one model from its logits: recall of class c = share of c's images predicted c;
    with the client's training ``counts`` of each class, its personalised accuracy: the recalls
    weighted by them (every class is in the split here)."""
    model.eval()
    with torch.no_grad():
        predicted = model(x).argmax(dim=1).numpy()
    recall = np.array([np.mean(predicted[y == c] == c) for c in range(classes)])
    found = {
        "recall": recall,
        "acc": float(np.mean(predicted == y)),
        "minority_acc": float(np.mean([recall[c] for c in range(classes) if c != expertise])),
    }
    if counts is not None:
        found["personal_acc"] = sum(float(counts[c]) * recall[c] for c in range(classes)) / float(sum(counts))
    return found


def assert_scores(found: evaluation.Scores, expected: dict) -> None:
    np.testing.assert_array_equal(found.recall, expected["recall"])
    assert found.acc == pytest.approx(expected["acc"], abs=1e-12)
    assert found.minority_acc == pytest.approx(expected["minority_acc"], abs=1e-12)
    if "personal_acc" in expected:
        assert found.personal_acc == pytest.approx(expected["personal_acc"], abs=1e-12)


def counting(clients: list[Client]) -> list[int]:
    """Count the images each client's algorithm predicts for."""
    calls = [0] * len(clients)
    for i, c in enumerate(clients):
        original = c.algorithm.predict

        def predict(x, i=i, original=original):
            calls[i] += len(x)
            return original(x)

        c.algorithm.predict = predict
    return calls


def test_the_same_global_model_is_evaluated_once_and_scored_for_each_client():
    clients = rank_of("fedavg")
    trained_alike(clients)
    calls = counting(clients)
    found, seconds = evaluate_clients(clients, ("test",))
    x, y = clients[0].eval_sets["test"]
    assert calls == [len(y), 0, 0, 0]  # one forward pass over the split, for the rank
    assert sorted(seconds) == [0, 1, 2, 3] and all(s > 0 for s in seconds.values())
    expertise = [int(c.expertise_class) for c in clients]
    assert expertise == [0, 1, 0, 1]  # round robin: the same predictions give two minority scores
    counts = clients[0].plan.partition.train_counts
    for c in clients:
        expected = by_hand(clients[0].model, x, y, c.expertise_class, 2, counts[c.index])
        assert_scores(found[c.index]["test"], expected)
    assert found[0]["test"].minority_acc != found[1]["test"].minority_acc


def test_clients_sharing_predictions_get_the_personal_accuracy_of_their_own_distribution():
    """One forward pass for the rank, but each client's personalised accuracy weighs the shared
    recalls by its own training label distribution (expertise 0 against expertise 1)."""
    clients = rank_of("fedavg")
    trained_alike(clients)
    found, _ = evaluate_clients(clients, ("test",))
    counts = clients[0].plan.partition.train_counts
    assert counts[0].argmax() == 0 and counts[1].argmax() == 1  # opposite majorities
    recall = found[0]["test"].recall
    np.testing.assert_array_equal(found[1]["test"].recall, recall)  # the same predictions
    for c in (0, 1):
        own = (counts[c][0] * recall[0] + counts[c][1] * recall[1]) / (counts[c][0] + counts[c][1])
        assert found[c]["test"].personal_acc == pytest.approx(own, abs=1e-12)
    assert recall[0] != recall[1]  # else every weighting gives the same number
    assert found[0]["test"].personal_acc != found[1]["test"].personal_acc
    assert found[0]["test"].acc == found[1]["test"].acc  # what does not depend on the client stays shared


def test_for_expertise_reweighs_shared_recalls_by_hand():
    """Labels (0, 0, 0, 0, 1, 1), predictions (0, 0, 0, 1, 1, 0): recall (3/4, 1/2). A client of
    counts (80, 20) scores 0.8 * 0.75 + 0.2 * 0.5 = 0.7; one sharing its predictions with counts
    (10, 30) scores (10 * 0.75 + 30 * 0.5) / 40 = 22.5 / 40 = 0.5625."""
    labels, predictions = np.array([0, 0, 0, 0, 1, 1]), np.array([0, 0, 0, 1, 1, 0])
    first = evaluation.scores(labels, predictions, 2, 0, np.array([80, 20]))
    assert first.personal_acc == pytest.approx(0.7, abs=1e-15)
    other = evaluation.for_expertise(first, 1, np.array([10, 30]))
    assert other.personal_acc == 0.5625
    assert (other.acc, other.balanced_acc, other.minority_acc) == (first.acc, first.balanced_acc, 0.75)


def test_two_models_that_differ_by_one_weight_are_never_merged():
    clients = rank_of("fedavg")
    trained_alike(clients)
    head_bias = dict(clients[2].model.named_parameters())[[n for n, _ in clients[2].model.named_parameters()][-1]]
    with torch.no_grad():
        head_bias[0] += 50.0  # client 2 now predicts class 0 for everything
    calls = counting(clients)
    found, _ = evaluate_clients(clients, ("test",))
    x, y = clients[0].eval_sets["test"]
    assert calls == [len(y), 0, len(y), 0]
    assert_scores(found[2]["test"], by_hand(clients[2].model, x, y, 0, 2))
    np.testing.assert_array_equal(found[2]["test"].recall, [1.0, 0.0])
    assert_scores(found[0]["test"], by_hand(clients[0].model, x, y, 0, 2))
    assert found[0]["test"].acc != found[2]["test"].acc


def test_equality_is_bitwise():
    a = [torch.tensor([0.0, 1.0]), torch.tensor([2.0])]
    assert evaluation.same_tensors(a, [torch.tensor([0.0, 1.0]), torch.tensor([2.0])])
    assert not evaluation.same_tensors(a, [torch.tensor([-0.0, 1.0]), torch.tensor([2.0])])  # -0.0 == 0.0 in value
    one_ulp = torch.from_numpy(np.nextafter(np.float32([1.0]), np.float32(2.0)))
    assert not evaluation.same_tensors(a, [torch.cat([torch.tensor([0.0]), one_ulp]), torch.tensor([2.0])])
    assert not evaluation.same_tensors(a, [torch.tensor([0.0, 1.0])])  # a tensor fewer
    square = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert evaluation.same_tensors([square.t()], [square.t().contiguous()])  # strides do not matter, values do
    assert not evaluation.same_tensors([square.t()], [square])
    assert not evaluation.same_tensors([torch.tensor([0.0, 1.0])], [torch.tensor([0.0, 1.0], dtype=torch.float64)])
    assert not evaluation.same_tensors([torch.zeros(2, 1)], [torch.zeros(1, 2)])
    nan = torch.tensor([float("nan")])
    assert evaluation.same_tensors([nan], [nan.clone()])


def test_one_ulp_splits_the_group():
    clients = rank_of("fedavg")
    trained_alike(clients)
    weight = next(clients[3].model.parameters())
    with torch.no_grad():
        weight.view(-1)[0] = float(np.nextafter(np.float32(weight.view(-1)[0]), np.float32(np.inf)))
    assert not torch.equal(weight, next(clients[0].model.parameters()))
    assert evaluation.predictor_groups([c.algorithm for c in clients]) == [[0, 1, 2], [3]]
    assert evaluation.predictor_groups([c.algorithm for c in clients], once=False) == [[0], [1], [2], [3]]


@pytest.mark.parametrize("algorithm", ["local", "codistill", "fedproto", "feddistill", "fedamp", "centralized"])
def test_personalised_models_are_evaluated_for_each_client_even_when_equal(algorithm):
    clients = rank_of(algorithm)
    trained_alike(clients)  # equal bits, but the algorithm does not declare one model for all
    assert not type(clients[0].algorithm).shared_at_evaluation
    calls = counting(clients)
    found, _ = evaluate_clients(clients, ("test",))
    n = len(clients[0].eval_sets["test"][1])
    assert calls == [n] * CLIENTS


def test_batchnorm_step_counters_do_not_split_the_group_and_running_statistics_do():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    other = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    other.load_state_dict(model.state_dict())
    other[1].num_batches_tracked += 7  # read only in training with momentum None
    fedavg = type("FedAvgLike", (), {"shared_at_evaluation": True})
    from mpicd.algorithms.base import Algorithm

    def holder(m):
        a = object.__new__(fedavg)
        a.ctx = SimpleNamespace(model=m)
        a.predictor_tensors = Algorithm.predictor_tensors.__get__(a)
        return a

    assert evaluation.predictor_groups([holder(model), holder(other)]) == [[0, 1]]
    with torch.no_grad():
        other[1].running_mean[0] += 1.0
    assert evaluation.predictor_groups([holder(model), holder(other)]) == [[0], [1]]


@pytest.mark.skipif(not PNEUMONIA.is_file(), reason="real data absent")
@pytest.mark.parametrize("options", [(), ("participation=0.5", "eval.every=2", "eval.train_split=true")])
def test_a_64_client_file_is_the_same_evaluated_once_or_per_client(tmp_path, options):
    """FedAvg, 64 PneumoniaMNIST clients packed on 2 ranks: every dataset but timings equal bit for
    bit, evaluated once per model or every client's model itself (``per_client``, each client's own
    forward pass as before the change); also with half the clients sitting out each round, a round
    without evaluation and each client's own training split scored."""
    require_pneumonia()
    common = (
        f"data.path={PNEUMONIA}",
        "clients=64",
        "clients_per_rank=balanced",
        "rounds=3",
        "data.images_per_class=18",
        "algorithm={name: fedavg}",
        "checkpoint.every=0",
        *options,
    )
    config = QUICKSTART.parent / "pneumoniamnist.yaml"
    mpicd_run(2, config, tmp_path / "once.h5", *common, timeout=400)
    mpicd_run(2, config, tmp_path / "each.h5", *common, "eval.shared_models=per_client", timeout=400)
    once, each = compared(tmp_path / "once.h5"), compared(tmp_path / "each.h5")
    assert once["metrics/minority_acc"].shape == (3, 64)
    assert differences(once, each) == []
    assert len(np.unique(once["metrics/minority_acc"][-1])) == 2  # one model, two expertise classes
    if options:
        assert np.isnan(once["metrics/minority_acc"][0]).all()  # eval.every=2: round 1 not evaluated
        assert once["metrics/participated"].sum(axis=1).tolist() == [32, 32, 32]
        assert np.isfinite(once["metrics/train_acc"][-1]).all()  # each client scored on its own images
