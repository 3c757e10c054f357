"""The device path proven by one run: placement, determinism, throughput, and batched clients measured.

    bash jobs/gpu_check.sh               # on a node with GPUs (under five minutes)
    bash jobs/gpu_check.sh --cpu         # anywhere: the same checks on CPU, smaller (CI runs this)
    .venv/bin/python tools/gpu_check.py [--cpu] [--out FILE] [--config CONFIG]

Why: mpicd's device path (local rank -> GPU, CUDA_VISIBLE_DEVICES, the deterministic settings) is written
but had never run on a GPU; this is the first thing to run on a new node, and what it prints is the
evidence. It writes one Markdown table per check to --out (default results/gpu_check.md) and prints it:

1. placement: ``mpirun -n R`` ranks each report the device mpicd.mpi.placement gave them, under
   CUDA_VISIBLE_DEVICES unset, a subset listed in another order, and more ranks than GPUs (the ranks
   then share the visible GPUs round robin); each rank's GPU is identified by its UUID and checked
   against the entry of CUDA_VISIBLE_DEVICES its local rank should get (CUDA_DEVICE_ORDER=PCI_BUS_ID,
   so that CUDA's indices are nvidia-smi's). On CPU: ranks and threads.
2. determinism: the same ``mpicd run`` twice (2 ranks, 2 clients, the config's model and data); every
   /metrics dataset except timings compared bit for bit, and the statement of what is promised.
3. throughput: 1, 8 and 32 clients on one rank (clients in turn, ``clients_per_rank: balanced``), and
   one rank per GPU (per core with --cpu), 32 images per class per client: the median training round
   (round 1 warms up; only the last round evaluates), the client updates per second, and the peak
   device memory (torch.cuda.max_memory_allocated; on CPU the process's peak RSS).
4. a measurement, not a feature: K clients' local steps in turn against the same K models stepped as one
   batched computation (torch.func.stack_module_state + functional_call + vmap over grad), K = 8 and 32,
   plain SGD on LeNet with batches of 32 of the config's images; the two are checked to compute the same
   parameters (max |difference| after the steps), and the ratio is in-turn time / batched time (> 1:
   batching is faster).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DETERMINISM = (
    "Same config and seed -> the same results file bit for bit on the same GPU model, driver, CUDA, cuDNN and "
    "torch versions and the same ranks, with the settings mpicd makes (torch.use_deterministic_algorithms, "
    "warn-only; CUBLAS_WORKSPACE_CONFIG=:4096:8; cuDNN benchmark off); not across GPU models or library "
    "versions, and not for an operation with no deterministic kernel (torch then warns)."
)
DETERMINISM_CPU = (
    "Same config and seed -> the same results file bit for bit on the same CPU model and threads per rank; "
    "not across CPU models (another vector width changes float sums)."
)
TIMING = ("_seconds",)
IMAGES_PER_CLASS = 32  # per client, every throughput run: 32 clients of PneumoniaMNIST fit its 1,214 normal images
SAME_UPDATE = 1e-4  # float32: the batched kernels sum in another order, so the same update differs in last bits


def sh(command: list[str], env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run it from the project root; ``env``: changes to this environment (None: unset the variable)."""
    merged = {**os.environ, **(env or {})}
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={k: v for k, v in merged.items() if v is not None},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise SystemExit(f"gpu_check: {' '.join(command)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def mpi(ranks: int, program: list[str], env: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    from mpicd.mpi.launch import command

    return sh(command(ranks, [sys.executable, *program]), env, timeout)


# -- 1. placement ---------------------------------------------------------------------------------


def probe(device: str) -> None:
    """On every rank (under mpirun): the placement mpicd gives it; rank 0 prints them all as one JSON line."""
    from mpi4py import MPI

    from mpicd.mpi.placement import place, visible_gpus

    import torch

    where = place(MPI.COMM_WORLD, device)
    uuid = None
    if where.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(where.device))
        uuid = str(getattr(props, "uuid", "")) or None
    mine = {
        "rank": where.rank,
        "local_rank": where.local_rank,
        "device": where.device,
        "threads": where.threads,
        "uuid": uuid,
        "visible": visible_gpus(os.environ, torch.cuda.device_count() if device != "cpu" else 0),
    }
    every = MPI.COMM_WORLD.gather(mine)  # a tool's few small dicts: pickle is fine here
    if where.rank == 0:
        print(json.dumps(every))


