"""``mpicd bench``: what a round costs, where its time goes, how it compares, and how it would scale.

Started without mpirun: it launches its own MPI jobs (``mpirun``/``mpiexec``; Open MPI gets
``--oversubscribe``, and ``--allow-run-as-root`` as root; inside a Slurm allocation ``srun
--mpi=pmix``) and reads the results files they write. One job of N ranks (``--ranks``) measures,
repeat after repeat, in alternating order so that background load hits every side alike:

1. overhead: rank 0 alone (the others wait asleep) runs ``local`` on one client through mpicd's
   round loop and through a bare PyTorch loop written here (same model, data, batch size,
   optimizer, threads). mpicd's train seconds per round come from ``/metrics/train_seconds``, the
   bare loop's from ``time.perf_counter``; ``overhead_ratio`` = mpicd / bare.
2. anatomy: every algorithm on N ranks; train, comm (inside MPI, waiting included), eval and
   write seconds per round from the results file; ``comm_io_fraction`` = (comm + write) / round.
3. parallel vs serial: the N-rank ``local`` run of part 2 against rank 0 alone training the same
   N clients one after another (how single-process simulators run) with ``--threads`` threads
   (default: what mpicd gives one rank alone, all the cores), like part 1 and the ResNet-18 compute.
5. network: ping-pong and Allreduce over message sizes (:mod:`mpicd.bench_net`), fitted to
   latency + bytes / bandwidth.
Then 4. start-up: ``--repeats`` fresh launches of the quick start on N ranks, split into the
phases ``mpicd run`` records (attr ``startup_seconds``) plus the rest up to round 1.
The projection combines the fit, the bytes every algorithm declares (``payloads``) and the measured
compute into round times on 4 ... 1024 ranks (assumptions in :data:`ASSUMPTIONS`).

The first round of every run is a warm-up and left out. Every figure is min / median / max over
repeats. ``python -m mpicd.bench SPEC`` is the MPI job itself (the launcher starts it).
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALGORITHMS = ("codistill", "fedavg", "fedproto", "feddistill", "fedamp", "local")
PROJECTED_RANKS = tuple(2**k for k in range(2, 11))  # 4 ... 1024
PROJECTED_MODELS = ("lenet", "resnet18")
ASSUMPTIONS = (
    "weak scaling: every rank keeps its own client of the same size, so compute per round stays the "
    "one measured here on one rank with all of this machine's cores (a GPU per rank would shrink it)",
    "one rank per node, links of the ping-pong's fitted latency a and bandwidth b (the current launch: on "
    "one machine that is shared memory, under srun across nodes the network)",
    "p2p (codistill): sends posted together, the busiest teacher sets the pace: a + S_max * 4D / b, "
    "S_max the mean over 32 rounds of the most students one rank serves (from the teacher draw)",
    "allreduce (fedavg, fedproto, feddistill; and the per-round progress Allreduce of 32 B): "
    "2 ceil(log2 N) a + 2 (N-1)/N * m / b (recursive-doubling latency, ring bandwidth)",
    "allgather (fedamp): ceil(log2 N) a + (N-1) * block / b; each rank also holds all N models "
    "(4NP bytes) and computes N distances, neither of which is modelled beyond the bytes",
    "results writing: the write seconds measured here on the rank that waited least (write_min), "
    "independent of N (a parallel file system's flush grows with N; not modelled); no waiting for "
    "slower ranks, no contention between links",
)


class BenchError(RuntimeError):
    """A launched job failed or a setting is unusable; the message says which."""


@dataclass
class Settings:
    ranks: int = 4
    repeats: int = 3
    rounds: int = 6
    resnet_rounds: int = 2  # ResNet-18's compute for the projection: 1 + warm-up
    config: str = ""
    overrides: list = field(default_factory=list)  # applied to every run (data size, data path)
    sizes: tuple = ()
    net_budget: float = 2.0**28  # bytes moved per size and repeat in the sweep
    net_most: int = 1000
    timeout: float = 3600.0
    threads: int | None = None  # single-process parts; None: what mpicd gives one rank
    quick: bool = False
    write_ranks: tuple = ()  # the results write vs ranks (mpicd.bench_write); empty: not measured
    write_rounds: int = 17
    clients_sweep: tuple = ()  # clients per rank (mpicd.bench_clients): these N on 2 and N ranks; empty: not measured
    clients_rounds: int = 4


def stats(values) -> dict:
    """min / median / max of the finite values (and the values themselves)."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return {"min": None, "median": None, "max": None, "values": []}
    return {"min": min(v), "median": float(np.median(v)), "max": max(v), "values": v}


