"""The round hooks' defaults (mpicd.algorithms.base.Algorithm): an exchange written once at rank level
(before_round / after_round) also serves a rank holding one client (before_epoch / after_epoch), and a
per-client hook is what the rank-level default runs, without either default calling the other forever."""

from __future__ import annotations

from mpicd.algorithms import REGISTRY
from mpicd.algorithms.base import Algorithm


def calls_of(cls: type[Algorithm]) -> tuple[list, list]:
    members = [cls(None, None), cls(None, None)]
    for m in members:
        m.calls = []
    cls.before_round(members, 3)
    cls.after_round(members, 3)
    at_rank = [c for m in members for c in m.calls]
    for m in members:
        m.calls = []
    members[0].before_epoch(4)
    members[0].after_epoch(4)
    return at_rank, members[0].calls


class RankLevel(Algorithm):
    name = "rank_level"

    @classmethod
    def before_round(cls, members, round_index):
        members[0].calls.append(("before_round", len(members), round_index))

    @classmethod
    def after_round(cls, members, round_index):
        members[0].calls.append(("after_round", len(members), round_index))


class PerClient(Algorithm):
    name = "per_client"

    def before_epoch(self, round_index):
        self.calls.append(("before_epoch", round_index))

    def after_epoch(self, round_index):
        self.calls.append(("after_epoch", round_index))


class Extended(RankLevel):
    """A rank-level hook that also runs the default's per-client loop: no recursion, the default epoch
    hooks are skipped (they would only come back here)."""

    name = "extended"

    @classmethod
    def after_round(cls, members, round_index):
        Algorithm.after_round.__func__(cls, members, round_index)
        members[0].calls.append(("extended", len(members), round_index))


def test_a_rank_level_exchange_serves_one_client_too():
    at_rank, alone = calls_of(RankLevel)
    assert at_rank == [("before_round", 2, 3), ("after_round", 2, 3)]
    assert alone == [("before_round", 1, 4), ("after_round", 1, 4)]


def test_the_rank_level_default_runs_each_clients_own_hooks():
    at_rank, alone = calls_of(PerClient)
    assert at_rank == [("before_epoch", 3), ("after_epoch", 3)] * 2
    assert alone == [("before_epoch", 4), ("after_epoch", 4)]


def test_no_hook_is_nothing_and_the_defaults_never_loop():
    assert calls_of(Algorithm) == ([], [])
    at_rank, alone = calls_of(Extended)
    assert at_rank == [("before_round", 2, 3), ("extended", 2, 3)]
    assert alone == [("before_round", 1, 4), ("extended", 1, 4)]


def test_every_method_that_exchanges_at_rank_level_keeps_the_one_client_path():
    """What FedAvg, FedProto, FedDistill, FedAMP (after_round) and co-distillation (before_round) each wrote
    by hand before: the per-client hook runs the rank-level exchange for [self]."""
    for name, hook, per_client in (
        ("fedavg", "after_round", "after_epoch"),
        ("fedproto", "after_round", "after_epoch"),
        ("feddistill", "after_round", "after_epoch"),
        ("fedamp", "after_round", "after_epoch"),
        ("ccvr", "after_round", "after_epoch"),
        ("codistill", "before_round", "before_epoch"),
    ):
        cls = REGISTRY[name]
        seen = []
        patched = type(f"Probe_{name}", (cls,), {hook: classmethod(lambda c, members, r: seen.append((members, r)))})
        probe = object.__new__(patched)
        getattr(probe, per_client)(7)
        assert seen == [([probe], 7)], name