def gpu_uuids() -> dict[str, str]:
    """nvidia-smi's index -> UUID (lower case, without 'GPU-'); empty without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return {}
    out = sh(["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"]).stdout
    return {
        i.strip(): u.strip().lower().removeprefix("gpu-") for i, u in (line.split(",") for line in out.splitlines())
    }


def placement_cases(gpus: int, cpu: bool) -> list[tuple[str, int, str | None]]:
    """(what, ranks, CUDA_VISIBLE_DEVICES or None for unset)."""
    if cpu:
        return [("one rank", 1, None), ("two ranks (cores split)", 2, None), ("CUDA_VISIBLE_DEVICES empty", 2, "")]
    cases = [("every GPU, one rank each", gpus, None)]
    if gpus >= 2:
        cases.append(("a subset in another order", 2, f"{gpus - 1},0"))
    else:
        cases.append(("CUDA_VISIBLE_DEVICES=0", 1, "0"))
    cases.append(("more ranks than GPUs", gpus + 1, None))
    return cases


def check_placement(cpu: bool, gpus: int) -> tuple[list[str], bool]:
    uuids = gpu_uuids()
    rows = ["| case | CUDA_VISIBLE_DEVICES | rank (local) | device | threads | GPU (nvidia-smi index) | as expected |"]
    rows.append("|---|---|---|---|---|---|---|")
    failures = 0
    for what, ranks, visible in placement_cases(gpus, cpu):
        # None: unset. PCI bus order, so that CUDA's indices are nvidia-smi's (CUDA's default, fastest
        # first, can differ on a node of mixed GPU models, and the check compares against nvidia-smi)
        env = {"CUDA_VISIBLE_DEVICES": visible, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        done = mpi(ranks, ["tools/gpu_check.py", "probe", "cpu" if cpu else "auto"], env)
        every = json.loads(done.stdout.strip().splitlines()[-1])
        for r in sorted(every, key=lambda r: r["rank"]):
            if cpu:
                want, ok, shown = "cpu", r["device"] == "cpu", "–"
            else:
                entries = r["visible"]
                want_entry = entries[r["local_rank"] % len(entries)]  # round robin over the visible GPUs
                physical = next(
                    (i for i, u in uuids.items() if r["uuid"] and r["uuid"].lower().endswith(u[-12:])), None
                )
                want = want_entry
                ok = r["device"] == f"cuda:{r['local_rank'] % len(entries)}" and (
                    physical is None or physical == want_entry or want_entry.lower().endswith(uuids.get(physical, "?"))
                )
                shown = physical if physical is not None else f"uuid {r['uuid']}"
            failures += not ok
            rows.append(
                f"| {what} | {'unset' if visible is None else repr(visible)} | {r['rank']} ({r['local_rank']}) | "
                f"{r['device']} | {r['threads']} | {shown} | {'yes' if ok else f'NO (expected {want})'} |"
            )
    if failures:
        rows.append(f"\n**{failures} rank(s) not placed as expected.**")
    return rows, not failures


# -- 2. determinism -------------------------------------------------------------------------------


def check_determinism(config: str, device: str, rounds: int, scratch: Path) -> tuple[list[str], bool]:
    from mpicd.results.reader import Results

    files = []
    for attempt in ("a", "b"):
        out = scratch / f"repeat-{attempt}.h5"
        overrides = [f"rounds={rounds}", "clients=2", f"device={device}", "checkpoint.every=0"]
        mpi(2, ["-m", "mpicd", "run", config, *overrides, "--out", str(out), "--overwrite"], timeout=400)
        files.append(Results(out))
    a, b = files
    differ = differing(a, b)
    same = not differ
    rows = [
        "| run twice (2 ranks, 2 clients) | rounds | /metrics datasets compared | bit for bit |",
        "|---|---:|---:|---|",
        f"| {config} on {device} | {rounds} | {sum(not n.endswith(TIMING) for n in a.metrics)} | "
        f"{'yes' if same else 'NO: ' + ', '.join(differ[:5])} |",
        "",
        DETERMINISM_CPU if device == "cpu" else DETERMINISM,
    ]
    return rows, same


def differing(a, b) -> list[str]:
    """The /metrics datasets (timings aside) and byte counts in which two results files differ at all."""
    import numpy as np

    names = sorted(set(a.metrics) | set(b.metrics))
    out = [
        n
        for n in names
        if not n.endswith(TIMING)
        and (n not in a.metrics or n not in b.metrics or not np.array_equal(a.metrics[n], b.metrics[n], equal_nan=True))
    ]
    for kind in ("bytes_sent_by_kind", "bytes_recv_by_kind"):
        if not np.array_equal(getattr(a, kind), getattr(b, kind)):
            out.append(kind)
    return out


# -- 3. throughput --------------------------------------------------------------------------------


def throughput(config: str, clients: int, device: str, rounds: int, out: str) -> None:
    """In this process (one rank, MPI as a singleton): ``mpicd run`` with the clients in turn; prints JSON."""
    import argparse as ap

    import torch

    from mpicd.run.runner import run

    overrides = [f"rounds={rounds}", f"clients={clients}", "clients_per_rank=balanced", f"device={device}"]
    overrides += ["checkpoint.every=0", f"data.images_per_class={IMAGES_PER_CLASS}", f"eval.every={rounds}"]
    args = ap.Namespace(config=config, overrides=overrides, out=out, resume=False, overwrite=True)
    if device != "cpu":
        torch.cuda.reset_peak_memory_stats()
    code = run(args)
    peak = (
        torch.cuda.max_memory_allocated()
        if device != "cpu"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    print(json.dumps({"code": code, "peak_bytes": peak}))


def round_seconds(path: Path) -> float:
    """Median over rounds 2 to the last but one (round 1 warms up; only the last evaluates, eval.every) of
    the round's training time: per rank, its clients' compute + comm seconds summed (they run in turn),
    then the slowest rank."""
    import numpy as np

    from mpicd.results.reader import Results

    res = Results(path)
    per_client = res.metrics["compute_seconds"] + res.metrics["comm_seconds"]  # (round, client)
    ranks = np.asarray(res.attrs["client_rank"])
    per_rank = np.stack([per_client[:, ranks == r].sum(axis=1) for r in np.unique(ranks)], axis=1)
    return float(statistics.median(per_rank.max(axis=1)[1:-1]))


def check_throughput(config: str, device: str, rounds: int, scratch: Path, per_device: int) -> tuple[list[str], bool]:
    rows = [
        "| layout | clients | ranks | training round (s, median) | client updates / s | peak memory (MiB) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    memory = "device" if device != "cpu" else "RSS"
    for clients in (1, 8, 32):
        out = scratch / f"throughput-{clients}.h5"
        done = sh(
            [sys.executable, "tools/gpu_check.py", "throughput", config, str(clients), device, str(rounds), str(out)],
            timeout=400,
        )
        info = json.loads(done.stdout.strip().splitlines()[-1])
        if info["code"] != 0:
            raise SystemExit(
                f"gpu_check: the {clients}-client run ended with {info['code']}:\n{done.stdout}\n{done.stderr}"
            )
        seconds = round_seconds(out)
        rows.append(
            f"| clients in turn on one rank | {clients} | 1 | {seconds:.3f} | {clients / seconds:.1f} | "
            f"{info['peak_bytes'] / 2**20:.0f} ({memory}) |"
        )
    out = scratch / "throughput-per-device.h5"
    overrides = [f"rounds={rounds}", f"clients={per_device}", f"device={device}", "checkpoint.every=0"]
    overrides += [f"data.images_per_class={IMAGES_PER_CLASS}", f"eval.every={rounds}"]
    mpi(per_device, ["-m", "mpicd", "run", config, *overrides, "--out", str(out), "--overwrite"], timeout=400)
    seconds = round_seconds(out)
    what = "one rank per GPU" if device != "cpu" else "one rank per core"
    rows.append(f"| {what} | {per_device} | {per_device} | {seconds:.3f} | {per_device / seconds:.1f} | – |")
    return rows, True


# -- 4. batched clients ---------------------------------------------------------------------------


LR = 0.01  # plain SGD in both forms


def images_for(config: str, k: int):
    """32 k training images (N, H, W, C) float32 in [0, 1] and their labels from the config's file; a
    config without an image file (the tabular quick start) gets random images of MedMNIST's shape."""
    import numpy as np

    from mpicd.config.loading import load_config

    data = load_config(config, []).data
    path = Path(data.path) if getattr(data, "path", None) else None
    if path is not None and not path.is_absolute():
        path = (ROOT / path).resolve()
    if path is not None and path.is_file():
        with np.load(path) as f:
            images = f["train_images"][: 32 * k].astype(np.float32) / 255.0
            labels = f["train_labels"][: 32 * k].reshape(-1).astype(np.int64) % 2
    else:
        images, labels = np.random.default_rng(0).random((32 * k, 28, 28), dtype=np.float32), np.zeros(32 * k, np.int64)
    return (images[..., None] if images.ndim == 3 else images), labels


