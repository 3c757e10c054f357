"""What leaves a rank: every algorithm's declared payload and bytes per round,
checked against hand-computed numbers, against the ledger of real ``mpicd run`` jobs round by round
and rank by rank, and against every buffer that crossed MPI while training on images repainted from
a few distinctive float32 values (none may carry one; deliberately leaky algorithms must be caught).

One MPI job (``tests/drivers/payloads.py``, 3 ranks) serves the MPI tests.
"""

from __future__ import annotations

import itertools
import json
import typing

import numpy as np
import pytest

from mpicd.algorithms import REGISTRY, payload_table, resolve, Sizes
from mpicd.models.networks import build_model
from mpicd.mpi.accounting import KINDS
from mpicd.mpi.channels import CHANNELS, payload_channel
from mpicd.results.reader import Results

from conftest import DRIVERS, ROOT, mpiexec, require_pneumonia
from drivers.driver_settings import PAYLOAD_VARIANTS

# P by hand from the layer shapes in mpicd/models/networks.py (weights + biases), 1 grey channel, C = 2.
LENET_P = (
    (6 * 1 * 5 * 5 + 6)  # conv 5x5, 1 -> 6
    + (16 * 6 * 5 * 5 + 16)  # conv 5x5, 6 -> 16
    + (120 * 16 * 3 * 3 + 120)  # conv 3x3, 16 -> 120
    + (200 * 120 + 200)  # Linear 120 -> D = 200 (tanh)
    + (2 * 200 + 2)
)  # head Linear 200 -> 2
# torchvision's ResNet-18 with a 1-channel conv1 (7x7 -> 64, no bias) and fc = Linear(512, 2):
# the published 11,689,512 for 3 channels and 1000 classes, minus conv1's 2 extra channels and the
# old fc. Floating buffers: running mean and var of its 20 BatchNorms, 4,800 channels in all.
RESNET18_P = 11_689_512 - 64 * 2 * 7 * 7 - (512 * 1000 + 1000) + (512 * 2 + 2)
RESNET18_B = 2 * (64 + 4 * 64 + (4 * 128 + 128) + (4 * 256 + 256) + (4 * 512 + 512))
LENET = Sizes(N=4, C=2, D=200, P=44_574, B=0)
RESNET = Sizes(N=6, C=2, D=512, P=11_171_266, B=9_600)
RANKS = 3  # the driver's job


def params(name: str, **options):
    return resolve({"name": name, **options})[1]


def only(kind: str | None, sent: int = 0, recv: int = 0) -> dict:
    """A bytes_per_round result with one kind non-zero."""
    counts = dict.fromkeys(KINDS, (0, 0))
    if kind:
        counts[kind] = (sent, recv)
    return counts


def test_ccvr_adds_its_statistics_in_the_last_round_only():
    # [S ; upper(Q) ; n]: 2 * 200 + 2 * 200 * 201 / 2 + 2 = 40,602 float64 = 324,816 bytes; exact: 8 + 8 * 40,602
    last = REGISTRY["ccvr"].bytes_per_round(LENET, params("ccvr"), last=True)
    assert last == only("allreduce", 178_300 + 324_816, 178_300 + 324_816)
    exact = REGISTRY["ccvr"].bytes_per_round(LENET, params("ccvr", reduction="exact"), last=True)
    assert exact == only("allreduce", 356_608 + 324_824, 356_608 + 324_824)
    for name in REGISTRY:  # no other method declares a last-round payload
        if name != "ccvr":
            p = resolve({"name": name})[1]
            assert REGISTRY[name].bytes_per_round(LENET, p, 1, last=True) == REGISTRY[name].bytes_per_round(LENET, p, 1)


def test_hand_derived_sizes_are_the_models():
    assert LENET_P == 44_574 and RESNET18_P == 11_171_266 and RESNET18_B == 9_600
    assert Sizes.of(build_model("lenet", (1, 28, 28), 2, 200, 64), 4) == LENET
    assert Sizes.of(build_model("resnet18", (1, 28, 28), 2, 200, 64), 6) == RESNET


