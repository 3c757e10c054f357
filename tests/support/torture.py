"""Crash torture: SIGKILL an mpicd job at random moments, resume it, check the file after every kill.

    .venv/bin/python tests/support/torture.py --kills N [--ranks 2] [--seed S] [--out DIR] [--rounds 8]
    .venv/bin/python tests/support/torture.py --full-disk [--out DIR]     # as root: a full tmpfs mid-run

First one uninterrupted reference run per algorithm (quick-start config, clients = ranks). Then
cycles: one job started again and again with ``--resume`` (the first attempt finds no file and
starts fresh) and killed in one of four ways, in turn (each block of four kills covers every kind,
in a shuffled order):

* ``job``            SIGKILL to every process of the job at once (mpirun and its ranks);
* ``rank``           SIGKILL to one rank (a child of mpirun), mpirun ends the others;
* ``in_write``       ``debug.fail_kind=kill debug.fail_at=in_write``: a rank kills itself inside
                     the results row write of a random round (its peers in their write/flush);
* ``in_checkpoint``  ``debug.fail_at=in_checkpoint``: inside the checkpoint write (temporary
                     file written, not renamed).

The timed kinds (job, rank) fire either at a time drawn over the reference's start-up (module
imports, data, model), 0-50 ms after the results file appeared (its creation, in an attempt that
starts without one: a window too short for the uniform draw to find), or a random fraction of a
round after the progress line of a random round (so mid-round, mid-checkpoint, between rounds, or
in the closing of the run).
After every kill the file is checked: ``mpicd verify`` (mpicd.results.verify.verify) passes on it, and
``completed_rounds`` is at least the checkpoint round every rank held of the file's run before the
attempt (no agreed round is lost). A file that a kill tore while it was being created (no round
in it, no checkpoint beside it) is a legitimate state: the next ``--resume`` is expected to refuse
it (exit 2, naming ``--overwrite``) and the next attempt passes ``--overwrite`` ("refused as
designed", counted). Any other refusal, an unexpected exit status, a job that does not end, or a
process left behind is a failure. When an attempt completes, the file must equal the reference in
every dataset but timings (``*_seconds``), placement and ``/comm/outside_rounds`` (each job's
start-up traffic adds to it: checked to be at least the reference's) and ``/comm/channel_bytes``
(the same, per channel: only the payload channel's must equal the reference's), its attributes but run_id,
resumed_at, startup_seconds and config (compared by config_hash, as debug.* keys may differ), and
keep no checkpoint. Then a new cycle starts with a fresh output, until N kills have been made.

One line per kill; a summary at the end; exit status 1 on any failure. Each cycle's folder is
deleted when it passed and kept (with its logs) when it failed. Open MPI's session files and
shared-memory segments of these jobs live in DIR/scratch (TMPDIR and the backing-directory MCA
parameters), so the SIGKILLed jobs leave nothing in /tmp or /dev/shm.
"""

from __future__ import annotations

import argparse
import errno
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import proc_identity  # noqa: E402 - tests/support/ is not a package

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
# The mpicd every job runs and every check reads (use_code): by default a copy taken at the start,
# so that edits to the tree during a long run never mix two versions of mpicd in one cycle.
CODE, CONFIG = ROOT, QUICKSTART
checkpoint = startpoint = Results = ResultsFileError = verify = launch = None
KINDS = ("job", "rank", "in_write", "in_checkpoint")
ROUND_LINE = re.compile(r"^round +(\d+)/(\d+) ", re.M)
REFUSED = 2
# attributes that differ between an interrupted and an uninterrupted run by design
ATTRS_ASIDE = ("run_id", "resumed_at", "startup_seconds", "config")
JOB_TIMEOUT = 240.0  # seconds an attempt may take before it counts as hung


