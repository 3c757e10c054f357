"""One client's privacy over a run: its settings, its accountant, its budget and when it ran out.

The algorithms ask :meth:`Budget.request` before every release; the request is granted (and
spent) only if the client's epsilon after it stays within ``privacy.epsilon``, so the epsilon in
the results file never exceeds the budget: a refused client stops sharing from that round on, for
good (what it would release next only grows its epsilon). Each grant costs one PLD composition of
the client's history (:class:`~mpicd.privacy.accountant.Accountant`), whose epsilon is also the
round's value of ``/metrics/epsilon``.

:func:`settings` resolves the config once per run, on every rank alike: sigma given, or derived
from the budget over the planned releases (``rounds`` at most per client: one release per round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .accountant import Accountant, noise_multiplier
from .gaussian import release_multiplier
from .streams import release_generator


@dataclass(frozen=True)
class Settings:
    """The privacy section resolved: sigma known. ``budget`` None: no budget."""

    clip: float
    sigma: float
    q: float
    delta: float
    budget: float | None
    noised_counts: bool

    @property
    def multiplier(self) -> float:
        """The accountant's noise multiplier of one release (sigma / sqrt 2 with noised counts)."""
        return release_multiplier(self.sigma, self.noised_counts)


def settings(section, rounds: int) -> Settings:
    """``privacy`` (mpicd.config.PrivacyConfig) -> :class:`Settings`; ValueError if no sigma >= the
    accountant's floor keeps ``rounds`` releases within the budget."""
    noised = section.counts == "noised"
    sigma = section.noise_multiplier
    if sigma is None:  # the release multiplier that fits, then the sigma that gives it
        fitted = noise_multiplier(section.epsilon, section.delta, section.sample_rate, rounds)
        sigma = fitted * math.sqrt(2.0) if noised else fitted
    return Settings(
        clip=float(section.clip),
        sigma=float(sigma),
        q=float(section.sample_rate),
        delta=float(section.delta),
        budget=None if section.epsilon is None else float(section.epsilon),
        noised_counts=noised,
    )


class Budget:
    """A client's accountant and budget. ``epsilon``: after its last granted release (0 before
    any); ``stopped_at``: the round (from 0) whose release was refused, None while sharing."""

    def __init__(self, settings: Settings, seed: int, client: int):
        self.settings, self.seed, self.client = settings, int(seed), int(client)
        self.accountant = Accountant()
        self.epsilon = 0.0
        self.stopped_at: int | None = None

    def request(
        self, round_index: int, count: int = 1, q: float | None = None, multiplier: float | None = None
    ) -> bool:
        """May the client release in this round (``count`` releases at rate ``q`` and noise
        ``multiplier``, default the settings'; DP-SGD: its steps, q = 1 / batches, multiplier sigma)?
        Granted: spent, True. Refused (epsilon would exceed the budget): it stops sharing for the
        rest of the run, False."""
        if self.stopped_at is not None:
            return False
        trial = Accountant(list(self.accountant.history))
        q = self.settings.q if q is None else q
        trial.spend(q, self.settings.multiplier if multiplier is None else multiplier, count)
        epsilon = trial.epsilon(self.settings.delta)
        if self.settings.budget is not None and epsilon > self.settings.budget:
            self.stopped_at = int(round_index)
            return False
        self.accountant, self.epsilon = trial, epsilon
        return True

    def stopped(self, round_index: int) -> bool:
        """Whether the client has stopped sharing by ``round_index`` (a refused request then or before)."""
        return self.stopped_at is not None and self.stopped_at <= round_index

    def generator(self, round_index: int) -> np.random.Generator:
        """The stream of the client's release in this round: its Poisson sample, then its noise."""
        return release_generator(self.seed, self.client, round_index)

    def state_dict(self) -> dict:
        return {"history": list(self.accountant.history), "epsilon": self.epsilon, "stopped_at": self.stopped_at}

    def load_state_dict(self, state: dict) -> None:
        self.accountant = Accountant([tuple(entry) for entry in state["history"]])
        self.epsilon, self.stopped_at = float(state["epsilon"]), state["stopped_at"]