def in_turn_against_batched(k: int, images, labels, device: str, steps: int) -> tuple[float, float, float]:
    """(ms per step in turn, ms per step batched, max |parameter difference| after the same steps)."""
    import torch
    from torch.func import functional_call, grad, stack_module_state, vmap

    from mpicd.models.networks import lenet

    torch.manual_seed(0)
    channels = images.shape[-1]
    x = torch.from_numpy(images).permute(0, 3, 1, 2).reshape(k, 32, channels, *images.shape[1:3]).to(device)
    y = torch.from_numpy(labels).reshape(k, 32).to(device)
    models = [lenet(channels, 200, 2).to(device) for _ in range(k)]
    params, buffers = stack_module_state(models)  # copies: the K models and the stack start equal
    base = lenet(channels, 200, 2).to("meta")

    def loss(p, b, xi, yi):
        return torch.nn.functional.cross_entropy(functional_call(base, (p, b), (xi,)), yi)

    step = vmap(grad(loss), in_dims=(0, 0, 0, 0))

    def in_turn():
        for i, m in enumerate(models):
            m.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(m(x[i]), y[i]).backward()
            with torch.no_grad():
                for q in m.parameters():
                    q -= LR * q.grad

    def batched():
        g = step(params, buffers, x, y)
        with torch.no_grad():
            for name in params:
                params[name] -= LR * g[name]

    timings = []
    for fn in (in_turn, batched):
        fn()  # warm-up (and one update each, so the two stay in step)
        sync(device)
        began = time.perf_counter()
        for _ in range(steps):
            fn()
        sync(device)
        timings.append((time.perf_counter() - began) / steps * 1000)
    diff = max(
        float((params[n] - torch.stack([dict(m.named_parameters())[n] for m in models])).abs().max().detach())
        for n in params
    )
    return timings[0], timings[1], diff