def use_code(work: Path, snapshot: bool = True) -> None:
    """Import mpicd for the checks, from a copy of the tree's mpicd/ and quick-start config in
    ``work/code`` (``snapshot``) or from the tree; the jobs run the same (cwd and PYTHONPATH)."""
    global CODE, CONFIG, checkpoint, startpoint, Results, ResultsFileError, verify, launch
    if snapshot:
        code = work / "code"
        shutil.rmtree(code, ignore_errors=True)
        shutil.copytree(ROOT / "mpicd", code / "mpicd", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(QUICKSTART, code / "quickstart.yaml")
        CODE, CONFIG = code, code / "quickstart.yaml"
        if "mpicd" in sys.modules:
            raise RuntimeError("use_code(snapshot=True) must run before anything imports mpicd")
    sys.path.insert(0, str(CODE))
    from mpicd.mpi import launch  # noqa: F811
    from mpicd.run import checkpoint
    from mpicd.run import startpoint  # noqa: F811
    from mpicd.results.reader import Results, ResultsFileError  # noqa: F811
    from mpicd.results.verify import verify  # noqa: F811

    import mpicd

    if Path(mpicd.__file__).resolve().parent != (CODE / "mpicd").resolve():
        raise RuntimeError(f"mpicd was imported from {mpicd.__file__}, not from {CODE}")


def is_timing(name: str) -> bool:
    """As tests/conftest.py: a dataset of measured seconds (``*_seconds``), never compared."""
    return name.split("/")[-1].endswith("_seconds")


def mpi_env(scratch: Path) -> dict:
    env = dict(os.environ)
    env.update(
        OMPI_ALLOW_RUN_AS_ROOT="1",
        OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
        OMPI_MCA_rmaps_base_oversubscribe="1",
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(CODE), *filter(None, [os.environ.get("PYTHONPATH")])]),
        TMPDIR=str(scratch),  # Open MPI's session directory
        OMPI_MCA_btl_vader_backing_directory=str(scratch),  # shared-memory segments, else /dev/shm
        OMPI_MCA_shmem_mmap_backing_file_base_dir=str(scratch),
    )
    return env


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Attempt:
    """One ``mpiexec -n R python -m mpicd run ...`` in its own session, output to files."""

    def __init__(self, ranks: int, out: Path, overrides: list[str], flag: str | None, stem: Path, scratch: Path):
        self.stdout_path, self.stderr_path = stem.with_suffix(".out"), stem.with_suffix(".err")
        command = launch.command(ranks, [sys.executable, "-m", "mpicd", "run"], launcher="mpirun")
        command += [str(CONFIG), *overrides, "--out", str(out), *([flag] if flag else [])]
        self.command = command
        with open(self.stdout_path, "w") as so, open(self.stderr_path, "w") as se:
            self.proc = subprocess.Popen(
                command, cwd=CODE, env=mpi_env(scratch), stdout=so, stderr=se, start_new_session=True
            )
        self.started = time.monotonic()
        # every process of the session ever seen, by identity (pid, start time, command line), to
        # check that none is left and to kill only those: a pid seen once may be someone else's later
        self.seen: dict[tuple[int, int], dict] = {}

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def session(self) -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.getsid(int(entry)) == self.proc.pid:
                        pids.append(int(entry))
                except (ProcessLookupError, PermissionError):
                    pass
        for pid in pids:
            # Keyed by (pid, start time), re-recorded on every look while it is in the session: a
            # process seen as mpiexec's fork before its exec gets its new command line. The session
            # is asked again after the record, so a pid that died and was reused by someone else's
            # process between the two reads is never taken for the job's.
            entry = proc_identity.record(pid)
            try:
                ours = entry["start"] is not None and os.getsid(pid) == self.proc.pid
            except (ProcessLookupError, PermissionError):
                ours = False
            if ours:
                self.seen[(pid, entry["start"])] = entry
        return pids

    def kill(self, pid: int) -> bool:
        """SIGKILL ``pid`` if it is still a process the last look (session, ranks) saw in the job's
        session; True when signalled."""
        entry = next((e for (p, _), e in self.seen.items() if p == pid and proc_identity.still(e)), None)
        return (
            entry is not None
            and proc_identity.signal_if_still(entry, signal.SIGKILL, foreign_namespace=False) == "signalled"
        )

    def ranks(self) -> dict[int, int]:
        """{rank: pid} of the ranks running now: mpirun's children that carry a world rank."""
        found = {}
        for pid in self.session():
            try:
                if _ppid(pid) != self.proc.pid or not _alive(pid):
                    continue
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    env = dict(v.split(b"=", 1) for v in fh.read().split(b"\0") if b"=" in v)
                if b"OMPI_COMM_WORLD_RANK" in env:
                    found[int(env[b"OMPI_COMM_WORLD_RANK"])] = pid
            except (OSError, ValueError):
                pass
        return found

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def last_round(self) -> int:
        rounds = ROUND_LINE.findall(self.stdout())
        return int(rounds[-1][0]) if rounds else 0

    def kill_job(self) -> None:
        """SIGKILL every process of the job, each only while it is still the one seen. Looks again
        until a pass signals nothing (at most 1 s): a process that exec'd between a look and its
        signal no longer matches its record and is caught, re-recorded, on the next pass."""
        deadline = time.monotonic() + 1.0
        while True:
            self.session()
            hit = [
                entry
                for entry in list(self.seen.values())
                if proc_identity.signal_if_still(entry, signal.SIGKILL, foreign_namespace=False) == "signalled"
            ]
            if not hit or time.monotonic() > deadline:
                return
            time.sleep(0.01)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout=max(0.0, timeout))
        except subprocess.TimeoutExpired:
            return None

    def leftovers(self, grace: float = 30.0) -> list[int]:
        """Processes of the job still alive ``grace`` seconds after mpirun ended (then killed)."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            self.session()
            if not any(proc_identity.still(entry) for entry in self.seen.values()):
                return []
            time.sleep(0.05)
        self.session()
        alive = [entry for entry in self.seen.values() if proc_identity.still(entry)]
        for entry in alive:  # only a process that is still the one seen in the job's session
            proc_identity.signal_if_still(entry, signal.SIGKILL, foreign_namespace=False)
        return [entry["pid"] for entry in alive]


def base_overrides(ranks: int, rounds: int, epochs: int, algorithm: str) -> list[str]:
    return [f"clients={ranks}", f"rounds={rounds}", f"train.local_epochs={epochs}", f"algorithm={{name: {algorithm}}}"]


@dataclass
class Reference:
    path: Path
    startup: float  # seconds from the start to the first round's progress line
    round_seconds: float


def reference_run(work: Path, ranks: int, rounds: int, epochs: int, algorithm: str, scratch: Path) -> Reference:
    path = work / f"reference-{algorithm}.h5"
    attempt = Attempt(
        ranks, path, base_overrides(ranks, rounds, epochs, algorithm), None, work / f"reference-{algorithm}", scratch
    )
    times: dict[int, float] = {}
    while attempt.proc.poll() is None and attempt.elapsed() < JOB_TIMEOUT:
        times.setdefault(attempt.last_round(), attempt.elapsed())
        time.sleep(0.005)
    rc = attempt.wait(5)
    if rc != 0:
        attempt.kill_job()
        raise SystemExit(f"torture: the reference run failed ({rc}):\n{attempt.stdout()}\n{attempt.stderr()}")
    first = times.get(1, attempt.elapsed())
    last = times.get(rounds, attempt.elapsed())
    return Reference(path, first, max(0.01, (last - first) / max(1, rounds - 1)))


def agreed_round(folder: Path, run_id: str | None, bound: int, ranks: int) -> int:
    """What mpicd.run.resume.agree_on_checkpoint would agree on: the newest round <= bound that every
    rank holds a checkpoint of run ``run_id`` for (0: none)."""
    if not run_id:
        return 0
    held = [set(checkpoint.available(folder, r, run_id)) for r in range(ranks)]
    while True:
        candidate = min(max((n for n in h if n <= bound), default=0) for h in held)
        if candidate == 0 or all(candidate in h for h in held):
            return candidate
        bound = candidate - 1


def checkpoint_text(folder: Path) -> str:
    inv = checkpoint.inventory(folder)
    if not inv:
        return "no ckpt"
    parts = []
    for run_id, ranks in inv.items():
        rank_text = "|".join(",".join(map(str, ranks.get(r, []))) or "-" for r in range(max(ranks) + 1))
        parts.append(f"{(run_id or 'old')[:6]}:{rank_text}")
    return "ckpt " + " ".join(parts)


@dataclass
class FileState:
    text: str
    problems: list[str]
    torn: bool = False  # unreadable, no round and no checkpoint: a kill during its creation
    completed: int = 0


def check_file(out: Path, rounds: int, agreed_before: int) -> FileState:
    """The invariants after a kill (see the module docstring)."""
    folder = checkpoint.folder_for(out)
    ckpts = checkpoint_text(folder)
    if not out.exists():
        problems = [f"checkpoints without their results file: {ckpts}"] if checkpoint.inventory(folder) else []
        if agreed_before:
            problems.append(f"the file is gone, but every rank held checkpoint {agreed_before} of its run")
        return FileState(f"no file, {ckpts}", problems)
    try:
        res = Results(out)
    except ResultsFileError as err:
        found = startpoint.inspect(out)
        claimed = found.completed if found.state == "results" else 0
        if not checkpoint.inventory(folder) and not claimed and not agreed_before:
            return FileState(f"torn at creation ({str(err)[-80:]}), {ckpts}", [], torn=True)
        return FileState(f"unreadable, {ckpts}", [f"unreadable results file beside {ckpts}: {err}"])
    done = res.completed_rounds
    verdict = verify(out)
    problems = list(verdict.problems)
    if done > rounds:
        problems.append(f"completed_rounds {done} > rounds {rounds}")
    for name in ("minority_acc", "test_acc", "train_loss"):
        if not np.isfinite(res.metrics[name]).all():
            problems.append(f"/metrics/{name} not finite in a claimed round")
    if done < agreed_before:
        problems.append(f"completed_rounds {done} fell below checkpoint {agreed_before} that every rank held")
    return FileState(
        f"{done}/{rounds} rounds, verify {'ok' if verdict.ok else 'FAILED'}, {ckpts}", problems, completed=done
    )


def _datasets(f: h5py.File) -> dict[str, h5py.Dataset]:
    found = {}
    f.visititems(lambda name, obj: found.__setitem__(name, obj) if isinstance(obj, h5py.Dataset) else None)
    return found


def compare_with_reference(path: Path, reference: Path) -> list[str]:
    """Every non-timing dataset (placement aside) and attribute (ATTRS_ASIDE aside) equal."""
    problems = []
    with h5py.File(path, "r") as a, h5py.File(reference, "r") as b:
        da, db = _datasets(a), _datasets(b)
        if set(da) != set(db):
            problems.append(
                f"datasets differ: only here {sorted(set(da) - set(db))}, only in the reference {sorted(set(db) - set(da))}"
            )
        for name in sorted(set(da) & set(db)):
            if is_timing(name) or name.startswith("placement/"):
                continue
            x, y = da[name][()], db[name][()]
            if name == "comm/outside_rounds":  # start-up traffic of every job adds up
                if x.shape != y.shape or (x < y).any():
                    problems.append(f"/{name} {x.tolist()} is below the reference's {y.tolist()}")
                continue
            if name == "comm/channel_bytes":  # the same per channel: only the payload's (in rounds) is the reference's
                payload = [n.decode() for n in da["comm/channel"][()]].index("payload")
                if x.shape != y.shape or not np.array_equal(x[:, payload], y[:, payload]):
                    problems.append(f"/{name}: the payload channel's bytes differ from the reference")
                continue
            same = x.shape == y.shape and (
                np.array_equal(x, y, equal_nan=True) if x.dtype.kind == "f" else np.array_equal(x, y)
            )
            if not same:
                problems.append(f"/{name} differs from the reference")
        for key in sorted(set(a.attrs) | set(b.attrs)):
            if key in ATTRS_ASIDE:
                continue
            x, y = a.attrs.get(key), b.attrs.get(key)
            if not np.array_equal(np.asarray(x), np.asarray(y)):
                problems.append(f"attribute {key} differs: {x!r} vs {y!r}")
    return problems


@dataclass
class Plan:
    kind: str | None  # None: let it run
    moment: str = ""  # timed kinds: "startup" | "creation" | "round"
    at: float = 0.0  # startup: seconds from the start
    round: int = 0  # round: after this round's progress line (1-based) ...
    delay: float = 0.0  # ... plus this many seconds (creation: after the results file appeared)
    rank: int = 0
    fail_round: int = 0  # fault kinds: 0-based round

    def overrides(self) -> list[str]:
        if self.kind not in ("in_write", "in_checkpoint"):
            return []
        return [
            "debug.fail_kind=kill",
            f"debug.fail_at={self.kind}",
            f"debug.fail_rank={self.rank}",
            f"debug.fail_round={self.fail_round}",
        ]

    def text(self) -> str:
        if self.kind is None:
            return "no kill"
        if self.kind in ("job", "rank"):
            who = f"rank {self.rank}" if self.kind == "rank" else "job"
            when = {
                "startup": f"at {self.at:.2f} s (start-up)",
                "creation": f"{self.delay * 1000:.0f} ms after the file appeared",
            }.get(self.moment, f"{self.delay:.3f} s after round {self.round}")
            return f"{who} {when}"
        return f"{self.kind} rank {self.rank} round {self.fail_round + 1}"


@dataclass
class Tally:
    kills: dict = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    moments: dict = field(default_factory=dict)
    cycles: int = 0
    attempts: int = 0
    refused_as_designed: int = 0
    torn: int = 0
    late: int = 0  # a timed kill that found the job already finished
    failures: list = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.kills.values())


class Torture:
    def __init__(self, args, work: Path, log):
        self.args, self.work, self.log = args, work, log
        self.rng = random.Random(args.seed)
        self.scratch = work / "scratch"
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.references: dict[str, Reference] = {}
        self.tally = Tally()
        self.queue: list[str] = []

    def reference(self, algorithm: str) -> Reference:
        if algorithm not in self.references:
            a = self.args
            ref = reference_run(self.work, a.ranks, a.rounds, a.epochs, algorithm, self.scratch)
            self.references[algorithm] = ref
            self.log(
                f"reference {algorithm}: start-up {ref.startup:.2f} s, {ref.round_seconds:.3f} s a round -> {ref.path}"
            )
        return self.references[algorithm]

    def next_kind(self, start: int) -> str | None:
        """The queue's next kind that this attempt can still reach; None: let it run.

        An ``in_checkpoint`` kill needs a round that checkpoints ahead; when it is all the block has
        left, the attempt runs to the end and the next cycle (which starts at round 0) takes it, so
        every block of four kills covers every kind."""
        if not self.queue:
            self.queue = list(KINDS)
            self.rng.shuffle(self.queue)
        for i, kind in enumerate(self.queue):
            if kind != "in_checkpoint" or start <= self.args.rounds - 2:  # a round that checkpoints remains
                return self.queue.pop(i)
        return None

    def plan(self, start: int, ref: Reference, absent: bool) -> Plan:
        rounds, rng = self.args.rounds, self.rng
        if self.tally.total >= self.args.kills or rng.random() < self.args.let_run:
            return Plan(None)
        kind = self.next_kind(start)
        if kind is None:
            return Plan(None)
        rank = rng.randrange(self.args.ranks)
        if kind == "in_write":
            return Plan(kind, rank=rank, fail_round=rng.randint(start, rounds - 1))
        if kind == "in_checkpoint":
            return Plan(kind, rank=rank, fail_round=rng.randint(start, rounds - 2))
        if absent and rng.random() < 0.5:  # the file's creation: a window of some 10-50 ms
            return Plan(kind, "creation", delay=rng.uniform(0, 0.05), rank=rank)
        if rng.random() < 0.3:
            return Plan(kind, "startup", at=rng.uniform(0, ref.startup), rank=rank)
        return Plan(
            kind, "round", round=rng.randint(start + 1, rounds), delay=rng.uniform(0, ref.round_seconds), rank=rank
        )

    def fire(self, attempt: Attempt, plan: Plan, out: Path) -> tuple[bool, str]:
        """Wait for the plan's moment and kill; (killed?, where it landed)."""
        proc, target = attempt.proc, None
        while proc.poll() is None:
            if attempt.elapsed() > JOB_TIMEOUT:
                return False, "timeout"
            if plan.moment == "startup":
                if attempt.elapsed() >= plan.at:
                    break
            elif target is None:
                reached = out.exists() if plan.moment == "creation" else attempt.last_round() >= plan.round
                if reached:
                    target = time.monotonic() + plan.delay
            elif time.monotonic() >= target:
                break
            time.sleep(0.002)
        if proc.poll() is not None:
            return False, "finished first"
        landed = f"t={attempt.elapsed():.2f} s, round line {attempt.last_round()}"
        if plan.kind == "job":
            attempt.kill_job()
            return True, landed
        while proc.poll() is None and attempt.elapsed() < JOB_TIMEOUT:
            pid = attempt.ranks().get(plan.rank)
            if pid is not None:
                if not attempt.kill(pid):  # gone or no longer the rank seen: look again
                    continue
                return True, f"t={attempt.elapsed():.2f} s, round line {attempt.last_round()}"
            time.sleep(0.002)
        return False, "finished first"

    def fail(self, what: str, cycle_dir: Path) -> None:
        self.tally.failures.append(what)
        self.log(f"FAILURE: {what} (kept: {cycle_dir})")

    def cycle(self, number: int) -> bool:
        """One fresh output, attempts until it completes; True: it passed every check."""
        a, tally = self.args, self.tally
        algorithm = self.rng.choice(a.algorithms)
        ref = self.reference(algorithm)
        cycle_dir = self.work / f"cycle{number:04d}"
        shutil.rmtree(cycle_dir, ignore_errors=True)
        cycle_dir.mkdir()
        out = cycle_dir / "run.h5"
        folder = checkpoint.folder_for(out)
        overwrite, ok, attempt_no = False, True, 0
        while True:
            attempt_no += 1
            tally.attempts += 1
            if attempt_no > 200:
                self.fail(f"cycle {number}: no completion in 200 attempts", cycle_dir)
                return False
            found = startpoint.inspect(out)
            bound = found.completed if found.state == "results" else 0
            agreed_before = 0 if overwrite else agreed_round(folder, found.run_id, bound, a.ranks)
            before = check_file(out, a.rounds, 0) if out.exists() else FileState("no file", [])
            plan = self.plan(agreed_before, ref, absent=not out.exists())
            flag = "--overwrite" if overwrite else "--resume"
            overrides = base_overrides(a.ranks, a.rounds, a.epochs, algorithm) + plan.overrides()
            stem = cycle_dir / f"attempt{attempt_no:03d}"
            attempt = Attempt(a.ranks, out, overrides, flag, stem, self.scratch)
            killed, landed = False, ""
            if plan.kind in ("job", "rank"):
                killed, landed = self.fire(attempt, plan, out)
            rc = attempt.wait(JOB_TIMEOUT - attempt.elapsed())
            if rc is None:
                attempt.kill_job()
                attempt.wait(30)
                self.fail(
                    f"cycle {number} attempt {attempt_no}: the job did not end within {JOB_TIMEOUT:.0f} s ({plan.text()})",
                    cycle_dir,
                )
                return False
            left = attempt.leftovers()
            if left:
                self.fail(f"cycle {number} attempt {attempt_no}: processes {left} left after mpirun ended", cycle_dir)
                ok = False
            else:  # nothing of this job runs any more: its Open MPI session files can go
                shutil.rmtree(self.scratch, ignore_errors=True)
                self.scratch.mkdir()
            stderr = attempt.stderr()
            injected = "injected fault debug.fail_kind=kill" in stderr
            overwrite = False
            if rc == REFUSED:
                message = next((line for line in stderr.splitlines() if line.startswith("mpicd:")), stderr[-300:])
                if before.torn and "--overwrite" in message:
                    tally.refused_as_designed += 1
                    self.log(f"  refused as designed (a file torn at its creation): {message[:160]}")
                else:
                    self.fail(
                        f"cycle {number} attempt {attempt_no}: refused after a kill; file before: {before.text}; {message}",
                        cycle_dir,
                    )
                    return False
                overwrite = True
                if plan.kind is not None:  # refused before anything ran: the kill is still to come
                    self.queue.insert(0, plan.kind)
                continue
            if plan.kind in ("in_write", "in_checkpoint"):
                killed = injected
                landed = "fault fired" if injected else "fault not reached"
            if plan.kind is not None and not killed:
                self.queue.insert(0, plan.kind)  # its turn again: every kind keeps its share
            if rc == 0:
                if plan.kind is not None and not killed:
                    if plan.kind in ("in_write", "in_checkpoint") and not (
                        found.state == "results" and found.completed >= found.rounds
                    ):
                        self.fail(f"cycle {number} attempt {attempt_no}: {plan.text()} was never reached", cycle_dir)
                        ok = False
                    tally.late += plan.kind in ("job", "rank")
                break
            if not killed:
                tail = "\n".join(stderr.splitlines()[-15:])
                self.fail(
                    f"cycle {number} attempt {attempt_no}: exit {rc} without a kill ({plan.text()}):\n{tail}",
                    cycle_dir,
                )
                return False
            tally.kills[plan.kind] += 1
            moment = plan.moment or "fault"
            tally.moments[f"{plan.kind}/{moment}"] = tally.moments.get(f"{plan.kind}/{moment}", 0) + 1
            state = check_file(out, a.rounds, agreed_before)
            tally.torn += state.torn
            self.log(
                f"kill {tally.total:4d}  {plan.text():<44s} {landed:<28s} exit {rc:<4d} "
                f"cycle {number} {algorithm} try {attempt_no} | {state.text}"
            )
            for problem in state.problems:
                self.fail(f"cycle {number} attempt {attempt_no} after {plan.text()}: {problem}", cycle_dir)
                ok = False
        final = check_file(out, a.rounds, 0)
        problems = list(final.problems)
        if final.completed != a.rounds:
            problems.append(f"the completed job's file holds {final.completed} of {a.rounds} rounds")
        else:
            problems += compare_with_reference(out, ref.path)
        if folder.exists() and any(folder.iterdir()):
            problems.append(
                f"a complete run left checkpoints: {checkpoint_text(folder)} {sorted(p.name for p in folder.iterdir())}"
            )
        for problem in problems:
            self.fail(f"cycle {number} (completed): {problem}", cycle_dir)
        ok = ok and not problems
        tally.cycles += 1
        self.log(
            f"cycle {number} {algorithm}: completed after {attempt_no} attempts, {'equal to the reference' if ok else 'FAILED'}"
        )
        if ok:
            shutil.rmtree(cycle_dir, ignore_errors=True)
        return ok

    def run(self) -> int:
        started = time.monotonic()
        for algorithm in self.args.algorithms:
            self.reference(algorithm)
        number = failed = 0
        while self.tally.total < self.args.kills:
            number += 1
            failed += not self.cycle(number)
            if failed >= 10:
                self.log("torture: 10 cycles failed: giving up")
                break
            elapsed = time.monotonic() - started
            self.log(
                f"progress: {self.tally.total} of {self.args.kills} kills, {self.tally.cycles} cycles, "
                f"{len(self.tally.failures)} failures, {elapsed:.0f} s"
            )
        t = self.tally
        by_kind = ", ".join(f"{k} {v}" for k, v in t.kills.items())
        moments = ", ".join(f"{k} {v}" for k, v in sorted(t.moments.items()))
        self.log(
            f"torture: {t.total} kills ({by_kind}; {moments}), {t.cycles} cycles completed, "
            f"{t.attempts} attempts, {t.torn} files torn at creation, {t.refused_as_designed} refused as designed, "
            f"{t.late} late kills (job already done), {len(t.failures)} failures, {time.monotonic() - started:.0f} s"
        )
        return 1 if t.failures else 0


