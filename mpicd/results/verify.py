"""``mpicd verify FILE...``: does a results file keep its promises? Each broken one is named.

Checked, from the file alone:

* identity: a run id, and a config hash equal to the hash of the stored config (mpicd.config.identity);
* rounds: ``completed_rounds`` <= ``rounds``; every completed round that was evaluated
  (``eval.every``, and the last) has finite held-out metrics for every client (validation ones too
  where there is a validation split) and a finite training loss unless its update was skipped;
  a round that was not evaluated holds NaN metrics;
* personalised accuracy: each ``*personal_acc`` equals sum_c p_c recall_c / sum_c p_c recomputed
  from the split's ``*recall`` and the client's ``/partition/train_counts`` (the classes with a
  recall); a file older than it (no ``personal_acc``) is not checked, with a note; a method with a
  generic model (FedRoD) has its ``generic_*`` scores, held to the same rules;
* nothing claimed past the end: rows after ``completed_rounds`` hold no data (the row right after
  it may hold a write that a crash interrupted before ``completed_rounds`` moved);
* bytes: per round and rank, the totals equal the sums over kinds, and each kind equals the
  algorithm's declared payload (its sizes, ``payload_sizes``, agreeing with the file's own
  ``num_parameters``, ``feature_dim``, ``num_classes`` and ``clients``; ``Algorithm.payloads``;
  co-distillation's students read from ``/comm/teacher``; the run's last round with the payloads
  declared for it alone, ``Payload.rounds``, CCVR's statistics; in a round where an update was skipped
  or a privacy budget stopped a client (``/metrics/privacy_stopped``), at most the declared bytes);
* MPI bytes: per round and rank, ``/comm/bytes_mpi_*`` equal the rank-level declaration
  (``Payload.rank_sent``, the layout from the attr ``client_rank``; files never resumed);
* participation: a client that sat a round out (``/metrics/participated`` 0) has no training
  loss and no bytes;
* channels (``/comm/channel_bytes``, mpicd.mpi.channels): every channel is a declared one, of its
  declared class; on a complete file never resumed, each rank's channels add up to its bytes in
  rounds plus outside them, and its payload channel to its bytes in rounds (nothing else crosses
  in a round); no rank but the writer received bytes on a channel that reaches only the writer;
  with privacy, no diagnostics bytes (``--channels`` lists each channel's class and bytes);
* teachers: -1 or another client; ``skipped`` is 0 or 1; a complete file has its bytes outside rounds;
* privacy: ``/metrics/epsilon`` recomputed, per client and round, from the releases the file records
  (``/metrics/privacy_q``, ``privacy_multiplier``, ``privacy_steps``) with the accountant (dp-accounting's
  PLD, mpicd.privacy.accountant): a file
  whose epsilon is below it (by more than 1e-9 relative) fails; those releases are the mechanism's
  (1e-12 relative): each one's multiplier, q and steps are the attrs' (``privacy_release_multiplier``,
  a numeric ``privacy_sample_rate``, one step), DP-SGD's (multiplier sigma, q = 1 / ceil(n /
  train.batch_size) for the client's n images of ``/partition/train_counts``, train.local_epochs x
  int(1 / q) steps) or, in the last round, CCVR's statistics (``privacy_moments_multiplier``,
  privacy.sample_rate, one step); a client that sent bytes in a round (``/comm/bytes_sent``) with a
  release recorded there unless its budget stopped it (``privacy_stopped``), its update was skipped or
  it sat the round out (what it sends then is zeros or post-processing); a client's training metrics,
  which stay on its rank with privacy (attr ``train_metrics``), are NaN; a run that repeats another's
  noise (``privacy.nonce``) is noted.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np
import yaml

from mpicd.algorithms import REGISTRY, Sizes, resolve
from mpicd.config.identity import config_hash, is_run_id
from mpicd.config.sections import ConfigError
from mpicd.mpi.channels import CHANNELS
from mpicd.privacy.accountant import Accountant
from mpicd.results.reader import Results, ResultsFileError, open_file

HELD_OUT = ("test_acc", "balanced_acc", "minority_acc", "personal_acc")
VALIDATION = ("val_acc", "val_balanced_acc", "val_minority_acc", "val_personal_acc")
TRAINING = ("train_acc", "train_balanced_acc", "train_minority_acc", "train_personal_acc")  # eval.train_split only
GENERIC = (  # an algorithm with a generic model (Algorithm.scores_generic: FedRoD)
    "generic_test_acc", "generic_balanced_acc", "generic_minority_acc", "generic_personal_acc",
)  # fmt: skip
GENERIC_VALIDATION = tuple(name.replace("generic_", "generic_val_").replace("_test_", "_") for name in GENERIC)
ADDED_LATER = ("personal_acc", "val_personal_acc", "train_personal_acc")
"""Scores a file written before them lacks (all of them together): not checked there, with a note."""


@dataclass
class Verdict:
    path: Path
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: str = ""
    channels: list[str] = field(default_factory=list)  # one line per channel (``--channels``)

    @property
    def ok(self) -> bool:
        return not self.problems

    def text(self, channels: bool = False) -> str:
        head = f"{self.path}: {'ok' if self.ok else f'{len(self.problems)} problem(s)'}"
        head += f" ({self.summary})" if self.summary else ""
        lines = [head] + [f"  problem: {p}" for p in self.problems] + [f"  note: {n}" for n in self.notes]
        return "\n".join(lines + ([f"  channel: {c}" for c in self.channels] if channels else []))


def _rounds_text(rounds) -> str:
    rounds = [int(r) + 1 for r in rounds]
    return ", ".join(map(str, rounds[:8])) + (f" ... ({len(rounds)} rounds)" if len(rounds) > 8 else "")


def verify(path: str | Path) -> Verdict:
    verdict = Verdict(Path(path))
    try:
        res = Results(path)
    except ResultsFileError as err:
        verdict.problems.append(str(err))
        return verdict
    attrs, config = res.attrs, res.config if isinstance(res.config, dict) else {}
    rounds, clients, done = int(attrs.get("rounds", 0)), int(attrs.get("clients", 0)), res.completed_rounds
    verdict.summary = f"run {attrs.get('run_id', '?')}, {attrs.get('algorithm', '?')}, {done} of {rounds} rounds"
    _identity(verdict, attrs, config)
    if str(attrs.get("privacy_noise", "")).startswith("seeded") or (
        "privacy_accountant" in attrs and "privacy_noise" not in attrs
    ):
        verdict.notes.append(
            "NOT PRIVATE: its releases' noise was drawn from the run's seed (privacy.noise: seeded, or a file "
            "older than privacy.noise), which any peer can redraw; its epsilon holds against no peer"
        )
    if str(attrs.get("privacy_nonce_from", "")).startswith("privacy.nonce"):
        verdict.notes.append(
            f"REPEATS NOISE: its releases were drawn under privacy.nonce {attrs.get('privacy_nonce')}, another run's: "
            "with the same keys, the two runs' releases subtract to the difference of their sums, without noise"
        )
    if done > rounds:
        verdict.problems.append(f"completed_rounds is {done}, more than the run's {rounds} rounds")
    _metrics(verdict, res, config, rounds, done)
    _epsilon(verdict, res, attrs, done)
    _releases(verdict, res, attrs, config, done, rounds)
    _past_the_end(verdict, path, done)
    _bytes(verdict, res, config, attrs, clients, done, rounds)
    _mpi_bytes(verdict, res.path, config, attrs, done, rounds)
    _channels(verdict, res, attrs, rounds, done)
    teacher = res.teacher
    own = np.arange(teacher.shape[1])[None, :] if teacher.size else teacher
    bad = (teacher != -1) & ((teacher < 0) | (teacher >= clients) | (teacher == own))
    if bad.any():
        verdict.problems.append(f"/comm/teacher names no other client in rounds {_rounds_text(np.nonzero(bad)[0])}")
    skipped = res.metrics.get("skipped")
    if skipped is not None and not np.isin(skipped, (0, 1)).all():
        verdict.problems.append("/metrics/skipped holds values other than 0 and 1")
    if done == rounds and rounds and (res.outside_rounds < 0).any():
        verdict.problems.append("a complete file without its bytes outside rounds (/comm/outside_rounds is -1)")
    return verdict


def _identity(verdict: Verdict, attrs: dict, config: dict) -> None:
    if "run_id" not in attrs and "config_hash" not in attrs:
        verdict.notes.append("no run id or config hash: written by an mpicd older than run identities")
        return
    if not is_run_id(attrs.get("run_id")):
        verdict.problems.append(f"run_id {attrs.get('run_id')!r} is not 16 hex digits")
    if attrs.get("config_hash") != config_hash(config):
        verdict.problems.append(
            f"config_hash {attrs.get('config_hash')!r} is not the hash of the stored config ({config_hash(config)})"
        )


def _metrics(verdict: Verdict, res, config: dict, rounds: int, done: int) -> None:
    every = int((config.get("eval") or {}).get("every", 1) or 1)
    evaluated = np.array([(r + 1) % every == 0 or r + 1 == rounds for r in range(done)], dtype=bool)
    validation = res.attrs.get("val_split", "none") != "none"
    names = HELD_OUT + (VALIDATION if validation else ())
    if _scores_generic(res.attrs.get("algorithm")):
        names += GENERIC + (GENERIC_VALIDATION if validation else ())
    older = not any(name in res.metrics for name in ADDED_LATER)  # written before personal_acc existed
    if older:
        verdict.notes.append("no /metrics/personal_acc (an older mpicd): personalised accuracy not checked")
    withheld = "train_metrics" in res.attrs  # privacy on: they stay on each client's rank
    if (config.get("eval") or {}).get("train_split") is True and not withheld:
        names += TRAINING
    else:  # off, withheld (or a file older than the key): NaN wherever present
        for name in TRAINING + (("train_loss", "train_ce", "train_extra") if withheld else ()):
            values = res.metrics.get(name)
            if values is not None and np.isfinite(values).any():
                rows = np.nonzero(np.isfinite(values).any(axis=1))[0]
                why = "privacy on (attr train_metrics)" if withheld else "without eval.train_split"
                verdict.problems.append(f"/metrics/{name} holds values {why} in rounds {_rounds_text(rows)}")
    for name in names:
        values = res.metrics.get(name)
        if values is None and older and name in ADDED_LATER:
            continue
        if values is None:
            verdict.problems.append(f"/metrics/{name} is missing")
            continue
        finite = np.isfinite(values)
        missing = evaluated & ~finite.all(axis=1)
        if missing.any():
            verdict.problems.append(
                f"/metrics/{name} is not finite in evaluated rounds {_rounds_text(np.nonzero(missing)[0])}"
            )
        stray = ~evaluated & finite.any(axis=1)
        if stray.any():
            verdict.problems.append(
                f"/metrics/{name} holds values in rounds not evaluated: {_rounds_text(np.nonzero(stray)[0])}"
            )
    _personal(verdict, res)
    loss, skipped = res.metrics.get("train_loss"), res.metrics.get("skipped")
    if loss is not None and not withheld:
        kept = np.ones_like(loss, dtype=bool) if skipped is None else skipped == 0
        taking = res.metrics.get("participated")  # participation < 1: the others did not train
        kept &= True if taking is None else taking == 1
        bad = (kept & ~np.isfinite(loss)).any(axis=1)
        if bad.any():
            verdict.problems.append(f"/metrics/train_loss is not finite in rounds {_rounds_text(np.nonzero(bad)[0])}")


def _epsilon(verdict: Verdict, res, attrs: dict, done: int) -> None:
    """/metrics/epsilon against dp-accounting's PLD of the releases recorded up to each round (a file
    with privacy, written since the releases are recorded). Lower than that: the file claims less
    than what left."""
    needed = ("epsilon", "privacy_q", "privacy_multiplier", "privacy_steps")
    if "privacy_delta" not in attrs:
        return
    if not all(name in res.metrics for name in needed):
        verdict.notes.append("no /metrics/privacy_steps (an older mpicd): epsilon not recomputed from its releases")
        return
    eps, q, multiplier, steps = (res.metrics[name][:done] for name in needed)
    delta = float(attrs["privacy_delta"])
    low = []
    for c in range(eps.shape[1] if eps.ndim == 2 else 0):
        ledger, recomputed = Accountant(), 0.0
        for r in range(done):
            slots = [s for s in range(steps.shape[2]) if steps[r, c, s] > 0]
            for s in slots:  # epsilon moves only with a release: recomputed there (cached per history)
                try:
                    ledger.spend(float(q[r, c, s]), float(multiplier[r, c, s]), int(steps[r, c, s]))
                except ValueError as err:
                    verdict.problems.append(f"client {c}, round {r + 1}: its recorded release is not one: {err}")
                    return
            if slots:
                recomputed = ledger.epsilon(delta)
            if not eps[r, c] >= recomputed * (1 - 1e-9):
                low.append((r, c, float(eps[r, c]), recomputed))
    if low:
        r, c, claimed, recomputed = low[0]
        verdict.problems.append(
            f"/metrics/epsilon is below what its recorded releases compose to in {len(low)} (round, client) cells, "
            f"first round {r + 1}, client {c}: {claimed:.6g} claimed, {recomputed:.6g} recomputed"
        )


def _releases(verdict: Verdict, res, attrs: dict, config: dict, done: int, rounds: int) -> None:
    """The releases the file records against the mechanism's (:func:`_made`), and each client's sent
    bytes against them: :func:`_epsilon` composes what is recorded, so a release recorded cheaper than
    the one made (a resumed job's forged state), or a payload sent with none recorded, lowers the
    epsilon it checks against. Not checked where nothing private is sent: a client that sat the round
    out, whose update was dropped (``on_nonfinite: skip``: zeros, or nothing) or whose budget stopped it
    (``privacy_stopped``: zeros, FedAMP's frozen model: post-processing of releases already counted)."""
    needed = ("privacy_q", "privacy_multiplier", "privacy_steps")
    if "privacy_delta" not in attrs or not all(name in res.metrics for name in needed):
        return  # privacy off, or a file older than its recorded releases (noted by _epsilon)
    made, missing = _made(res, attrs, config, rounds)
    if made is None:
        verdict.notes.append(f"no {missing} (an older mpicd): releases not checked against the mechanism")
        return
    q, multiplier, steps = (res.metrics[name][:done] for name in needed)
    wrong = []
    for r, c, s in zip(*np.nonzero(steps > 0)):  # round-major: the first is the earliest round's
        got = (float(q[r, c, s]), float(multiplier[r, c, s]), int(steps[r, c, s]))
        mechanism = made(int(r), int(c))
        if all(_differ(got, want) for want in mechanism):  # named against the nearest of them
            nearest = min(mechanism, key=lambda want: len(_differ(got, want)), default=None)
            wrong.append((int(r), int(c), int(s), got, nearest))
    if wrong:
        r, c, s, got, want = wrong[0]
        verdict.problems.append(
            f"/metrics/privacy_q, privacy_multiplier and privacy_steps record releases the run's mechanism does not "
            f"make in {len(wrong)} (round, client, slot) cells, first round {r + 1}, client {c}, slot {s}: "
            + ", ".join(_differ(got, want))
        )
    sent = res.bytes_sent_by_kind[:done].sum(axis=2) if res.bytes_sent_by_kind.size else res.metrics.get("bytes_sent")
    if sent is None:
        return
    private = sent > 0
    for name in ("skipped", "privacy_stopped"):
        if name in res.metrics:
            private &= res.metrics[name][:done] == 0
    if "participated" in res.metrics:
        private &= res.metrics["participated"][:done] != 0
    unrecorded = np.argwhere(private & (steps.sum(axis=2) == 0))
    if len(unrecorded):
        r, c = map(int, unrecorded[0])
        verdict.problems.append(
            f"private payloads sent with no release recorded in {len(unrecorded)} (round, client) cells, first "
            f"round {r + 1}, client {c}: {int(sent[r, c])} bytes sent, 0 releases (/metrics/privacy_steps), "
            "neither stopped by its budget nor skipped nor sitting out"
        )


def _made(res, attrs: dict, config: dict, rounds: int):
    """(f, "") with f(round, client) the releases the run's mechanism makes there, (whose, q, multiplier,
    steps) each, from the attrs of mpicd.run.metadata and the stored config; (None, what is missing)
    without them. They are those of every caller of Budget.request: DP-SGD's local epochs
    (mpicd.run.client; FedAvg, FedAMP, CCVR, whose attr privacy_sample_rate is a text: q = 1 / ceil(n /
    train.batch_size) for the client's n images, train.local_epochs x Opacus' int(1 / q) steps, multiplier
    sigma); else one release at privacy_sample_rate and privacy_release_multiplier (FedProto, FedDistill,
    co-distillation); and, in the run's last round, CCVR's statistics (attr privacy_moments_multiplier,
    one release at privacy.sample_rate)."""
    if "privacy_release_multiplier" not in attrs:
        return None, "attr privacy_release_multiplier"
    sigma, rate = float(attrs["privacy_release_multiplier"]), attrs.get("privacy_sample_rate")
    if isinstance(rate, (str, bytes)):  # DP-SGD: q and steps from the client's training-set size
        train = config.get("train") or {}
        batch, epochs = int(train.get("batch_size", 0) or 0), int(train.get("local_epochs", 1) or 1)
        counts = res.partition.get("train_counts")
        if not batch or counts is None:
            return None, "/partition/train_counts or train.batch_size (DP-SGD's q and steps)"
        cls = REGISTRY.get(str(attrs.get("algorithm")))
        n = counts.sum(axis=1) if not (cls is not None and cls.trains_on_union) else np.full(len(counts), counts.sum())
        own = [1 / -(-int(size) // batch) for size in n]  # 1 / len(DataLoader(n, batch)), as dpsgd.schedule
        per_client = {c: [("DP-SGD", q, sigma, epochs * int(1 / q))] for c, q in enumerate(own)}
    else:
        per_client = {c: [("its release", float(rate), sigma, 1)] for c in range(int(attrs.get("clients", 0)))}
    last = []
    if "privacy_moments_multiplier" in attrs:
        q = float((config.get("privacy") or {}).get("sample_rate", 1.0))
        last = [("CCVR's statistics", q, float(attrs["privacy_moments_multiplier"]), 1)]
    return (lambda r, c: per_client.get(c, []) + (last if r == rounds - 1 else [])), ""


def _close(a: float, b: float) -> bool:
    """The file's q and multipliers are written from the mechanism's own floats: equal but for rounding."""
    return bool(np.isclose(a, b, rtol=1e-12, atol=0.0))


def _differ(got: tuple, want: tuple | None) -> list[str]:
    """What a recorded (q, multiplier, steps) has other than the release ``want`` (whose, q, multiplier, steps)."""
    if want is None:
        return [f"q {got[0]:.12g}, multiplier {got[1]:.12g}, steps {got[2]} recorded, no release made there"]
    fields = (("multiplier", got[1], want[2]), ("q", got[0], want[1]), ("steps", got[2], want[3]))
    return [
        f"{name} {a:.12g} recorded, {b:.12g} made ({want[0]})"
        for name, a, b in fields
        if not (a == b if name == "steps" else _close(a, b))
    ]


def _scores_generic(algorithm) -> bool:
    """Whether the file's algorithm scores a generic model too (its /metrics/generic_* columns)."""
    cls = REGISTRY.get(algorithm.decode() if isinstance(algorithm, bytes) else str(algorithm))
    return bool(cls is not None and cls.scores_generic)


def _personal(verdict: Verdict, res) -> None:
    """Each split's personalised accuracy against sum_c p_c recall_c / sum_c p_c, recomputed from its
    per-class recall and the clients' /partition/train_counts (mpicd.evaluation.metrics.personal_accuracy);
    NaN exactly where the recomputation is (rounds not evaluated, no class with a recall and a weight)."""
    counts = res.partition.get("train_counts")
    for prefix in ("", "val_", "train_", "generic_", "generic_val_"):
        values, recall = res.metrics.get(f"{prefix}personal_acc"), res.metrics.get(f"{prefix}recall")
        if values is None or recall is None or counts is None or recall.shape[1:] != counts.shape:
            continue
        p = np.broadcast_to(counts.astype(np.float64), recall.shape)
        present = ~np.isnan(recall)
        total = np.where(present, p, 0.0).sum(axis=2)
        with np.errstate(invalid="ignore", divide="ignore"):
            expected = np.where(total > 0, np.where(present, p * recall, 0.0).sum(axis=2) / total, np.nan)
        same = np.isclose(values, expected, rtol=1e-12, atol=1e-12) | (np.isnan(values) & np.isnan(expected))
        if not same.all():
            verdict.problems.append(
                f"/metrics/{prefix}personal_acc is not sum_c p_c {prefix}recall_c / sum_c p_c (p: "
                f"/partition/train_counts) in rounds {_rounds_text(np.nonzero(~same.all(axis=1))[0])}"
            )


def _past_the_end(verdict: Verdict, path, done: int) -> None:
    """Rows from done + 1 on must hold only fill values (the row ``done`` may be a torn write)."""
    with open_file(path) as f:
        for group in ("metrics", "comm"):
            for name, dset in f[group].items():
                if not isinstance(dset, h5py.Dataset) or dset.ndim < 2 or name in ("outside_rounds", "channel_bytes"):
                    continue
                rest = dset[done + 1 :]
                if not rest.size:
                    continue
                fill = dset.fillvalue
                stray = ~np.isnan(rest) if np.issubdtype(rest.dtype, np.floating) and np.isnan(fill) else rest != fill
                rows = np.nonzero(stray.reshape(len(rest), -1).any(axis=1))[0] + done + 1
                if rows.size:
                    verdict.problems.append(
                        f"/{group}/{name} holds data past completed_rounds ({done}) in rounds {_rounds_text(rows)}"
                    )


def _bytes(verdict: Verdict, res, config: dict, attrs: dict, clients: int, done: int, rounds: int) -> None:
    for side in ("sent", "recv"):
        by_kind = getattr(res, f"bytes_{side}_by_kind")
        total = res.metrics.get(f"bytes_{side}")
        if total is not None and by_kind.size and not np.array_equal(total, by_kind.sum(axis=2)):
            verdict.problems.append(f"/metrics/bytes_{side} differs from the sum over kinds of /comm/bytes_{side}")
    if "payload_sizes" not in attrs:
        verdict.notes.append("no payload_sizes attribute (an older mpicd): bytes not checked against the declaration")
        return
    try:
        cls, params = resolve(config.get("algorithm") or {})
    except ConfigError as err:
        verdict.problems.append(f"the stored config's algorithm does not resolve: {err}")
        return
    sizes = Sizes(**yaml.safe_load(attrs["payload_sizes"]))
    for name, attr in (("P", "num_parameters"), ("D", "feature_dim"), ("C", "num_classes"), ("N", "clients")):
        if attr in attrs and int(attrs[attr]) != getattr(sizes, name):
            verdict.problems.append(
                f"payload_sizes declares {name} = {getattr(sizes, name)}, but the file's {attr} is {int(attrs[attr])}: "
                "the byte declaration does not describe this run"
            )
    skipped = res.metrics.get("skipped")
    taking = res.metrics.get("participated")
    spent = res.metrics.get("privacy_stopped")  # privacy: a spent client sends nothing, as a skipped one
    wrong: dict[str, list[int]] = {}
    for r in range(done):
        relaxed = skipped is not None and bool(skipped[r].any()) or spent is not None and bool(spent[r].any())
        for c in range(clients):
            students = int((res.teacher[r] == c).sum())
            declared = cls.bytes_per_round(sizes, params, students, last=r == rounds - 1)  # N = 1: each algorithm
            if taking is not None and taking[r, c] == 0:  # sat the round out: sent and received nothing
                declared = {}
            for k, kind in enumerate(res.kinds):
                want = declared.get(kind, (0, 0))
                got = (int(res.bytes_sent_by_kind[r, c, k]), int(res.bytes_recv_by_kind[r, c, k]))
                fine = got[0] <= want[0] and got[1] <= want[1] if relaxed else got == tuple(want)
                if not fine:
                    wrong.setdefault(f"{kind} (declared {want[0]} sent, {want[1]} received)", []).append(r)
    for what, rows in wrong.items():
        verdict.problems.append(f"bytes of kind {what} differ in rounds {_rounds_text(sorted(set(rows)))}")


def _mpi_bytes(verdict: Verdict, path: Path, config: dict, attrs: dict, done: int, rounds: int) -> None:
    """What crossed MPI per rank (``/comm/bytes_mpi_*``, on each rank's first client, 0 on its
    others) against the algorithm's rank-level declaration (``Payload.rank_sent``), with the
    layout of the attr ``client_rank``. Only for the job that wrote the rows: a file resumed on
    another layout records the last one, so it is checked only when it was never resumed."""
    if "client_rank" not in attrs or "payload_sizes" not in attrs or len(attrs.get("resumed_at", [])):
        return
    try:
        cls, params = resolve(config.get("algorithm") or {})
    except ConfigError:
        return  # named by _bytes
    with open_file(path) as f:
        if "comm/bytes_mpi_sent" not in f:
            return
        sent, recv = f["comm/bytes_mpi_sent"][:done], f["comm/bytes_mpi_recv"][:done]
        kinds = [k.decode() if isinstance(k, bytes) else str(k) for k in f["comm/bytes_mpi_sent"].attrs["kinds"]]
        teachers = f["comm/teacher"][:done]
        spent = f["metrics/privacy_stopped"][:done] if "metrics/privacy_stopped" in f else None
    owner = np.asarray(attrs["client_rank"], dtype=np.int64)
    sizes = Sizes(**yaml.safe_load(attrs["payload_sizes"]))
    skipped = attrs.get("on_nonfinite") == "skip" or config.get("on_nonfinite") == "skip"
    wrong: set[int] = set()
    for r in range(done):
        try:
            p2p = cls.p2p_rows(params, teachers[r], owner)  # T and U per rank (Algorithm.p2p_rows)
        except ValueError:
            continue  # a teacher that is no other client: named by the teacher check, not here
        for rank in range(int(owner.max()) + 1):
            mine = np.flatnonzero(owner == rank)
            rows = (0, 0) if p2p is None else p2p[rank]
            declared = cls.rank_bytes_per_round(sizes, params, len(mine), *rows, last=r == rounds - 1)
            for i, kind in enumerate(kinds):
                got = (int(sent[r, mine[0], i]), int(recv[r, mine[0], i]))
                want = tuple(declared.get(kind, (0, 0)))
                relaxed = skipped or spent is not None and bool(spent[r].any())
                if got != want and not (relaxed and got[0] <= want[0] and got[1] <= want[1]):
                    wrong.add(r)
            if sent[r, mine[1:]].any() or recv[r, mine[1:]].any():
                wrong.add(r)
    if wrong:
        verdict.problems.append(
            f"MPI bytes per rank (/comm/bytes_mpi_*) differ from the declaration in rounds {_rounds_text(sorted(wrong))}"
        )


def _channels(verdict: Verdict, res, attrs: dict, rounds: int, done: int) -> None:
    """The file's per-channel bytes against the declaration (:mod:`mpicd.mpi.channels`)."""
    if not res.channel_bytes:
        verdict.notes.append("no /comm/channel_bytes (an older mpicd): bytes not checked per channel")
        return
    for name, (cls, _) in res.channel_bytes.items():
        declared = CHANNELS.get(name)
        if declared is None:
            verdict.problems.append(f"/comm/channel_bytes has channel {name!r}, which mpicd does not declare")
        elif cls != declared.cls:
            verdict.problems.append(
                f"/comm/channel_bytes says channel {name!r} is {cls}, but it is declared {declared.cls}"
            )
    complete = done == rounds and rounds > 0
    if not complete:
        return
    owner = np.asarray(attrs.get("client_rank", np.arange(res.teacher.shape[1] if res.teacher.size else 0)))
    firsts = [int(np.flatnonzero(owner == rank)[0]) for rank in range(int(owner.max()) + 1)] if owner.size else []
    values = {name: v for name, (_, v) in res.channel_bytes.items()}
    if any((values[name][firsts] < 0).any() for name in values):
        verdict.problems.append("a complete file without its bytes per channel (/comm/channel_bytes is -1)")
        return
    for name, v in values.items():
        declared = CHANNELS.get(name)
        if declared is not None and declared.reach == "writer":
            readers = [rank for rank, c in enumerate(firsts) if rank != 0 and v[c, 1] > 0]
            if readers:
                verdict.problems.append(
                    f"channel {name!r} reaches only the writer, but rank(s) {readers} received {name} bytes"
                )
    if "privacy_delta" in attrs and "diagnostics" in values and values["diagnostics"][firsts].any():
        verdict.problems.append("privacy is on, but eval.diagnostics' probe features crossed MPI (channel diagnostics)")
    with open_file(res.path) as f:
        mpi = {side: f[f"comm/bytes_mpi_{side}"][:done] for side in ("sent", "recv") if f"comm/bytes_mpi_{side}" in f}
    outside_known = not (res.outside_rounds[firsts] < 0).any()  # else named by the outside-rounds check
    if not len(attrs.get("resumed_at", [])) and len(mpi) == 2 and outside_known:
        for d, side in enumerate(("sent", "recv")):
            in_rounds = mpi[side].sum(axis=(0, 2))
            total = sum(v[:, d] for v in values.values())
            for rank, c in enumerate(firsts):
                if total[c] != in_rounds[c] + res.outside_rounds[c, d]:
                    verdict.problems.append(
                        f"rank {rank}: its channels' bytes {side} ({int(total[c])}) are not its bytes in rounds plus "
                        f"outside them ({int(in_rounds[c])} + {int(res.outside_rounds[c, d])})"
                    )
                if "payload" in values and values["payload"][c, d] != in_rounds[c]:
                    verdict.problems.append(
                        f"rank {rank}: payload bytes {side} ({int(values['payload'][c, d])}) are not its bytes in "
                        f"rounds ({int(in_rounds[c])}): something else crossed MPI inside a round"
                    )
    for name, v in values.items():
        declared = CHANNELS.get(name)
        kind, role = ("undeclared", "undeclared") if declared is None else (declared.cls, declared.role)
        sent, recv = int(v[firsts, 0].sum()), int(v[firsts, 1].sum())
        verdict.channels.append(f"{name:<13} {kind:<15} {role:<15} sent {sent:>14,d}  received {recv:>14,d}")


def main(paths: list[str], channels: bool = False) -> int:
    """Exit status 0: every file keeps every promise; 1: some file does not (each problem named).
    ``channels``: each file's bytes per channel too (all ranks, the run's whole)."""
    failed = 0
    for path in paths:
        verdict = verify(path)
        print(verdict.text(channels))
        failed += not verdict.ok
    if len(paths) > 1:
        print(f"{len(paths) - failed} of {len(paths)} files ok")
    sys.stdout.flush()
    return 1 if failed else 0