def check_batched(config: str, device: str, steps: int) -> tuple[list[str], bool]:
    rows = [
        "| K clients | in turn (ms / step) | batched, vmap (ms / step) | in turn / batched | max abs difference |",
        "|---:|---:|---:|---:|---:|",
    ]
    same = True
    for k in (8, 32):
        turn, batch, diff = in_turn_against_batched(k, *images_for(config, k), device, steps)
        rows.append(f"| {k} | {turn:.2f} | {batch:.2f} | {turn / batch:.2f}x | {diff:.1e} |")
        same &= diff < SAME_UPDATE
    if not same:
        rows.append(f"\n**The batched updates differ from the in-turn ones by more than {SAME_UPDATE}.**")
    return rows, same


def sync(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


# -- the report -----------------------------------------------------------------------------------


def machine(device: str) -> list[str]:
    import torch

    lines = [
        f"- host {platform.node()}, {os.cpu_count()} cores, Python {platform.python_version()}, torch {torch.__version__}"
    ]
    if device != "cpu":
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        lines.append(f"- CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}, GPUs: {', '.join(names)}")
    else:
        lines.append("- device: CPU (--cpu)")
    return lines


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        probe(argv[1])
        return 0
    if argv[:1] == ["throughput"]:
        throughput(argv[1], int(argv[2]), argv[3], int(argv[4]), argv[5])
        return 0
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="every check on CPU, smaller (CI)")
    p.add_argument("--out", default="results/gpu_check.md", help="the report (Markdown)")
    p.add_argument("--config", default="configs/pneumoniamnist.yaml", help="the model and data the runs use")
    args = p.parse_args(argv)
    import torch

    gpus = 0 if args.cpu else torch.cuda.device_count()
    if not args.cpu and gpus == 0:
        print(
            "gpu_check: no GPU visible to torch (CUDA_VISIBLE_DEVICES, drivers?); --cpu runs the checks on CPU",
            file=sys.stderr,
        )
        return 2
    device = "cpu" if args.cpu else "cuda"
    rounds, steps = (4, 5) if args.cpu else (8, 50)
    per_device = min(2, os.cpu_count() or 1) if args.cpu else gpus
    began = time.perf_counter()
    report = ["# mpicd device check", "", *machine(device), ""]
    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        scratch = Path(tmp)
        sections = [
            ("1. Placement", lambda: check_placement(args.cpu, gpus)),
            ("2. Determinism", lambda: check_determinism(args.config, device, rounds, scratch)),
            ("3. Throughput", lambda: check_throughput(args.config, device, rounds, scratch, per_device)),
            (
                "4. Clients in turn against one batched computation (a measurement)",
                lambda: check_batched(args.config, device, steps),
            ),
        ]
        failed = []
        for title, section in sections:
            t0 = time.perf_counter()
            rows, ok = section()
            failed += [] if ok else [title]
            report += [f"## {title}", "", *rows, "", f"({time.perf_counter() - t0:.0f} s)", ""]
            print("\n".join(report[-len(rows) - 5 :]), flush=True)
    verdict = "every check passed" if not failed else "FAILED: " + "; ".join(failed)
    report.append(f"Whole check: {time.perf_counter() - began:.0f} s, {verdict}.")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(report) + "\n")
    print(f"{report[-1]} Written: {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