@pytest.mark.parametrize(
    "name, options, students, expected",
    [
        # co-distillation: 4 D = 800 per student served, 800 from its teacher
        ("codistill", {}, 0, only("p2p", 0, 800)),
        ("codistill", {}, 1, only("p2p", 800, 800)),
        ("codistill", {}, 3, only("p2p", 2400, 800)),
        ("codistill", {"teacher_per": "batch"}, 2, only("allgather", 800, 3200)),  # D; N D
        ("codistill", {"classes": "all"}, 2, only("allgather", 1600, 6400)),  # C D; N C D
        ("codistill", {"classes": "all", "teacher_per": "batch"}, 0, only("allgather", 1600, 6400)),
        # share: logits: C = 2 floats, 8 bytes, where D = 200 were
        ("codistill", {"share": "logits"}, 0, only("p2p", 0, 8)),
        ("codistill", {"share": "logits"}, 3, only("p2p", 24, 8)),
        ("codistill", {"share": "logits", "term_mean": "batch"}, 1, only("p2p", 8, 8)),
        ("codistill", {"share": "logits", "teacher_per": "batch"}, 2, only("allgather", 8, 32)),  # C; N C
        ("codistill", {"share": "logits", "classes": "all"}, 2, only("allgather", 16, 64)),  # C C; N C C
        ("codistill", {"term_mean": "batch"}, 1, only("p2p", 800, 800)),
        ("fedavg", {}, 0, only("allreduce", 178_300, 178_300)),  # 4 (44,574 + 1)
        ("fedproto", {}, 0, only("allreduce", 1608, 1608)),  # 4 * 2 * 201
        ("fedproto", {"weighting": "equal"}, 0, only("allreduce", 1608, 1608)),
        ("feddistill", {}, 0, only("allreduce", 24, 24)),  # 4 * 2 * 3
        ("feddistill", {"exclude_self": False}, 0, only("allreduce", 24, 24)),
        # reduction: exact: one float64 maximum, then every value as int64
        ("fedavg", {"reduction": "exact"}, 0, only("allreduce", 356_608, 356_608)),  # 8 + 8 (44,574 + 1)
        ("fedproto", {"reduction": "exact"}, 0, only("allreduce", 3224, 3224)),  # 8 + 8 * 2 * 201
        ("fedproto", {"weighting": "equal", "reduction": "exact"}, 0, only("allreduce", 3224, 3224)),
        ("feddistill", {"reduction": "exact"}, 0, only("allreduce", 56, 56)),  # 8 + 8 * 2 * 3
        ("fedamp", {}, 0, only("allgather", 178_296, 713_184)),  # 4 P; 4 * 4 P
        ("fedamp", {"similarity": "cosine"}, 0, only("allgather", 178_296, 713_184)),
        ("fedamp", {"exchange": "ring"}, 0, only("p2p", 534_888, 534_888)),  # 3 steps of 4 P
        ("local", {}, 0, only(None)),
        ("centralized", {}, 0, only(None)),
        ("ccvr", {}, 0, only("allreduce", 178_300, 178_300)),  # FedAvg's, but in the last round
    ],
)
def test_bytes_per_round_lenet(name, options, students, expected):
    assert REGISTRY[name].bytes_per_round(LENET, params(name, **options), students) == expected


@pytest.mark.parametrize(
    "name, options, students, expected",
    [
        ("fedavg", {}, 0, only("allreduce", 44_723_468, 44_723_468)),  # 4 (P + B + 1)
        ("fedamp", {}, 0, only("allgather", 44_685_064, 268_110_384)),  # 4 P; 6 * 4 P
        ("fedamp", {"exchange": "ring"}, 0, only("p2p", 223_425_320, 223_425_320)),  # 5 * 4 P
        ("codistill", {}, 2, only("p2p", 4096, 2048)),
        ("fedproto", {}, 0, only("allreduce", 4104, 4104)),
        ("feddistill", {}, 0, only("allreduce", 24, 24)),
    ],
)
def test_bytes_per_round_resnet18(name, options, students, expected):
    assert REGISTRY[name].bytes_per_round(RESNET, params(name, **options), students) == expected


