"""One client's privacy over a run: its settings, its accountant, its budget and when it ran out.

The algorithms ask :meth:`Budget.request` before every release; the request is granted (and
spent) only if the client's epsilon after it stays within ``privacy.epsilon``, so the epsilon in
the results file never exceeds the budget: a refused client stops sharing from that round on, for
good (what it would release next only grows its epsilon). A granted release is handed to
:meth:`Budget.released` before it is sent, which writes it to the client's journal
(:mod:`mpicd.privacy.journal`): what left is on disk before it leaves, whatever happens to the
checkpoints after. Each grant costs one PLD composition of
the client's history (:class:`~mpicd.privacy.accountant.Accountant`), whose epsilon is also the
round's value of ``/metrics/epsilon``.

:func:`settings` resolves the config once per run, on every rank alike: sigma given, or derived
from the budget over the planned releases (``rounds`` at most per client: one release per round).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from mpicd.privacy import secret
from mpicd.privacy.accountant import Accountant, noise_multiplier
from mpicd.privacy.gaussian import release_multiplier
from mpicd.privacy.journal import digest, Entry, Journal, ReleaseMismatch, SLOTS
from mpicd.privacy.streams import RELEASE, stream


@dataclass(frozen=True)
class Settings:
    """The privacy section resolved: sigma known. ``budget`` None: no budget."""

    clip: float
    sigma: float
    q: float
    delta: float
    budget: float | None
    noised_counts: bool
    noise: str = "secret"  # privacy.noise: "seeded" is repeatable and not private
    key_dir: str | None = None  # privacy.key_dir: this site's key files (None: a fresh key per run)
    nonce: str | None = None  # privacy.nonce: another run's nonce, to repeat its noise (None: this run's id)

    @property
    def private(self) -> bool:
        """Whether a peer cannot redraw the noise: False for ``privacy.noise: seeded``."""
        return self.noise == "secret"

    @property
    def multiplier(self) -> float:
        """The accountant's noise multiplier of one release (sigma / sqrt 2 with noised counts)."""
        return release_multiplier(self.sigma, self.noised_counts)