# ---------------------------------------------------------------- full disk, for real (root)


class Skip(Exception):
    """The full-disk check cannot run here (not root, mount not permitted): the reason."""


def _fill(folder: Path) -> int:
    """Write a filler file in ``folder`` until the file system is full; returns its bytes."""
    chunk, written = 1 << 16, 0
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        while chunk:
            try:
                written += os.write(fd, b"\0" * chunk)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                chunk //= 2  # down to the last bytes
    finally:
        os.close(fd)
    return written


def full_disk(work: Path, ranks: int = 2, rounds: int = 12, epochs: int = 10, size_mib: int = 4, log=print) -> dict:
    """A run whose results and checkpoints live on a small tmpfs that fills up mid-run.

    Returns what happened: the job's exit status and mpicd's error line, the file's verdict and
    rounds, whether each rank's newest checkpoint loads, the resume's status and the comparison
    with an uninterrupted run. Raises Skip where it cannot run."""
    import torch

    if os.geteuid() != 0:
        raise Skip("mounting a tmpfs needs root")
    scratch = work / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    mount = work / "tmpfs"
    mount.mkdir(exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}M", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise Skip(f"cannot mount a tmpfs here (mount -t tmpfs failed): {(done.stderr or done.stdout).strip()}")
    result: dict = {}
    attempt = None
    try:
        overrides = base_overrides(ranks, rounds, epochs, "codistill")
        t0 = time.monotonic()
        ref = reference_run(work, ranks, rounds, epochs, "codistill", scratch)
        result["reference_seconds"] = time.monotonic() - t0
        out = mount / "run.h5"
        folder = checkpoint.folder_for(out)
        t0 = time.monotonic()
        attempt = Attempt(ranks, out, overrides, "--resume", work / "full-disk-run", scratch)
        while not all(max(checkpoint.held(folder, r), default=0) >= 2 for r in range(ranks)):
            if attempt.proc.poll() is not None or attempt.elapsed() > JOB_TIMEOUT:
                raise RuntimeError(
                    f"the run ended or stalled before its second checkpoint:\n{attempt.stdout()}{attempt.stderr()}"
                )
            time.sleep(0.005)
        result["filled_after_round"] = attempt.last_round()
        result["free_before_fill"] = shutil.disk_usage(mount).free
        result["filler_bytes"] = _fill(mount)
        result["free_after_fill"] = shutil.disk_usage(mount).free
        rc = attempt.wait(JOB_TIMEOUT)
        if rc is None:
            attempt.kill_job()
            raise RuntimeError("the run did not end after the disk filled up")
        result["left_processes"] = attempt.leftovers()
        result["rc"], result["failed_seconds"] = rc, time.monotonic() - t0
        stderr = attempt.stderr()
        result["stderr"] = stderr
        result["error_line"] = next((line for line in stderr.splitlines() if " failed: " in line), "")
        verdict = verify(out)
        result["verify_ok"], result["verify_text"] = verdict.ok, verdict.text()
        result["completed"] = Results(out).completed_rounds if verdict.ok else -1
        run_id = startpoint.inspect(out).run_id
        newest = {r: checkpoint.available(folder, r, run_id)[:1] for r in range(ranks)}
        result["newest_checkpoints"] = newest
        result["checkpoints_load"] = all(
            held and checkpoint.load(folder, r, held[0], run_id, torch.device("cpu")) is not None
            for r, held in newest.items()
        )
        result["temporary_files"] = (
            sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp")) if folder.is_dir() else []
        )
        (mount / "filler").unlink()
        t0 = time.monotonic()
        resumed = Attempt(ranks, out, overrides, "--resume", work / "full-disk-resume", scratch)
        result["resume_rc"] = resumed.wait(JOB_TIMEOUT)
        resumed.leftovers()
        result["resume_seconds"] = time.monotonic() - t0
        result["resume_stdout"] = resumed.stdout()
        result["resume_line"] = next((line for line in resumed.stdout().splitlines() if "resuming" in line), "")
        result["resume_verify_ok"] = verify(out).ok
        result["compare"] = compare_with_reference(out, ref.path) if result["resume_rc"] == 0 else ["resume failed"]
        result["checkpoints_left"] = folder.exists()
    finally:
        if attempt is not None and attempt.proc.poll() is None:
            attempt.kill_job()
            attempt.wait(30)
        umount = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        if umount.returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)
    problems = []
    if result["rc"] == 0:
        problems.append("the job exited 0 on a full disk")
    if not result["error_line"] or "--resume" not in result["error_line"]:
        problems.append(f"no clear error line naming --resume: {result['error_line'] or stderr[-500:]}")
    if not result["verify_ok"]:
        problems.append(f"verify fails on the file left: {result['verify_text']}")
    if not result["checkpoints_load"]:
        problems.append(f"a newest checkpoint does not load: {result['newest_checkpoints']}")
    if result["temporary_files"]:
        problems.append(f"temporary checkpoint files left: {result['temporary_files']}")
    if result["resume_rc"] != 0 or not result["resume_line"]:
        problems.append(f"the resume did not complete ({result['resume_rc']}): {result['resume_stdout'][-500:]}")
    problems += result["compare"]
    if result["checkpoints_left"]:
        problems.append("the resumed, complete run left its checkpoint folder")
    if result["left_processes"]:
        problems.append(f"processes left after the failed job: {result['left_processes']}")
    result["problems"] = problems
    log(
        f"full disk: tmpfs {size_mib} MiB filled after round {result['filled_after_round']} "
        f"({result['filler_bytes'] / 2**20:.2f} MiB of filler); job exit {result['rc']} in {result['failed_seconds']:.1f} s"
    )
    log(f"full disk: error: {result['error_line']}")
    log(
        f"full disk: file left: {result['verify_text'].splitlines()[0]}; newest checkpoints "
        f"{result['newest_checkpoints']} load: {result['checkpoints_load']}"
    )
    log(
        f"full disk: after deleting the filler, --resume: exit {result['resume_rc']} "
        f"in {result['resume_seconds']:.1f} s ({result['resume_line']})"
    )
    log(
        f"full disk: {'equal to the uninterrupted run' if not result['compare'] else result['compare']}; {len(problems)} problems"
    )
    for problem in problems:
        log(f"full disk: problem: {problem}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=8, help="kills to make (default 8)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: drawn and printed)")
    parser.add_argument("--out", help="work folder (default: a new temporary folder, deleted when all passed)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=10, help="train.local_epochs (longer rounds to land kills in)")
    parser.add_argument("--algorithms", default="codistill,fedproto", help="comma-separated; one drawn per cycle")
    parser.add_argument("--let-run", type=float, default=0.2, help="chance that an attempt is not killed")
    parser.add_argument(
        "--no-snapshot", action="store_true", help="run the tree's mpicd, not a copy taken at the start"
    )
    parser.add_argument("--full-disk", action="store_true", help="the full-disk check instead (root: mounts a tmpfs)")
    args = parser.parse_args(argv)
    args.algorithms = [a for a in args.algorithms.split(",") if a]
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**31)
    work = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="mpicd-torture-"))
    work.mkdir(parents=True, exist_ok=True)
    use_code(work, snapshot=not args.no_snapshot)

    def log(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    if args.full_disk:
        try:
            result = full_disk(work, args.ranks, log=log)
        except Skip as why:
            log(f"full disk: skipped: {why}")
            return 0
        code = 1 if result["problems"] else 0
    else:
        log(f"torture: {args.kills} kills, {args.ranks} ranks, {args.rounds} rounds, seed {args.seed}, work {work}")
        code = Torture(args, work, log).run()
    if code == 0 and not args.out:
        shutil.rmtree(work, ignore_errors=True)
    else:
        shutil.rmtree(work / "scratch", ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