def test_a_single_client_exchanges_what_its_code_does():
    one = Sizes(N=1, C=2, D=200, P=44_574)
    assert REGISTRY["codistill"].bytes_per_round(one, params("codistill")) == only(None)  # no peer, no message
    assert REGISTRY["codistill"].bytes_per_round(one, params("codistill", classes="all")) == only(None)
    assert REGISTRY["codistill"].bytes_per_round(one, params("codistill", share="logits")) == only(None)
    assert REGISTRY["fedamp"].bytes_per_round(one, params("fedamp", exchange="ring")) == only(None)  # 0 steps
    assert REGISTRY["fedamp"].bytes_per_round(one, params("fedamp")) == only("allgather", 178_296, 178_296)
    assert REGISTRY["fedavg"].bytes_per_round(one, params("fedavg")) == only("allreduce", 178_300, 178_300)


# Six clients on three ranks, two each, and the round's teachers t(s), drawn by hand so that a teacher has
# students on its own rank and on two others, and two students on one rank share a teacher.
OWNER = np.array([0, 0, 1, 1, 2, 2])
TEACHERS = np.array([2, 3, 0, 0, 0, 1])  # student s learns from TEACHERS[s]
# (T, U) per rank, counted by hand from the pairs (student -> teacher) 0->2, 1->3, 2->0, 3->0, 4->0, 5->1:
# rank 0 sends client 0's R to rank 1 (students 2, 3: one row) and to rank 2 (student 4), client 1's R to
# rank 2 (student 5): T = 3; it receives the R of clients 2 and 3 (rank 1): U = 2. Rank 1 sends the R of
# clients 2 and 3 to rank 0: T = 2; receives client 0's once: U = 1. Rank 2 teaches nobody: T = 0, and
# receives the R of clients 0 and 1: U = 2. Rows sent (5) equal rows received (5).
HAND_ROWS = [(3, 2), (2, 1), (0, 2)]


def test_point_to_point_rows_are_the_algorithms_declaration():
    """mpicd verify learns a rank's T and U (Payload.rank_sent / rank_recv) from Algorithm.p2p_rows: co-distillation
    declares them for its point-to-point exchange, every other method and option has none."""
    codistill = REGISTRY["codistill"]
    assert codistill.p2p_rows(params("codistill"), TEACHERS, OWNER) == HAND_ROWS
    assert codistill.p2p_rows(params("codistill", share="logits"), TEACHERS, OWNER) == HAND_ROWS
    sitting_out = np.where(np.arange(6) == 5, -1, TEACHERS)  # client 5 sits the round out: no row of client 1
    assert codistill.p2p_rows(params("codistill"), sitting_out, OWNER) == [(2, 2), (2, 1), (0, 1)]
    one_per_rank = np.arange(6)  # a client per rank: T = its students (all elsewhere), U = 1 (its teacher's R)
    alone = [(3, 1), (1, 1), (1, 1), (1, 1), (0, 1), (0, 1)]
    assert codistill.p2p_rows(params("codistill"), TEACHERS, one_per_rank) == alone
    declared = codistill.rank_bytes_per_round(LENET, params("codistill"), 2, *HAND_ROWS[0])
    assert declared == only("p2p", 4 * 200 * 3, 4 * 200 * 2)  # 4 D T sent, 4 D U received
    for options in ({"teacher_per": "batch"}, {"classes": "all"}, {"teacher_per": "batch", "classes": "all"}):
        assert codistill.p2p_rows(params("codistill", **options), TEACHERS, OWNER) is None, options  # Allgathers
    for bad in ([0, 3, 0, 0, 0, 1], [2, 3, 0, 0, 6, 1], [2, 3, 0, -2, 0, 1]):  # itself, no client, not -1
        with pytest.raises(ValueError):
            codistill.p2p_rows(params("codistill"), np.array(bad), OWNER)
    for name, cls in REGISTRY.items():
        if name != "codistill":
            assert all(cls.p2p_rows(p, TEACHERS, OWNER) is None for p in option_grid(cls)), name


