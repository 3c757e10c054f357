"""Clients per rank (``clients_per_rank: balanced``): 6 clients on 1, 2, 3 and 6 ranks give the same
results file, for every algorithm, and a checkpoint of one layout resumes on another.

Same file: every dataset and attribute but timings, placement (``/placement``, the attrs ``ranks``
and ``client_rank``), what crossed MPI per rank (``/comm/bytes_mpi_*``, checked against its declaration
instead) and the bytes outside rounds (start-up agreement: it grows with the ranks). The three
algorithms that sum their clients' contributions (fedavg, fedproto, feddistill) run with
``reduction: exact`` (integer sums) and are equal bit for bit like the rest. With ``reduction: mpi``
(the float32 Allreduce, ``fedavg_mpi``) the file agrees to float32 rounding only: a rank adds its
clients' float32 vectors before the Allreduce, so the additions happen in another order than MPI's
over N ranks (float addition is not associative); everything else in it (teachers, bytes, counts)
is equal bit for bit.
"""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from mpicd.algorithms import REGISTRY, resolve, Sizes
from mpicd.algorithms.codistill import CoDistillation
from mpicd.mpi.assignment import assign
from mpicd.results import verify
from mpicd.results.reader import Results

from conftest import DRIVERS, QUICKSTART, RETINA, mpiexec
from same_results import compared, differences, digest, machine

