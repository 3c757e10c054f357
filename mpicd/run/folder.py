"""Everything at ``--out``, owned by one object: the start decision, the checkpoints and journals beside
the results file, and the results writer (the one place the file is opened for writing).

``<out>`` is the results file; ``<out>.ckpt/`` holds each client's checkpoints and release journal
(:mod:`mpicd.run.checkpoint`). What lies there decides where a run starts (:mod:`mpicd.run.startpoint`:
new, resumed, done or refused; ``--overwrite`` deletes it first), agreed by every rank; a resume then
restores each client from the newest checkpoint every rank reads whole (:mod:`mpicd.run.resume`).
Nothing there is trusted before it proves itself under the site key (:mod:`mpicd.core.sitekey`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import yaml

from mpicd.config.identity import RUN_ID_CHARS, config_hash
from mpicd.config.sections import ConfigError
from mpicd.core import sitekey
from mpicd.core.paths import PathRefused, check_owned, refuse_link
from mpicd.privacy import secret
from mpicd.results.writer import Contents, ResultsWriter
from mpicd.run import checkpoint, startpoint
from mpicd.run.agreement import raise_agreed
from mpicd.run.client import Client
from mpicd.run.metadata import placement_row, results_attrs
from mpicd.run.plan import Plan
from mpicd.run.resume import resume_point


class RunFolder:
    """``out`` and its checkpoint folder, for one run on every rank. ``follow_symlinks``: ``out`` may be
    a link (the user's word): its target is the results file, and the checkpoints go beside the target;
    otherwise a link there is refused when the run starts."""

    def __init__(self, out: str | Path, comm, follow_symlinks: bool = False) -> None:
        self.path = Path(os.path.realpath(out) if follow_symlinks else out)
        self.checkpoints = checkpoint.folder_for(self.path)
        self.comm = comm
        self.key: bytes | None = None  # the site key, read when the run starts
        self.decision: startpoint.Start | None = None

    @property
    def run_id(self) -> str:
        return self.decision.run_id

    def start(self, plan: Plan, mode: str) -> startpoint.Start:
        """Where the run starts, ``mode`` new, resume or overwrite (collective; a ConfigError on every rank
        when refused). The site key and privacy.key_dir are checked first: a refused key deletes nothing."""
        self.key = self._site_key()
        self._check_key_dir(plan)
        self.decision = self._agree_on_start(plan.resolved_config, mode)
        return self.decision

    def _site_key(self) -> bytes:
        """This rank's site key, read from its own file system, never sent; one that does not read on any
        rank stops the run on every rank (ConfigError, exit 2; the rank says why)."""
        key, error = None, None
        try:
            key = sitekey.load()
        except PathRefused as err:
            error = ConfigError("site key", str(err))
        raise_agreed(self.comm, error)
        return key

    def _check_key_dir(self, plan: Plan) -> None:
        """Every client's key file in ``privacy.key_dir`` that is there, and the folder, checked on every
        rank's file system before anything else happens (mpicd.privacy.secret.site_key, making nothing): a
        folder or key another user owns or can write, a link, a key others can read: ConfigError on every
        rank naming it (collective)."""
        if plan.privacy is None or plan.privacy.key_dir is None or not plan.privacy.private:
            return
        error = None
        try:
            for c in range(plan.config.clients):
                secret.site_key(plan.privacy.key_dir, c, create=False)
        except PathRefused as err:
            error = ConfigError("privacy.key_dir", str(err))
        raise_agreed(self.comm, error)

    def _refuse_links(self) -> None:
        """PathRefused when ``out`` or ``<out>.ckpt`` is a link (dangling or not), or the checkpoint folder
        is another user's or open to others' writes (mpicd.core.paths): nothing is read or written there."""
        refuse_link(self.path, "--out")
        refuse_link(self.checkpoints, "the checkpoint folder of --out")
        if self.checkpoints.exists():
            check_owned(os.lstat(self.checkpoints), self.checkpoints, "the checkpoint folder of --out")

    def _agree_on_start(self, resolved: dict, mode: str) -> startpoint.Start:
        """Rank 0 applies :func:`mpicd.run.startpoint.decide` to what lies at ``out`` (and, for
        ``--overwrite``, deletes it); every rank gets the same decision, or the same ConfigError. First,
        neither ``out`` nor its checkpoint folder may be a link, and the folder, if there, must be the
        user's and closed to others."""
        comm, out = self.comm, self.path
        decision, error = None, None
        if comm.rank == 0:
            try:
                self._refuse_links()
                decision = startpoint.decide(startpoint.inspect(out), resolved, mode)
                if decision.clear:
                    out.unlink(missing_ok=True)
                    checkpoint.remove_all(self.checkpoints)
            except ConfigError as err:
                error = err
            except PathRefused as err:
                error = ConfigError("--out", str(err))
            except OSError as err:
                error = ConfigError("--out", f"cannot replace {out}: {err.strerror or err}")
        failing = comm.first_failing_rank(error is not None)
        if failing is not None:  # rank 0 prints it (cli.run); the others raise quietly
            raise error or ConfigError("--out", "rank 0 refused the output (see its message)")
        flags = np.zeros(4 + RUN_ID_CHARS, dtype=np.int64)
        if comm.rank == 0:
            flags[:4] = [decision.fresh, decision.complete, decision.bound, decision.clear]
            flags[4:] = np.frombuffer(decision.run_id.encode().ljust(RUN_ID_CHARS), dtype=np.uint8)
        flags = comm.bcast(flags, channel="start")
        if comm.rank == 0:
            return decision
        run_id = bytes(flags[4:].astype(np.uint8)).decode().strip()
        return startpoint.Start(bool(flags[0]), run_id, bool(flags[1]), int(flags[2]), bool(flags[3]))

    def journal(self, client: int) -> Path:
        """Where ``client`` journals its private releases in this run."""
        return checkpoint.journal_path(self.checkpoints, client, self.run_id)

    def resume(self, plan: Plan, clients: list[Client]) -> int:
        """The first round to run: 0 for a fresh run, else after the newest checkpoint every rank
        reads whole (collective; each client's state restored)."""
        if self.decision.fresh:
            return 0
        return resume_point(plan, clients, self.comm, self.checkpoints, self.decision, self.key)

    def writer(self, plan: Plan, clients: list[Client], assignment, placement, *, attrs: dict, start: int,
               startup: dict | None, parallel: bool | None) -> ResultsWriter:  # fmt: skip
        """The results file, created (``start`` 0) or reopened at round ``start`` (collective), with the
        run's attributes, its partition and this job's assignment and start-up seconds."""
        cfg = plan.config
        test_counts = np.bincount(plan.dataset.test.y, minlength=plan.dataset.num_classes)
        contents = Contents(
            rounds=cfg.rounds,
            num_classes=plan.dataset.num_classes,
            attrs={
                **results_attrs(plan, clients[0]),
                "run_id": self.run_id,
                "config_hash": config_hash(plan.resolved_config),
                **attrs,
            },
            train_counts=plan.partition.train_counts,
            test_counts=np.tile(test_counts, (cfg.clients, 1)),
            expertise=plan.partition.expertise,
            num_clients=cfg.clients,
            private=plan.privacy is not None,
            generic=plan.algorithm_cls.scores_generic,
        )
        writer = ResultsWriter(
            self.path,
            self.comm,
            contents,
            placement_row(placement),
            clients=assignment.mine,
            parallel=parallel,
            resume_at=start or None,
        )
        # The assignment this job runs on (mpicd.mpi.assignment; a resumed job's may differ from the first one's).
        writer.set_attr("ranks", self.comm.size)
        writer.set_attr("client_rank", assignment.owner)
        if startup is not None:
            seconds = {k: round(float(v), 4) for k, v in startup.items()}
            writer.set_attr("startup_seconds", yaml.safe_dump(seconds, sort_keys=False))
        return writer

    def save(self, client: int, completed: int, state: dict, during, claimed: int) -> None:
        """One client's checkpoint after ``completed`` rounds (atomic, MACed under the site key)."""
        checkpoint.save(
            self.checkpoints, client, completed, state, self.run_id, during=during, claimed=claimed, key=self.key
        )

    def remove_checkpoints(self, clients: list[int]) -> None:
        """A complete run needs no checkpoint, nor release journal: each rank drops its clients', then
        rank 0 the folder (left in place if another run's files are still in it). Collective."""
        for c in clients:
            checkpoint.discard(self.checkpoints, c, self.run_id)
            self.journal(c).unlink(missing_ok=True)  # the file now holds every release
        self.comm.allreduce_min(np.zeros(1, dtype=np.int64), channel="stop")  # every rank has deleted its files
        if self.comm.rank == 0 and self.checkpoints.is_dir():
            try:
                self.checkpoints.rmdir()
            except OSError:
                pass  # something else lives there: leave it