def option_grid(cls) -> list:
    """Every combination of the values of the Params' Literal and bool fields (the rest default)."""
    choices = {}
    for field, hint in typing.get_type_hints(cls.Params).items():
        if typing.get_origin(hint) is typing.Literal:
            choices[field] = typing.get_args(hint)
        elif hint is bool:
            choices[field] = (True, False)
    return [cls.Params(**dict(zip(choices, combo))) for combo in itertools.product(*choices.values())]


@pytest.mark.parametrize("name", REGISTRY)
def test_every_option_combination_selects_exactly_one_declared_payload(name):
    cls = REGISTRY[name]
    grid = option_grid(cls)
    assert len(grid) >= {"codistill": 16, "fedproto": 4, "fedamp": 4, "feddistill": 2}.get(name, 1)
    for p in grid:
        assert (cls.payload_for(p) is not None) == bool(cls.payloads), p  # payload_for raises on two


def test_the_docs_table_is_the_generated_table():
    text = (ROOT / "docs" / "explanation" / "what-leaves-a-rank.md").read_text()
    begin, end = "<!-- payload table: begin -->", "<!-- payload table: end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, "what-leaves-a-rank.md lost its payload table markers"
    assert text.split(begin)[1].split(end)[0].strip("\n") == payload_table(), (
        "docs/explanation/what-leaves-a-rank.md is stale: run .venv/bin/python tools/docs_tables.py"
    )
    assert "no image, label or per-sample value ever crosses MPI" in " ".join(text.split())


def test_the_table_lists_every_declared_payload():
    table = payload_table().splitlines()
    assert len(table) == 2 + sum(max(1, len(cls.payloads)) for cls in REGISTRY.values())
    for name, cls in REGISTRY.items():
        rows = [row for row in table if row.startswith(f"| `{name}` |")]
        assert len(rows) == max(1, len(cls.payloads))
        for row, p in zip(rows, cls.payloads):
            assert f"| {p.sent.replace('*', '·')} | {p.recv.replace('*', '·')} |" in row and f"(`{p.kind}`)" in row


# ------------------------------------------------------------------ under mpiexec (one job)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    data = require_pneumonia()
    out = tmp_path_factory.mktemp("payloads")
    result = mpiexec(RANKS, str(DRIVERS / "payloads.py"), str(out), str(data), timeout=1200)
    assert result.returncode == 0, f"payloads driver failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    return out


BYTE_VARIANTS = PAYLOAD_VARIANTS


@pytest.mark.parametrize("label", BYTE_VARIANTS)
def test_ledger_equals_the_declared_bytes_every_round_and_rank(job, label):
    res = Results(job / f"bytes_{label}.h5")
    cls, p = resolve(BYTE_VARIANTS[label])
    assert res.attrs["num_parameters"] == LENET_P and res.completed_rounds == 3
    sizes = Sizes(N=RANKS, C=2, D=int(res.attrs["feature_dim"]), P=LENET_P, B=0)
    assert sizes.D == 200
    for r in range(res.completed_rounds):
        for rank in range(RANKS):
            students = int((res.teacher[r] == rank).sum())
            want = cls.bytes_per_round(sizes, p, students, last=r == int(res.attrs["rounds"]) - 1)
            for k, kind in enumerate(res.kinds):  # every kind: those the table does not list are 0
                got = (int(res.bytes_sent_by_kind[r, rank, k]), int(res.bytes_recv_by_kind[r, rank, k]))
                assert got == want[kind], (label, r, rank, kind)


def test_codistill_byte_run_covers_teachers_of_zero_one_and_two_students(job):
    res = Results(job / "bytes_codistill.h5")
    served = {int((res.teacher[r] == rank).sum()) for r in range(res.completed_rounds) for rank in range(RANKS)}
    assert {0, 1, 2} <= served
    assert (res.teacher != np.arange(RANKS)).all() and (res.teacher >= 0).all()