LAYOUTS = (1, 2, 3, 6)
ROUNDS = 2
ROUNDING = {"fedavg_mpi"}  # reduction: mpi (float32 Allreduce)
VARIANTS = [*REGISTRY, "codistill_all", "local_half", "fedavg_half", "codistill_half", "ccvr_half", "fedavg_mpi"]
FIVE_CLASSES = [
    "fedavg_5class",
    "fedntd_5class",
    "fedrod_5class",
    "ccvr_5class",
]  # RetinaMNIST's grades (drivers/layouts.py)
if RETINA.exists():
    VARIANTS += FIVE_CLASSES


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """{ranks: folder} of one tests/drivers/layouts.py job per layout (every variant, 2 rounds)."""
    folders = {}
    for ranks in LAYOUTS:
        folder = tmp_path_factory.mktemp(f"ranks{ranks}")
        result = mpiexec(ranks, str(DRIVERS / "layouts.py"), str(folder), str(ROUNDS), timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        folders[ranks] = folder
    return folders


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_same_file_on_every_layout(layouts, variant):
    reference = compared(layouts[6] / f"{variant}.h5")
    assert reference["metrics/train_loss"].shape == (ROUNDS, 6)
    for ranks in (1, 2, 3):
        other = compared(layouts[ranks] / f"{variant}.h5")
        assert differences(reference, other, rounding=variant in ROUNDING) == [], (variant, ranks)
    if variant in ROUNDING:  # the non-float datasets are equal bit for bit all the same
        other = compared(layouts[2] / f"{variant}.h5")
        assert [k for k in differences(reference, other) if reference[k].dtype.kind == "f"] == differences(
            reference, other
        )


DIGESTS = json.loads((Path(__file__).parent / "results_digests.json").read_text())


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_algorithm_writes_the_file_it_wrote_before(layouts, variant):
    """Each variant's 2-rank file, digested (tests/support/same_results.digest: every result but timings,
    placement, paths and versions), equals the digest committed from mpicd's files before the round engine
    (issue 65): a change that moves one bit of any algorithm's results fails here. Bits hold on the CPU
    model and libraries that made them only (mpicd's determinism promise): elsewhere, skipped saying so.
    After a change that is meant to alter results: ``PYTHONPATH=tests:tests/support python
    tests/support/same_results.py FOLDER > tests/run/results_digests.json`` on the 2-rank layout's files."""
    here = machine()
    if here != DIGESTS["machine"]:
        pytest.skip(f"digests were made on {DIGESTS['machine']}, this is {here}")
    assert digest(layouts[2] / f"{variant}.h5") == DIGESTS["digests"][variant]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_file_verifies_and_mpi_bytes_per_rank_are_the_declared_ones(layouts, variant):
    for ranks in LAYOUTS:
        path = layouts[ranks] / f"{variant}.h5"
        verdict = verify.verify(path)
        assert verdict.ok, verdict.text()
        with h5py.File(path, "r") as f:
            owner = f.attrs["client_rank"]
            sent, recv = f["comm/bytes_mpi_sent"][()], f["comm/bytes_mpi_recv"][()]
            kinds = [k.decode() if isinstance(k, bytes) else k for k in f["comm/bytes_mpi_sent"].attrs["kinds"]]
            config = yaml.safe_load(f.attrs["config"])
            sizes = Sizes(**yaml.safe_load(f.attrs["payload_sizes"]))
            teachers = f["comm/teacher"][()]
            assert int(f.attrs["ranks"]) == ranks == owner.max() + 1
        cls, params = resolve(config["algorithm"])
        for r in range(ROUNDS):
            for rank in range(ranks):
                mine = np.flatnonzero(owner == rank)
                rows = (0, 0)
                if cls is CoDistillation and params.teacher_per == "round" and params.classes == "expertise":
                    rows = CoDistillation.rows_per_rank(teachers[r], owner, rank)
                declared = cls.rank_bytes_per_round(sizes, params, len(mine), *rows, last=r == ROUNDS - 1)
                got = {k: (int(sent[r, mine[0], i]), int(recv[r, mine[0], i])) for i, k in enumerate(kinds)}
                assert got == {k: tuple(declared[k]) for k in kinds}, (variant, ranks, r, rank)
                assert not sent[r, mine[1:]].any() and not recv[r, mine[1:]].any()


def test_from_three_classes_on_fedntd_distils_fedrod_personalises_ccvr_recalibrates(layouts):
    """Where the five-class variants ran: FedNTD's term is on (it is 0 with two classes) and trains
    something else than FedAvg; FedRoD's personal models differ from its generic one; CCVR is FedAvg
    but for the last round's recalibrated head."""
    if not RETINA.exists():
        pytest.skip(f"real data absent: {RETINA}")
    fedavg, fedntd, fedrod, ccvr = (Results(layouts[6] / f"{v}.h5") for v in FIVE_CLASSES)
    assert int(fedntd.attrs["num_classes"]) == 5
    assert (fedntd.metrics["train_extra"] > 1e-4).all()
    assert not np.array_equal(fedntd.metrics["train_ce"], fedavg.metrics["train_ce"])
    assert not np.array_equal(fedrod.metrics["recall"], fedrod.metrics["generic_recall"])
    # CCVR is FedAvg until its last round's recalibration, which changes the evaluated model
    for name in ("train_loss", "recall", "val_recall"):
        np.testing.assert_array_equal(ccvr.metrics[name][:-1], fedavg.metrics[name][:-1], err_msg=name)
    np.testing.assert_array_equal(ccvr.metrics["train_loss"], fedavg.metrics["train_loss"])
    assert not np.array_equal(ccvr.metrics["val_recall"][-1], fedavg.metrics["val_recall"][-1])


def test_the_assignment_is_recorded_and_balanced(layouts):
    for ranks in LAYOUTS:
        res = Results(layouts[ranks] / "fedavg.h5")
        sizes = res.partition["train_counts"].sum(axis=1)
        owner = np.asarray(res.attrs["client_rank"])
        assert int(res.attrs["ranks"]) == ranks and sorted(set(owner.tolist())) == list(range(ranks))
        assert owner.tolist() == assign(sizes, ranks).tolist()
        loads = np.bincount(owner, weights=sizes, minlength=ranks)
        assert loads.max() - loads.min() <= sizes.max()  # greedy: within one client of each other


def test_one_message_per_pair_of_ranks_in_co_distillation(layouts):
    """On 2 ranks the p2p rows a rank sends are one per (teacher, other rank), not one per student:
    the declaration's T, checked against the file above, is smaller than the students served."""
    res = Results(layouts[2] / "codistill.h5")
    owner = np.asarray(res.attrs["client_rank"])
    fewer = 0
    for r in range(ROUNDS):
        teachers = res.teacher[r]
        for rank in range(2):
            rows, _ = CoDistillation.rows_per_rank(teachers, owner, rank)
            remote_students = sum(1 for s, t in enumerate(teachers) if owner[t] == rank and owner[s] != rank)
            assert rows <= remote_students
            fewer += rows < remote_students
    assert fewer > 0


@pytest.mark.parametrize("first, then", [(6, 2), (2, 6)])
def test_a_checkpoint_resumes_on_another_layout(layouts, tmp_path, first, then):
    out = tmp_path / "codistill.h5"
    common = ["checkpoint.every=1", "checkpoint.flush_every=1"]
    killed = mpiexec(
        first,
        str(DRIVERS / "layouts.py"),
        str(tmp_path),
        str(ROUNDS),
        "--only=codistill",
        *common,
        "debug.fail_rank=0",
        "debug.fail_round=1",
        "debug.fail_kind=exit",
        timeout=300,
    )
    assert killed.returncode != 0
    assert Results(out).completed_rounds == 1
    resumed = mpiexec(
        then,
        "-m",
        "mpicd",
        "run",
        str(QUICKSTART),
        "clients=6",
        "clients_per_rank=balanced",
        f"rounds={ROUNDS}",
        "algorithm={name: codistill}",
        *common,
        "--out",
        str(out),
        "--resume",
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at round 2" in resumed.stdout
    with h5py.File(out, "r") as f:
        assert list(f.attrs["resumed_at"]) == [1] and int(f.attrs["ranks"]) == then
    assert differences(compared(layouts[6] / "codistill.h5"), compared(out)) == []


def test_partial_participation_is_recorded_and_the_others_keep_their_state(layouts):
    """participation 0.5 of 6 clients: 3 take part each round (mpicd.run.participation); checked on
    the 2-rank files (equal on every layout, above)."""
    local, fedavg, codistill = (Results(layouts[2] / f"{name}_half.h5") for name in ("local", "fedavg", "codistill"))
    for res in (local, fedavg, codistill):
        taking = res.metrics["participated"]
        assert (taking.sum(axis=1) == 3).all()
        assert np.isnan(res.metrics["train_loss"][taking == 0]).all()
        assert np.isfinite(res.metrics["train_loss"][taking == 1]).all()
        assert (res.metrics["bytes_sent"][taking == 0] == 0).all() and (
            res.metrics["bytes_recv"][taking == 0] == 0
        ).all()
    assert np.array_equal(local.metrics["participated"], fedavg.metrics["participated"])  # one draw per round
    assert not np.array_equal(local.metrics["participated"][0], local.metrics["participated"][1])
    # local: a client that sits round 2 out is scored on the model it had after round 1
    out = local.metrics["participated"][1] == 0
    assert np.array_equal(local.metrics["test_acc"][1, out], local.metrics["test_acc"][0, out])
    # fedavg: every client takes the participants' average, so all are scored alike
    assert (fedavg.metrics["test_acc"] == fedavg.metrics["test_acc"][:, :1]).all()
    # ccvr: the last round's statistics come from its participants alone; every client recalibrates
    ccvr = Results(layouts[2] / "ccvr_half.h5")
    assert np.array_equal(ccvr.metrics["participated"], fedavg.metrics["participated"])
    sent = ccvr.metrics["bytes_sent"]
    assert (sent[-1][ccvr.metrics["participated"][-1] == 0] == 0).all()
    assert (sent[-1][ccvr.metrics["participated"][-1] == 1] > sent[0].max()).all()
    assert (ccvr.metrics["test_acc"][-1] == ccvr.metrics["test_acc"][-1, 0]).all()
    # co-distillation: teachers and students among the participants only, never oneself
    for r in range(ROUNDS):
        taking, teachers = codistill.metrics["participated"][r], codistill.teacher[r]
        assert ((teachers >= 0) == (taking == 1)).all()
        assert all(taking[t] == 1 and t != s for s, t in enumerate(teachers) if t >= 0)


def test_the_report_gives_both_byte_figures_for_a_packed_run(layouts):
    from mpicd.report import cell_table, collect, group

    path = layouts[2] / "codistill.h5"
    with h5py.File(path, "r") as f:
        mpi = (f["comm/bytes_mpi_sent"][()].sum() + f["comm/bytes_mpi_recv"][()].sum()) / 2 / 2 / ROUNDS
        per_client = (f["metrics/bytes_sent"][()] + f["metrics/bytes_recv"][()]).mean() / 2
    runs, _ = collect([path])
    table = cell_table(group(runs))
    assert "| bytes/round/client | MPI bytes/round/rank |" in table
    assert f"| {per_client:,.0f} | {mpi:,.0f} |" in table
    assert mpi < 3 * per_client  # a rank of 3 clients sends fewer rows than its 3 clients would