def settings_for(args) -> Settings:
    """The command line's options with --quick's defaults; BenchError names a bad option."""
    from .bench_net import SIZES

    quick = bool(args.quick)
    s = Settings(
        ranks=2 if quick else 4,
        repeats=1 if quick else 3,
        rounds=2 if quick else 6,
        sizes=(8, 2**20) if quick else SIZES,
        net_budget=2.0**24 if quick else 2.0**28,
        net_most=100 if quick else 1000,
        quick=quick,
        overrides=["data.images_per_class=40"] if quick else [],
        write_ranks=(2, 5) if quick else (),
        write_rounds=5 if quick else 17,
    )
    if getattr(args, "write_ranks", None):
        try:
            s.write_ranks = tuple(int(n) for n in args.write_ranks.split(","))
        except ValueError:
            raise BenchError(
                f"--write-ranks must be a comma-separated list of rank counts, got {args.write_ranks!r}"
            ) from None
        if any(n < 1 for n in s.write_ranks):
            raise BenchError(f"--write-ranks must be at least 1 each, got {args.write_ranks!r}")
    if getattr(args, "clients_per_rank", None):
        try:
            s.clients_sweep = tuple(int(n) for n in args.clients_per_rank.split(","))
        except ValueError:
            raise BenchError(f"--clients-per-rank must be a comma-separated list of client counts, got "
                             f"{args.clients_per_rank!r}") from None  # fmt: skip
        if any(n < 2 for n in s.clients_sweep):
            raise BenchError(f"--clients-per-rank must be at least 2 each, got {args.clients_per_rank!r}")
    for name in ("ranks", "repeats", "rounds"):
        value = getattr(args, name)
        if value is not None:
            setattr(s, name, value)
    if s.ranks < 2:
        raise BenchError(f"--ranks must be at least 2, got {s.ranks}")
    if s.repeats < 1:
        raise BenchError(f"--repeats must be at least 1, got {s.repeats}")
    if s.rounds < 2:
        raise BenchError(f"--rounds must be at least 2 (the first is a warm-up), got {s.rounds}")
    if args.timeout is not None:
        s.timeout = float(args.timeout)
    if args.threads is not None:
        if args.threads < 1:
            raise BenchError(f"--threads must be at least 1, got {args.threads}")
        s.threads = args.threads
    config = Path(args.config) if args.config else ROOT / "configs" / "pneumoniamnist.yaml"
    if not config.is_file():
        raise BenchError(f"--config: {config} does not exist")
    s.config = str(config.resolve())
    if args.data:
        data = Path(args.data)
        if not data.is_file():
            raise BenchError(f"--data: {data} does not exist")
        s.overrides.append(f"data.path={data.resolve()}")
    return s


# ----------------------------------------------------------------------------- launching


def launcher(n: int, unbound: bool = False) -> list[str]:
    """The command prefix that starts ``n`` ranks here: srun inside Slurm, else mpirun/mpiexec.

    ``unbound``: no binding of ranks to cores (Open MPI binds each of up to 2 ranks to one core),
    for the job whose rank 0 also trains alone with all the cores.
    """
    if "SLURM_JOB_ID" in os.environ and shutil.which("srun"):
        return ["srun", "--mpi=pmix", "-n", str(n), "--kill-on-bad-exit=1"]
    path, flags = _mpirun()
    openmpi = "--oversubscribe" in flags
    return [path, "-n", str(n), *flags, *(["--bind-to", "none"] if unbound and openmpi else [])]


@functools.cache
def _mpirun() -> tuple[str, tuple[str, ...]]:
    """mpirun (or mpiexec) and the flags it needs here: Open MPI's --oversubscribe, as root
    --allow-run-as-root (MPICH's Hydra oversubscribes without being asked)."""
    for name in ("mpirun", "mpiexec"):
        path = shutil.which(name)
        if path:
            break
    else:
        raise BenchError("neither mpirun nor mpiexec is on PATH (nor is this a Slurm allocation)")
    version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    flags: list[str] = []
    if "Open MPI" in version.stdout + version.stderr or "OpenRTE" in version.stdout + version.stderr:
        flags.append("--oversubscribe")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            flags.append("--allow-run-as-root")
    return path, tuple(flags)