def pixel_reports(job) -> list[dict]:
    return [json.loads((job / f"pixels_rank{r}.json").read_text()) for r in range(RANKS)]


@pytest.mark.parametrize("label", BYTE_VARIANTS)
def test_no_pixel_value_is_in_any_buffer_that_crossed_mpi(job, label):
    res = Results(job / f"pixels_{label}.h5")
    cls, p = resolve(BYTE_VARIANTS[label])
    sizes = Sizes(N=RANKS, C=2, D=200, P=LENET_P, B=0)
    declared = payload_channel(cls, p)
    for rank, report in enumerate(pixel_reports(job)):
        seen = report[label]
        assert seen["refused"] is None and seen["findings"] == [], (label, rank)
        # every buffer that crossed was on a declared channel of its class, of a dtype it declares;
        # what only the writer needs reached no other rank; the ledger counted each channel's bytes
        for channel, (cls_name, _, sent, dtypes) in seen["audit"].items():
            assert channel in CHANNELS and cls_name == CHANNELS[channel].cls, (label, rank, channel)
            allowed = declared.dtypes if channel == "payload" else CHANNELS[channel].dtypes
            assert set(dtypes) <= set(allowed), (label, rank, channel, dtypes)
            assert seen["ledger_channels"][channel][0] == sent, (label, rank, channel)
        assert {"rows", "progress", "layout", "stop"} <= set(seen["audit"]), (label, rank)  # placement: serial only
        if rank != 0:
            assert seen["ledger_channels"]["rows"][1] == seen["ledger_channels"]["progress"][1] == 0, (label, rank)
        assert "diagnostics" not in seen["audit"]
        # the rounds moved the declared payload, the recorder saw every byte the ledger counted (in
        # and outside rounds), and nothing of the communicator was used but its rank and size
        for kind in KINDS:
            assert seen["rounds_sent"][kind] == sum(
                cls.bytes_per_round(
                    sizes, p, int((res.teacher[r] == rank).sum()), last=r == int(res.attrs["rounds"]) - 1
                )[kind][0]
                for r in range(res.completed_rounds)
            ), (label, rank, kind)
        assert seen["recorded_sent"] == seen["ledger_sent"], (label, rank)
        assert set(seen["other"]) <= {"Get_rank", "Get_size", "Barrier"}, (label, rank)
    if cls.payloads:
        assert sum(report[label]["rounds_sent"][cls.payload_for(p).kind] for report in pixel_reports(job)) > 0


def test_a_pixel_inside_a_declared_payload_is_found_by_the_search(job):
    """One pixel inside a feature vector sent point to point, of the payload's own dtype and
    operation: the declaration lets it through, the search finds it (the clean results above are
    not for want of looking)."""
    for rank, report in enumerate(pixel_reports(job)):
        hits = report["leak_pixel_p2p"]["findings"]
        assert report["leak_pixel_p2p"]["refused"] is None
        assert hits and all("float32(1, 200)" in hit for hit in hits), (rank, hits)


@pytest.mark.parametrize(
    "leak, why",
    [
        ("leak_image", "channel 'payload' declares allreduce, not allgather; nothing was sent"),
        ("leak_pixel_float64", "channel 'payload' declares float32, but a float64 buffer (8,) was about to be sent"),
    ],
)
def test_a_buffer_its_payload_does_not_declare_is_refused_before_it_is_sent(job, leak, why):
    """One raw image on an operation FedAvg does not declare, one pixel widened to float64 on
    FedProto's float32 payload: every rank refuses it before posting anything, and no buffer that
    did cross holds a pixel."""
    for rank, report in enumerate(pixel_reports(job)):
        assert why in (report[leak]["refused"] or ""), (leak, rank, report[leak]["refused"])
        assert report[leak]["findings"] == [], (leak, rank)
