"""Every byte declared (mpicd/mpi/channels.py): each transfer in mpicd names a declared
channel; a run narrows the payload channel to its algorithm's declaration; what must not travel
with privacy is refused before training. What crosses MPI in real jobs, buffer by buffer, is
audited in tests/algorithms/test_payloads.py (every buffer's channel, class and dtype) and
tests/privacy/test_privacy_wiring.py (no exact class size in a private payload); the file's per-channel
bytes in tests/results/test_verify.py."""

from __future__ import annotations

import ast
import re

import pytest

from mpicd.algorithms import REGISTRY, resolve
from mpicd.config.loading import load_config
from mpicd.config.sections import ConfigError
from mpicd.mpi.channels import CHANNELS, INSTRUMENTATION, PROTOCOL, payload_channel, table

from conftest import QUICKSTART, ROOT, mpicd_cli

TRANSFERS = {
    "exchange", "allreduce_sum", "allreduce_min", "allgather", "gather", "bcast",
    "allreduce_sum_clients", "allreduce_sum_exact", "allgather_clients", "first_failing_rank",
}  # fmt: skip


def transfer_calls():
    """(file, line, method, channel or None) of every call of a Comm transfer method in mpicd/."""
    for path in sorted((ROOT / "mpicd").rglob("*.py")):
        if path.name == "comm.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in TRANSFERS:
                channel = next((k.value for k in node.keywords if k.arg == "channel"), None)
                yield path.relative_to(ROOT), node.lineno, node.func.attr, channel


def test_every_transfer_in_mpicd_names_a_declared_channel():
    calls = list(transfer_calls())
    assert len(calls) >= 25  # the loop, the writer, the runner, the algorithms, the sweep, the node share
    for where, line, method, channel in calls:
        if method == "first_failing_rank" and channel is None:
            continue  # its default channel, "failure"
        assert isinstance(channel, ast.Constant), (where, line, method, "channel= must be a literal name")
        assert channel.value in CHANNELS, (where, line, method, channel.value)
    named = {c.value for *_, c in calls if isinstance(c, ast.Constant)} | {"failure", "layout"}
    assert named == set(CHANNELS), set(CHANNELS) ^ named  # no channel declared that nothing uses


def test_the_classes_are_protocol_or_instrumentation_and_the_writers_channels_reach_only_it():
    assert {c.cls for c in CHANNELS.values()} == {PROTOCOL, INSTRUMENTATION}
    assert {n for n, c in CHANNELS.items() if c.role == "payload"} == {"payload"}
    assert {n for n, c in CHANNELS.items() if c.reach == "writer"} == {"rows", "placement", "progress"}
    assert all(c.operations == ("gather",) for c in CHANNELS.values() if c.reach == "writer")
    assert all(c.cls == INSTRUMENTATION for c in CHANNELS.values() if c.reach in ("writer", "all"))


@pytest.mark.parametrize(
    "section, dtypes, operations",
    [
        ({"name": "codistill"}, ("float32",), ("p2p",)),
        ({"name": "codistill", "classes": "all"}, ("float32",), ("allgather",)),
        ({"name": "fedavg"}, ("float32",), ("allreduce",)),
        ({"name": "fedavg", "reduction": "exact"}, ("float64", "int64"), ("allreduce",)),
        ({"name": "fedproto", "reduction": "exact"}, ("float64", "int64"), ("allreduce",)),
        ({"name": "feddistill", "reduction": "exact"}, ("float64", "int64"), ("allreduce",)),
        ({"name": "fedamp", "exchange": "ring"}, ("float32",), ("p2p",)),
        ({"name": "ccvr"}, ("float32", "float64"), ("allreduce",)),  # FedAvg's, and its float64 statistics
        ({"name": "ccvr", "reduction": "exact"}, ("float64", "int64"), ("allreduce",)),
        ({"name": "local"}, (), ()),
        ({"name": "centralized"}, (), ()),
    ],
)
def test_a_run_narrows_the_payload_channel_to_its_algorithms_declaration(section, dtypes, operations):
    cls, params = resolve(section)
    channel = payload_channel(cls, params)
    assert (channel.name, channel.cls, channel.dtypes, channel.operations) == ("payload", PROTOCOL, dtypes, operations)


def test_every_declared_payload_is_float32_unless_it_is_an_exact_reduction():
    """One exception, named: CCVR's last-round moments are float64 (their covariance cancels)."""
    for cls in REGISTRY.values():
        for p in cls.payloads:
            exact = ("reduction", "exact") in p.when
            if cls.name == "ccvr" and p.rounds == "last" and not exact:
                assert p.dtypes == ("float64",)
                continue
            assert p.dtypes == (("float64", "int64") if exact else ("float32",)), (cls.name, p)


def test_the_docs_list_every_channel_as_generated():
    text = (ROOT / "docs" / "explanation" / "what-leaves-a-rank.md").read_text()
    begin, end = "<!-- channel table: begin -->", "<!-- channel table: end -->"
    assert text.count(begin) == 1 and text.count(end) == 1, "what-leaves-a-rank.md lost its channel table markers"
    assert text.split(begin)[1].split(end)[0].strip("\n") == table(), (
        "docs/explanation/what-leaves-a-rank.md is stale: run .venv/bin/python tools/docs_tables.py"
    )
    for name, channel in CHANNELS.items():
        if channel.role != "payload":
            assert f"| `{name}` |" in table()


# ------------------------------------------------------------------ refused before training


def test_diagnostics_with_privacy_is_refused_naming_both_keys():
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, ["eval.diagnostics=true", "privacy={noise_multiplier: 1}"])
    assert err.value.key == "eval.diagnostics" and "privacy" in str(err.value)
    load_config(QUICKSTART, ["eval.diagnostics=true"])  # without privacy: allowed
    load_config(QUICKSTART, ["privacy={noise_multiplier: 1}"])


def test_mpicd_check_refuses_diagnostics_with_privacy_with_exit_2():
    result = mpicd_cli("check", str(QUICKSTART), "eval.diagnostics=true", "privacy={epsilon: 4}")
    assert result.returncode == 2, (result.stdout, result.stderr)
    line = result.stderr.strip()
    assert "eval.diagnostics" in line and "privacy" in line and len(line.splitlines()) == 1, line


@pytest.mark.parametrize(
    "section, refused",
    [
        ("{noise_multiplier: 1, counts: public}", True),
        ("{epsilon: 4, counts: public}", True),  # sigma derived: > 0
        ("{noise_multiplier: 1, counts: public, noise: seeded}", False),  # already marked NOT PRIVATE
        ("{noise_multiplier: 0, counts: public}", False),  # exact releases: epsilon infinite
        ("{noise_multiplier: 1}", False),  # counts noised, the default
    ],
)
def test_exact_class_sizes_are_refused_where_the_run_claims_privacy(section, refused):
    if refused:
        with pytest.raises(ConfigError) as err:
            load_config(QUICKSTART, [f"privacy={section}"])
        assert err.value.key == "privacy.counts" and re.search(r"zero-out", str(err.value))
    else:
        load_config(QUICKSTART, [f"privacy={section}"])