def run_job(
    n: int, argv: list[str], timeout: float, stamp: bool = False, unbound: bool = False
) -> tuple[float, list[tuple[float, str]]]:
    """Launch ``n`` ranks of ``python ARGV``; returns (launch time, [(time, line)] of its output).

    ``stamp``: pass the launch time to the job (MPICD_LAUNCHED_AT) for its start-up phases. The
    whole process group is killed after ``timeout`` seconds or on an interrupt: never a hang.
    """
    command = [*launcher(n, unbound), sys.executable, *argv]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MPICD_LAUNCHED_AT", None)
    lines: list[tuple[float, str]] = []
    launched = time.time()
    if stamp:
        env["MPICD_LAUNCHED_AT"] = repr(launched)
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    expired = threading.Event()

    def kill() -> None:
        expired.set()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    try:
        for line in proc.stdout:
            lines.append((time.time(), line.rstrip("\n")))
        code = proc.wait()
    except BaseException:
        kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    if code != 0:
        tail = "\n".join(text for _, text in lines[-40:])
        why = f"killed after {timeout:.0f} s" if expired.is_set() else f"exit status {code}"
        raise BenchError(f"{' '.join(command)}: {why}\n{tail}")
    return launched, lines


# ----------------------------------------------------------------------------- the MPI job


def _mpicd_run(comm, config: str, overrides: list[str], out: Path, threads: int | None = None) -> None:
    """One run through mpicd's round loop, as ``mpicd run`` drives it, on ``comm``'s ranks
    (``threads``: torch's threads instead of the placement's, as the bench was asked)."""
    import dataclasses

    import torch

    from .config import load_config
    from .loop import run
    from .plan import prepare
    from .runtime import place

    plan = prepare(load_config(config, overrides))
    placement = place(comm.mpi, plan.config.device)
    if threads is not None:
        torch.set_num_threads(threads)
        placement = dataclasses.replace(placement, threads=threads)
    run(plan, comm, placement, out, log=lambda line: None)