def settings(section, rounds: int) -> Settings:
    """``privacy`` (mpicd.config.sections.PrivacyConfig) -> :class:`Settings`; ValueError if no sigma >= the
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
        noise=section.noise,
        key_dir=section.key_dir,
        nonce=section.nonce,
    )


class KeyMismatch(ValueError):
    """A resume whose ``privacy.key_dir`` is not where the checkpoint's key came from, or whose journal
    holds less than the checkpoint says it did: the checkpoint and the site disagree."""


class Budget:
    """A client's accountant, budget, secret key and release journal. ``epsilon``: after its last
    granted release (0 before any); ``stopped_at``: the round (from 0) whose release was refused,
    None while sharing; ``key``: what its streams are drawn from with secret noise
    (mpicd.privacy.secret: from the operating system's entropy or ``privacy.key_dir``; in the
    checkpoint, never sent or written to the results file), with ``nonce``, the run's, given by
    :meth:`begin`; ``releases``: {round: [(q, multiplier, steps) per release]} granted in this job."""

    def __init__(self, settings: Settings, seed: int, client: int):
        self.settings, self.seed, self.client = settings, int(seed), int(client)
        self.key: bytes | None = None
        self.key_from = ""  # where the key came from, in words: for a mismatch on resume
        if settings.noise == "secret" and settings.key_dir is None:
            self.key, self.key_from = secret.new_key(), "a fresh key of the run's first job (no privacy.key_dir)"
        elif settings.noise == "secret":  # read, never made here: a resume takes the checkpoint's (ensure_key)
            self.key = secret.site_key(settings.key_dir, client, create=False)
            self.key_from = f"the key file {secret.key_file(settings.key_dir, client)}"
        self.nonce: bytes | None = None
        self.journal: Journal | None = None
        self.accountant = Accountant()
        self.epsilon = 0.0
        self.stopped_at: int | None = None
        self.releases: dict[int, list[tuple[float, float, int]]] = {}
        # granted, not yet handed to released(); a grant whose payload is never sent (a step dropped by
        # on_nonfinite: skip) stays spent and is replaced by the next: nothing left, nothing to journal
        self._granted: tuple[int, int, float, float, int] | None = None

    def begin(self, nonce: str, journal: Journal | None) -> None:
        """The run's nonce (16 hex digits: its id, or ``privacy.nonce``) and this client's journal
        (None: releases are not journaled, for callers that send nothing)."""
        self.nonce = secret.nonce_bytes(nonce)
        self.journal = journal

    def ensure_key(self) -> None:
        """The run starts at round 1: a ``privacy.key_dir`` without this client's key file gets one now."""
        if self.settings.noise == "secret" and self.key is None:
            self.key = secret.site_key(self.settings.key_dir, self.client, create=True)

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
        multiplier = self.settings.multiplier if multiplier is None else multiplier
        trial.spend(q, multiplier, count)
        epsilon = trial.epsilon(self.settings.delta)
        if self.settings.budget is not None and epsilon > self.settings.budget:
            self.stopped_at = int(round_index)
            return False
        made = self.releases.setdefault(int(round_index), [])
        if len(made) == SLOTS:
            raise RuntimeError(
                f"privacy: client {self.client} asks for more than {SLOTS} releases in round {round_index}"
            )
        self.accountant, self.epsilon = trial, epsilon
        self._granted = (int(round_index), len(made), float(q), float(multiplier), int(count))
        made.append(self._granted[2:])
        return True

    def released(self, round_index: int, payload) -> None:
        """The granted release of ``round_index`` is ``payload`` (an array, or DP-SGD's parameters):
        journaled and fsynced before the caller sends it. In a round the journal already holds (a
        restart computing it again), the payload must be the one that left: else
        :class:`~mpicd.privacy.journal.ReleaseMismatch`, and nothing is sent."""
        granted, self._granted = self._granted, None
        if granted is None or granted[0] != int(round_index):
            raise RuntimeError(f"privacy: client {self.client} releases in round {round_index} without a grant")
        entry = Entry(*granted, digest(payload))
        if self.journal is None:
            return
        before = self.journal.get(round_index, entry.slot)
        if before is None:
            self.journal.record(entry)
        elif before != entry:
            raise ReleaseMismatch(
                f"privacy: client {self.client}'s release of round {round_index + 1}, computed again after the restart, "
                f"differs from the one {self.journal.path} says left its rank before it ({_what_differs(before, entry)}): "
                "sending it would let a peer subtract the noise of the two; resume on the CPU model, thread count, "
                "device and number of ranks of the first job (the float32 average of algorithm.reduction: mpi depends "
                "on the ranks), or pass --overwrite to start a new run (the releases already sent stay out of its "
                "epsilon)"
            )

    def stopped(self, round_index: int) -> bool:
        """Whether the client has stopped sharing by ``round_index`` (a refused request then or before)."""
        return self.stopped_at is not None and self.stopped_at <= round_index

    def stream(self, round_index: int, use: int):
        """The client's stream of ``use`` (mpicd.privacy.streams) in this round: secret or seeded."""
        return stream(self.settings.noise, self.key, self.nonce, self.seed, self.client, round_index, use)

    def generator(self, round_index: int):
        """The stream of the client's release in this round: its Poisson sample, then its noise."""
        return self.stream(round_index, RELEASE)

    def state_dict(self) -> dict:
        """What a resume needs, the key included: the checkpoint stays at the site (mode 0600)."""
        return {
            "history": list(self.accountant.history),
            "epsilon": self.epsilon,
            "stopped_at": self.stopped_at,
            "key": self.key,
            "key_from": self.key_from,
            "journaled": 0 if self.journal is None else len(self.journal),  # a journal cut short shows
        }

    def load_state_dict(self, state: dict, source: str = "checkpoint") -> None:
        """The checkpoint's ledger and key (the draws go on as the interrupted run's would have).
        :class:`KeyMismatch` when ``privacy.key_dir`` lacks the client's key file or holds another key
        than the checkpoint's (``source``: the checkpoint, in words; no key file is made), or when the
        journal holds fewer releases than it did at the checkpoint (lines dropped from its end, or the
        file deleted: its MACs cannot show that)."""
        journaled = int(state.get("journaled", 0))
        if self.journal is not None and len(self.journal) < journaled:
            raise KeyMismatch(
                f"{self.journal.path} holds {len(self.journal)} releases, but client {self.client}'s {source} was "
                f"saved after {journaled}: the journal was cut short or deleted, so what the client released "
                "cannot be known; restore it, or pass --overwrite to start a new run"
            )
        key = state.get("key")
        if self.settings.noise == "secret":
            if key is None:
                raise ValueError(f"privacy: the checkpoint of client {self.client} holds no secret key (privacy.noise)")
            key = secret.check_key(key)
            if self.settings.key_dir is not None and key != self.key:
                drawn = state.get("key_from") or "a key whose source an older mpicd did not record"
                here = "does not exist, but" if self.key is None else "is not the key"
                raise KeyMismatch(
                    f"{secret.key_file(self.settings.key_dir, self.client)} {here} client {self.client}'s {source} "
                    f"was drawn with ({drawn}): resume with the privacy.key_dir that holds it (the draws go on with "
                    "the key they began with), or pass --overwrite to start a new run"
                )
            self.key = key
            self.key_from = state.get("key_from") or self.key_from
        self.accountant = Accountant([tuple(entry) for entry in state["history"]])
        self.epsilon, self.stopped_at = float(state["epsilon"]), state["stopped_at"]


def _what_differs(before: Entry, now: Entry) -> str:
    if before.accounting() != now.accounting():
        return f"q, multiplier, steps {before.accounting()} then, {now.accounting()} now"
    return f"payload sha256 {before.digest[:12]}... then, {now.digest[:12]}... now"
