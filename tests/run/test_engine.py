"""The round engine's contract with its observers (mpicd.run.engine), without MPI: ``finish`` once,
after the last round or after the round an agreed stop came after, with which; ``close`` always, also
when a round raises; and the interrupt watcher stands down in ``finish`` (mpicd.run.progress), before the
end's collectives, so it cannot exit between deleting the checkpoints and claiming the last round."""

import threading
from types import SimpleNamespace

import pytest

from mpicd.run import signals
from mpicd.run.engine import Observer, Round, RoundEngine
from mpicd.run.progress import Progress


class Spy(Observer):
    def __init__(self):
        self.events = []

    def finish(self, stopped):
        self.events.append(("finish", stopped))

    def close(self):
        self.events.append(("close",))


def engine(rounds: int, round_step) -> tuple[RoundEngine, Spy, Spy]:
    """An engine whose rounds are ``round_step(r)`` (the training and evaluation are the clients'; not
    these tests' subject), told to two observers."""
    first, second = Spy(), Spy()
    plan = SimpleNamespace(config=SimpleNamespace(rounds=rounds, clients=1, participation=1.0))
    made = RoundEngine(plan, [object()], SimpleNamespace(size=1), [first, second], training=None)
    made.round = round_step
    return made, first, second


def test_every_round_run_then_finish_once_then_close():
    ran = []
    made, first, second = engine(3, lambda r: ran.append(r) or Round(r, 0.0))
    assert made.run(1) is None
    assert ran == [1, 2]
    assert first.events == second.events == [("finish", False), ("close",)]


def test_an_agreed_stop_ends_the_rounds_and_finishes_as_stopped():
    ran = []
    made, first, _ = engine(5, lambda r: ran.append(r) or Round(r, 0.0, stop=r == 1))
    stopped = made.run(0)
    assert stopped.index == 1 and ran == [0, 1]
    assert first.events == [("finish", True), ("close",)]


def test_a_round_that_raises_still_closes_every_observer_and_finishes_none():
    def fails(r):
        raise RuntimeError("a rank failed")

    made, first, second = engine(3, fails)
    with pytest.raises(RuntimeError):
        made.run(0)
    assert first.events == second.events == [("close",)]


@pytest.mark.parametrize(
    "asked, stopped, stands_down",
    [(0, False, False), (1, False, False), (signals.INTERRUPTED, False, True), (1, True, True)],
)
def test_the_interrupt_watcher_stands_down_at_finish_after_a_stop_or_an_interrupt(asked, stopped, stands_down):
    request = signals.StopRequest()
    request.requested = asked
    plan = SimpleNamespace(config=SimpleNamespace(rounds=3, clients=1))
    Progress(plan, [], SimpleNamespace(rank=1), request, print, 0).finish(stopped)
    assert request.done.is_set() is stands_down
    assert isinstance(request.done, threading.Event)
