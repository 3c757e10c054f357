"""Privacy bookkeeping, as one observer: each private client's nonce and release journal at the start,
and in each round's row its epsilon and the releases it granted (what mpicd verify recomputes epsilon
from). Nothing here when privacy is off."""

from __future__ import annotations

import numpy as np

from mpicd.config.sections import ConfigError
from mpicd.privacy.journal import Journal, SLOTS
from mpicd.run.agreement import raise_agreed
from mpicd.run.client import Client
from mpicd.run.engine import Observer, Round
from mpicd.run.folder import RunFolder
from mpicd.run.plan import Plan


class PrivacyRecords(Observer):
    """Begins every private client's budget with the run's nonce (the run id, or privacy.nonce) and its
    journal beside its checkpoints (collective: a journal that does not read, or whose MACs under the
    site key fail, stops the run on every rank, a ConfigError naming it)."""

    def __init__(self, plan: Plan, clients: list[Client], comm, folder: RunFolder) -> None:
        self.plan, self.clients = plan, clients
        self.nonce = None if plan.privacy is None else plan.privacy.nonce or folder.run_id
        if plan.privacy is None:
            return
        unread = None
        for c in clients:
            try:
                journal = Journal(folder.journal(c.index), folder.key)
            except (OSError, ValueError) as err:
                unread = unread or ConfigError(
                    "--resume",
                    f"{err}: what the client released cannot be known, so the run cannot go on; restore the file, "
                    "or pass --overwrite to start a new run (the releases already sent stay out of its epsilon)",
                )
                journal = None
            c.algorithm.ctx.privacy.begin(self.nonce, journal)
        raise_agreed(comm, unread)  # the rank that read it says why, in one line

    def starting(self, start: int) -> None:
        """At round 1, a key folder without a client's key gets it now (a resume makes none)."""
        if start == 0 and self.plan.privacy is not None:
            for c in self.clients:
                c.algorithm.ctx.privacy.ensure_key()

    def attrs(self) -> dict:
        """The attrs a private run's file records of this run: its nonce and whence it came; and why its
        training metrics are NaN (privacy on: they stay on each client's rank)."""
        if self.plan.privacy is None:
            return {}
        named = self.plan.privacy.nonce is not None
        return {
            "privacy_nonce": self.nonce,
            "privacy_nonce_from": (
                "privacy.nonce: REPEATS the noise of the run whose privacy_nonce this is, with the same keys (two "
                "such runs' releases subtract to the difference of their sums)"
                if named
                else "the run id: 64 random bits drawn at the run's first start, no other run's"
            ),
            "train_metrics": "withheld: privacy is on, so each client's training loss and training-split scores "
            "stay on its rank (NaN here; eval.share_train_metrics)",
        }

    def end_round(self, rnd: Round) -> None:
        for c in self.clients:
            rnd.columns[c.index].update(privacy_row(c, rnd.index))


def privacy_row(client: Client, round_index: int) -> dict:
    """The round's /metrics/epsilon, privacy_stopped and the releases it granted, in slots (q,
    multiplier, steps: what mpicd verify recomputes epsilon from) of a client (nothing: privacy off)."""
    budget = client.algorithm.ctx.privacy
    if budget is None:
        return {}
    q, multiplier, steps = np.full(SLOTS, np.nan), np.full(SLOTS, np.nan), np.zeros(SLOTS, dtype=np.int64)
    for slot, release in enumerate(budget.releases.get(round_index, [])):
        q[slot], multiplier[slot], steps[slot] = release
    return {
        "epsilon": budget.epsilon,
        "privacy_stopped": int(budget.stopped(round_index)),
        "privacy_q": q,
        "privacy_multiplier": multiplier,
        "privacy_steps": steps,
    }