class BareClient:
    """One client as a plain PyTorch loop, written here apart from mpicd's Client: the reference."""

    def __init__(self, plan, index: int, device: str):
        import torch

        from .models import build_model

        cfg, data = plan.config, plan.dataset
        own = plan.partition.train_indices[index]
        self.device = torch.device(device)
        self.x = torch.from_numpy(data.train.x[own]).to(self.device)
        self.y = torch.from_numpy(data.train.y[own]).to(self.device)
        self.evals = [torch.from_numpy(s.x).to(self.device) for s in (data.test, data.val) if s is not None]
        torch.manual_seed(cfg.seed)
        self.model = build_model(
            cfg.model.name, data.input_shape, data.num_classes, cfg.model.feature_dim, cfg.model.hidden
        ).to(self.device)
        t = cfg.train
        self.optimizer = (
            torch.optim.Adam(self.model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
            if t.optimizer == "adam"
            else torch.optim.SGD(self.model.parameters(), lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)
        )
        self.train_cfg = t
        self.generator = torch.Generator().manual_seed(cfg.seed + index)

    def _sync(self) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def train(self) -> float:
        """One round's local epochs; returns their seconds."""
        import torch
        import torch.nn.functional as F

        started = time.perf_counter()
        self.model.train()
        for _ in range(self.train_cfg.local_epochs):
            order = torch.randperm(len(self.y), generator=self.generator).to(self.device)
            for index in order.split(self.train_cfg.batch_size):
                loss = F.cross_entropy(self.model(self.x[index]), self.y[index])
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
        self._sync()
        return time.perf_counter() - started

    def evaluate(self) -> None:
        """Predictions on the test and validation splits, as every mpicd round makes them."""
        import torch

        self.model.eval()
        with torch.no_grad():
            for x in self.evals:
                for chunk in x.split(self.train_cfg.eval_batch_size):
                    self.model(chunk).argmax(dim=1).cpu()
        self._sync()


def _alone(spec: dict, repeat: int, out: Path) -> dict:
    """Rank 0's single-process parts of one repeat, in alternating order; raw seconds per round."""
    import torch
    from mpi4py import MPI

    from .comm import Comm
    from .config import load_config
    from .plan import prepare
    from .runtime import choose_device, cpu_threads

    threads = spec["threads"] or cpu_threads(1)  # default: what mpicd gives one rank alone here
    one = [*spec["overrides"], "clients=1", "algorithm=local"]
    n = spec["ranks"]
    found = {"threads": threads}

    def device(cfg) -> str:
        return choose_device(cfg.device, 0, torch.cuda.device_count() if cfg.device != "cpu" else 0)

    def mpicd() -> None:
        _mpicd_run(Comm(MPI.COMM_SELF), spec["config"], one, out / f"single_{repeat}.h5", threads)

    def bare() -> None:
        plan = prepare(load_config(spec["config"], one))
        torch.set_num_threads(threads)
        client = BareClient(plan, 0, device(plan.config))
        seconds = []
        for _ in range(spec["rounds"]):
            seconds.append(client.train())
            client.evaluate()
        found["bare"], found["images"] = seconds, len(client.y)

    def serial() -> None:
        plan = prepare(load_config(spec["config"], [*spec["overrides"], f"clients={n}", "algorithm=local"]))
        torch.set_num_threads(threads)
        clients = [BareClient(plan, i, device(plan.config)) for i in range(n)]
        seconds = []
        for _ in range(spec["rounds"]):
            started = time.perf_counter()
            for client in clients:
                client.train()
                client.evaluate()
            seconds.append(time.perf_counter() - started)
        found["serial"] = seconds

    def resnet() -> None:
        _mpicd_run(
            Comm(MPI.COMM_SELF),
            spec["config"],
            [*one, "model.name=resnet18", f"rounds={spec['resnet_rounds']}"],
            out / f"resnet_{repeat}.h5",
            threads,
        )

    steps = [bare, mpicd, serial, resnet]
    for step in steps if repeat % 2 == 0 else steps[::-1]:
        step()
    return found


def worker(spec_path: str) -> int:
    """The MPI job: per repeat the anatomy runs (all ranks), then rank 0's single-process parts while
    the others sleep; then the network sweep. Rank 0 writes the raw figures to ``<out>/worker.json``."""
    from mpi4py import MPI

    from .bench_net import idle, sweep
    from .comm import Comm
    from .runtime import abort_on_exception

    spec = json.loads(Path(spec_path).read_text())
    out, world = Path(spec["out"]), MPI.COMM_WORLD
    common = [*spec["overrides"], f"clients={world.Get_size()}"]
    raw: dict = {"alone": []}
    with abort_on_exception(world):
        for repeat in range(spec["repeats"]):
            shift = repeat % len(spec["algorithms"])
            for name in spec["algorithms"][shift:] + spec["algorithms"][:shift]:
                _mpicd_run(Comm(world), spec["config"], [*common, f"algorithm={name}"], out / f"{name}_{repeat}.h5")
            if world.Get_rank() == 0:
                raw["alone"].append(_alone(spec, repeat, out))
                world.Ibarrier().Wait()
            else:
                idle(world)
        raw["network"] = sweep(world, spec["sizes"], spec["repeats"], spec["net_budget"], spec["net_most"])
        if world.Get_rank() == 0:
            import torch

            from .config import load_config
            from .plan import prepare

            raw["models"] = model_sizes(prepare(load_config(spec["config"], common)))
            raw["torch"] = str(torch.__version__)
            raw["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
            (out / "worker.json").write_text(json.dumps(raw))
    return 0


# ----------------------------------------------------------------------------- figures


def _results(path: Path):
    from .results import Results

    return Results(path)


def _round_parts(path: Path) -> dict[str, np.ndarray]:
    """(rounds after the warm-up, ranks) seconds of each part of the round."""
    m = _results(path).metrics
    return {part: np.asarray(m[f"{part}_seconds"][1:], dtype=float) for part in ("train", "comm", "eval", "write")}


def anatomy(folder: Path, s: Settings) -> tuple[dict, dict, dict]:
    """Per algorithm: mean seconds per round and rank of each part, over repeats; the fractions.

    ``comm_io_fraction`` = (comm + write) / round, means over ranks: what a rank spends in MPI and
    in the results write, waiting for slower ranks included. ``comm_io_own_fraction`` takes, each
    round, the rank that waited least (the last to arrive: its comm and write seconds are the
    transfer and the writing themselves): the cost of communicating and writing without the
    imbalance between ranks that any synchronisation exposes.
    """
    parts, fractions, own = {}, {}, {}
    for name in ALGORITHMS:
        per = {p: [] for p in ("train", "comm", "eval", "write", "total", "comm_min", "write_min")}
        frac, frac_own = [], []
        for repeat in range(s.repeats):
            sec = _round_parts(folder / f"{name}_{repeat}.h5")
            means = {p: float(np.nanmean(v)) for p, v in sec.items()}
            total = sum(means.values())
            for p, v in means.items():
                per[p].append(v)
            per["total"].append(total)
            for p in ("comm", "write"):
                per[f"{p}_min"].append(float(np.nanmean(np.nanmin(sec[p], axis=1))))
            frac.append((means["comm"] + means["write"]) / total)
            frac_own.append((per["comm_min"][-1] + per["write_min"][-1]) / total)
        parts[name] = {p: stats(v) for p, v in per.items()}
        fractions[name], own[name] = stats(frac), stats(frac_own)
    return parts, fractions, own


def overhead(folder: Path, raw: dict, s: Settings) -> dict:
    ratio, mine, bare, mine_ips, bare_ips = [], [], [], [], []
    for repeat, alone in enumerate(raw["alone"]):
        t_mpicd = float(np.mean(_round_parts(folder / f"single_{repeat}.h5")["train"]))
        t_bare = float(np.mean(alone["bare"][1:]))
        images = alone["images"]
        mine.append(t_mpicd), bare.append(t_bare), ratio.append(t_mpicd / t_bare)
        mine_ips.append(images / t_mpicd), bare_ips.append(images / t_bare)
    return {
        "images_per_round": raw["alone"][0]["images"],
        "threads": raw["alone"][0]["threads"],
        "mpicd_train_seconds": stats(mine),
        "bare_train_seconds": stats(bare),
        "mpicd_images_per_second": stats(mine_ips),
        "bare_images_per_second": stats(bare_ips),
        "overhead_ratio": stats(ratio),
    }


def parallel(folder: Path, raw: dict, s: Settings) -> dict:
    par, ser, speed = [], [], []
    for repeat, alone in enumerate(raw["alone"]):
        sec = _round_parts(folder / f"local_{repeat}.h5")
        rounds = np.nan_to_num(sum(sec.values())).max(axis=1)  # the slowest rank sets the round
        t_par, t_ser = float(np.mean(rounds)), float(np.mean(alone["serial"][1:]))
        par.append(t_par), ser.append(t_ser), speed.append(t_ser / t_par)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return {
        "ranks": s.ranks,
        "cores": cores,
        "serial_threads": raw["alone"][0]["threads"],
        "parallel_round_seconds": stats(par),
        "serial_round_seconds": stats(ser),
        "speedup": stats(speed),
        "ideal": min(s.ranks, cores),
    }


def startup(s: Settings, folder: Path) -> dict:
    """Fresh launches of the quick start on ``s.ranks`` ranks: phases, and seconds to round 1."""
    import yaml

    from .runner import STARTUP_PHASES

    config = ROOT / "configs" / "quickstart.yaml"
    totals, phases = [], {name: [] for name in (*STARTUP_PHASES, "model_build")}
    for repeat in range(s.repeats):
        out = folder / f"startup_{repeat}.h5"
        launched, lines = run_job(
            s.ranks,
            ["-m", "mpicd", "run", str(config), f"clients={s.ranks}", "rounds=2", "--out", str(out)],
            s.timeout,
            stamp=True,
        )
        first = next((t for t, text in lines if re.match(r"round\s+1/", text)), None)
        if first is None:
            raise BenchError("the quick start printed no 'round 1/' line:\n" + "\n".join(t for _, t in lines[-20:]))
        res = _results(out)
        recorded = yaml.safe_load(res.attrs["startup_seconds"])
        m = res.metrics
        round_one = float(
            m["train_seconds"][0, 0] + m["comm_seconds"][0, 0] + m["eval_seconds"][0, 0] + m["write_seconds"][0, 0]
        )
        total = first - launched - round_one
        totals.append(total)
        for name in STARTUP_PHASES:
            phases[name].append(recorded.get(name))
        phases["model_build"].append(total - sum(recorded.values()))
    return {
        "ranks": s.ranks,
        "config": "configs/quickstart.yaml",
        "total": stats(totals),
        "phases": {name: stats(v) for name, v in phases.items()},
    }


def network(raw: dict) -> dict:
    from .bench_net import fit

    net = raw["network"]
    result = {"ranks": net["ranks"], "sizes": net["sizes"]}
    for name in ("pingpong", "allreduce"):
        medians = [float(np.median(v)) for v in net[name]]
        latency, bandwidth = fit(net["sizes"], medians)
        result[name] = {
            "seconds": [stats(v) for v in net[name]],
            "latency_seconds": latency,
            "bandwidth_bytes_per_second": bandwidth,
        }
    return result


def model_sizes(plan) -> dict:
    """C, D, P, B of the LeNet and ResNet-18 on the bench's dataset."""
    from .algorithms import Sizes
    from .models import build_model

    cfg, data = plan.config, plan.dataset
    out = {}
    for name in PROJECTED_MODELS:
        sizes = Sizes.of(
            build_model(name, data.input_shape, data.num_classes, cfg.model.feature_dim, cfg.model.hidden), 1
        )
        out[name] = asdict(sizes)
    return out


def busiest_teacher(n: int, seed: int = 0, rounds: int = 32) -> float:
    """Mean over rounds of the most students one rank serves under co-distillation's draw."""
    from .algorithms.codistill import teacher_assignment

    return float(np.mean([np.bincount(teacher_assignment(seed, r, n), minlength=n).max() for r in range(rounds)]))


def comm_model(name: str, n: int, sizes: dict, latency: float, bandwidth: float) -> float:
    """Projected seconds of one round's exchange of ``name`` on ``n`` ranks (see ASSUMPTIONS)."""
    from .algorithms import Sizes, resolve

    cls, params = resolve({"name": name})
    students = busiest_teacher(n) if name == "codistill" else 0
    counts = cls.bytes_per_round(Sizes(**{**sizes, "N": n}), params, students=int(round(students)))
    steps = math.ceil(math.log2(n))
    seconds = 0.0
    for kind, (sent, recv) in counts.items():
        if not sent and not recv:
            continue
        if kind == "p2p":  # sent = S messages of one size
            seconds += latency + students * (sent / max(1, round(students))) / bandwidth
        elif kind == "allreduce":
            seconds += 2 * steps * latency + 2 * (n - 1) / n * sent / bandwidth
        elif kind in ("allgather", "bcast"):
            seconds += steps * latency + (n - 1) * sent / bandwidth
    return seconds


def progress_allreduce(n: int, latency: float, bandwidth: float) -> float:
    """The loop's per-round progress and stop agreement: an Allreduce of 4 float64."""
    return 2 * math.ceil(math.log2(n)) * latency + 2 * (n - 1) / n * 32 / bandwidth


def projection(net: dict, sizes: dict, compute: dict, write: float) -> dict:
    a, b = net["pingpong"]["latency_seconds"], net["pingpong"]["bandwidth_bytes_per_second"]
    out = {
        "ranks": list(PROJECTED_RANKS),
        "latency_seconds": a,
        "bandwidth_bytes_per_second": b,
        "write_seconds": write,
        "assumptions": list(ASSUMPTIONS),
        "models": {},
    }
    for model in PROJECTED_MODELS:
        rows = {}
        for name in ALGORITHMS:
            comm = [comm_model(name, n, sizes[model], a, b) + progress_allreduce(n, a, b) for n in PROJECTED_RANKS]
            rows[name] = {"comm_seconds": comm, "round_seconds": [compute[model] + c + write for c in comm]}
        out["models"][model] = {
            **sizes[model],
            "compute_seconds": compute[model],
            "algorithms": rows,
            "fedamp_gathered_bytes": [4 * n * sizes[model]["P"] for n in PROJECTED_RANKS],
        }
    return out


def compute_per_round(folder: Path, s: Settings) -> dict:
    """Median over repeats of one rank's train + eval seconds per round (all cores), per model."""
    out = {}
    for model, prefix in (("lenet", "single"), ("resnet18", "resnet")):
        values = []
        for repeat in range(s.repeats):
            sec = _round_parts(folder / f"{prefix}_{repeat}.h5")
            values.append(float(np.mean(sec["train"] + sec["eval"])))
        out[model] = float(np.median(values))
    return out


def machine() -> dict:
    info = {
        "host": platform.node(),
        "system": platform.platform(),
        "python": platform.python_version(),
        "cores": os.cpu_count(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        info["cpu"] = re.search(r"model name\s*:\s*(.*)", cpu).group(1).strip()
        mem = Path("/proc/meminfo").read_text()
        info["memory_gib"] = round(int(re.search(r"MemTotal:\s*(\d+)", mem).group(1)) / 2**20, 1)
    except (OSError, AttributeError):
        info["cpu"] = platform.processor()
    prefix = launcher(2)
    info["launcher"] = " ".join(prefix[:1] + prefix[3:])
    try:
        version = subprocess.run([prefix[0], "--version"], capture_output=True, text=True, timeout=60)
        info["mpi"] = (version.stdout or version.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        info["mpi"] = None
    return info


# ----------------------------------------------------------------------------- printing


def _f(st: dict, scale: float = 1.0, digits: int = 4) -> str:
    if st["median"] is None:
        return "n/a"
    return " / ".join(f"{st[k] * scale:.{digits}g}" for k in ("min", "median", "max"))


def render(r: dict) -> str:
    o, lines = r["overhead"], []
    lines += [
        f"mpicd bench: {r['settings']['repeats']} repeat(s), {r['settings']['rounds']} rounds per run "
        f"(round 1 left out), {r['settings']['ranks']} ranks; figures are min / median / max over repeats",
        f"machine: {r['machine'].get('cpu')}, {r['machine']['cores']} cores; {r['machine'].get('mpi')}; "
        f"load average at start {r['machine']['load_average']}",
        "",
        f"1. framework overhead: local, 1 rank, {o['images_per_round']} images per round, {o['threads']} threads",
        f"   mpicd train s/round     {_f(o['mpicd_train_seconds'])}",
        f"   bare PyTorch s/round    {_f(o['bare_train_seconds'])}",
        f"   mpicd images/s          {_f(o['mpicd_images_per_second'])}",
        f"   bare images/s           {_f(o['bare_images_per_second'])}",
        f"   overhead_ratio          {_f(o['overhead_ratio'])}",
        "",
        f"2. round anatomy, {r['settings']['ranks']} ranks, ms per round and rank (min / median / max)",
    ]
    width, columns = 22, ("train", "comm", "eval", "write", "total", "comm_min", "write_min")
    fractions = ("comm_io_fraction", "comm_io_own_fraction")
    lines.append(f"   {'algorithm':<11}" + "".join(f" {p:>{width}}" for p in (*columns, *fractions)))
    for name, parts in r["anatomy"].items():
        lines.append(
            f"   {name:<11}"
            + "".join(f" {_f(parts[p], 1000, 3):>{width}}" for p in columns)
            + "".join(f" {_f(r[key][name], 1, 3):>{width}}" for key in fractions)
        )
    lines.append(
        "   (comm_min, write_min: each round the rank that waited least, i.e. the transfer and the write "
        "themselves; comm_io_fraction = (comm + write) / total, waiting for slower ranks included; "
        "comm_io_own_fraction the same with comm_min and write_min)"
    )
    p = r["parallel"]
    lines += [
        "",
        f"3. parallel vs serial: {p['ranks']} ranks vs one process training {p['ranks']} clients in turn "
        f"({p['cores']} cores)",
        f"   parallel s/round        {_f(p['parallel_round_seconds'])}",
        f"   serial s/round          {_f(p['serial_round_seconds'])}   ({p['serial_threads']} threads)",
        f"   speedup                 {_f(p['speedup'])}   (ideal {p['ideal']})",
        "",
        f"4. start-up: quick start on {r['startup_seconds']['ranks']} ranks, launch to round 1",
        f"   total s                 {_f(r['startup_seconds']['total'])}",
    ]
    for name, st in r["startup_seconds"]["phases"].items():
        lines.append(f"   {name:<23} {_f(st)}")
    n = r["network"]
    lines += [
        "",
        f"5. network ({n['ranks']} ranks): seconds per operation (median over repeats)",
        f"   {'bytes':>10} {'ping-pong one-way':>18} {'allreduce':>12}",
    ]
    for i, size in enumerate(n["sizes"]):
        lines.append(
            f"   {size:>10} {n['pingpong']['seconds'][i]['median']:>18.3e} "
            f"{n['allreduce']['seconds'][i]['median']:>12.3e}"
        )
    for name in ("pingpong", "allreduce"):
        lines.append(
            f"   fit {name}: latency {n[name]['latency_seconds'] * 1e6:.2f} us, bandwidth "
            f"{n[name]['bandwidth_bytes_per_second'] / 1e9:.3f} GB/s"
        )
    pr = r["projection"]
    lines += ["", "projection: seconds per round on N ranks (compute measured here + modelled exchange + write)"]
    for model, m in pr["models"].items():
        lines.append(f"   {model}: D={m['D']} P={m['P']:,} B={m['B']:,}, compute {m['compute_seconds']:.3g} s/round")
        lines.append(f"   {'N':>6}" + "".join(f"{name:>12}" for name in m["algorithms"]))
        for i, ranks in enumerate(pr["ranks"]):
            lines.append(
                f"   {ranks:>6}" + "".join(f"{alg['round_seconds'][i]:>12.4g}" for alg in m["algorithms"].values())
            )
    lines += ["   assumptions:"] + [f"   - {a}" for a in pr["assumptions"]]
    if "write_vs_ranks" in r:
        from .bench_write import render as render_write

        lines += render_write(r["write_vs_ranks"])
    if "clients_per_rank" in r:
        from .bench_clients import render as render_clients

        lines.append(render_clients(r["clients_per_rank"]["holding"], r["clients_per_rank"]["sweep"]))
    return "\n".join(lines)


def plot(r: dict, path: str) -> bool:
    """Projected round time against N, one panel per model; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    pr = r["projection"]
    fig, axes = plt.subplots(1, len(pr["models"]), figsize=(11, 4.2), squeeze=False)
    for ax, (model, m) in zip(axes[0], pr["models"].items()):
        for name, a in m["algorithms"].items():
            (line,) = ax.plot(pr["ranks"], a["round_seconds"], marker="o", ms=3, label=name)
            ax.plot(pr["ranks"], a["comm_seconds"], ls=":", color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks N")
        ax.set_ylabel("seconds per round (dotted: exchange only)")
        ax.set_title(f"{model}: P = {m['P']:,}, compute {m['compute_seconds']:.2g} s")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


# ----------------------------------------------------------------------------- entry


def bench(s: Settings, log=print) -> dict:
    """Run every part and return the figures (the JSON). Imports no torch: the jobs do the work."""
    from .config import ConfigError, load_config

    cfg = load_config(s.config, [*s.overrides, f"clients={s.ranks}"])  # bad input fails here, not in MPI
    if cfg.data.path and not Path(cfg.data.path).exists():
        raise ConfigError("data.path", f"{cfg.data.path} does not exist (run from the project root, or --data)")
    started = time.perf_counter()
    folder = Path(tempfile.mkdtemp(prefix="mpicd-bench-"))
    try:
        info = machine()
        spec = {
            "config": s.config,
            "overrides": [*s.overrides, f"rounds={s.rounds}", "checkpoint.every=0"],
            "algorithms": list(ALGORITHMS),
            "repeats": s.repeats,
            "rounds": s.rounds,
            "ranks": s.ranks,
            "resnet_rounds": s.resnet_rounds,
            "sizes": list(s.sizes),
            "threads": s.threads,
            "net_budget": s.net_budget,
            "net_most": s.net_most,
            "out": str(folder),
        }
        (folder / "spec.json").write_text(json.dumps(spec))
        log(f"mpicd bench: one job of {s.ranks} ranks (parts 1, 2, 3, 5; {s.repeats} repeat(s)) ...")
        run_job(s.ranks, ["-m", "mpicd.bench", str(folder / "spec.json")], s.timeout, unbound=True)
        raw = json.loads((folder / "worker.json").read_text())
        info.update(torch=raw["torch"], gpu=raw["gpu"])
        log(f"mpicd bench: {s.repeats} launch(es) of the quick start on {s.ranks} ranks (part 4) ...")
        boot = startup(s, folder)
        parts, fractions, own = anatomy(folder, s)
        net = network(raw)
        compute = compute_per_round(folder, s)
        write = float(np.median(parts["codistill"]["write_min"]["values"]))  # the writing, not the wait
        info["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
        over = overhead(folder, raw, s)
        par = parallel(folder, raw, s)
        projected = projection(net, raw["models"], compute, write)
        written = None
        if s.write_ranks:
            from . import bench_write

            quickstart = ROOT / "configs" / "quickstart.yaml"
            written = bench_write.sweep(
                run_job, list(s.write_ranks), s.write_rounds, folder, s.timeout, quickstart, log
            )
        packed = None
        if s.clients_sweep:
            from . import bench_clients

            packed = {
                "holding": bench_clients.holding(s.config, s.overrides, 16),
                "sweep": bench_clients.sweep(
                    s.config, s.overrides, list(s.clients_sweep), s.clients_rounds, folder, s.timeout, log
                ),
            }
        a, b = net["pingpong"]["latency_seconds"], net["pingpong"]["bandwidth_bytes_per_second"]
        projected["check_at_measured_ranks"] = {  # the model has no waiting for slower ranks; the measurement has
            name: {
                "ranks": s.ranks,
                "modelled_comm_seconds": comm_model(name, s.ranks, raw["models"]["lenet"], a, b),
                "measured_comm_seconds": parts[name]["comm"]["median"],
            }
            for name in ALGORITHMS
        }
        return {
            "machine": info,
            "settings": {**asdict(s), "sizes": list(s.sizes)},
            "seconds": time.perf_counter() - started,
            "overhead": over,
            "overhead_ratio": over["overhead_ratio"],
            "anatomy": parts,
            "comm_io_fraction": fractions,
            "comm_io_own_fraction": own,
            "parallel": par,
            "speedup": par["speedup"],
            "ideal": par["ideal"],
            "startup_seconds": boot,
            "network": net,
            "projection": projected,
            **({"write_vs_ranks": written} if written else {}),
            **({"clients_per_rank": packed} if packed else {}),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(args) -> int:
    """``mpicd bench`` (see :func:`mpicd.cli.bench`): print the figures; --json / --plot write them."""
    from .config import ConfigError

    try:
        s = settings_for(args)
        result = bench(s, log=lambda line: print(line, flush=True))
    except ConfigError as err:
        print(f"mpicd: {err}", file=sys.stderr)
        return 2
    except BenchError as err:
        print(f"mpicd bench: {err}", file=sys.stderr)
        return 2 if str(err).startswith("--") else 1
    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1, allow_nan=False))
        print(f"json: {args.json}")
    if args.plot:
        print(f"plot: {args.plot}" if plot(result, args.plot) else "plot: skipped (matplotlib is not installed)")
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1]))
