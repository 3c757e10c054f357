"""The bench's figures as the text ``mpicd bench`` prints."""

from __future__ import annotations

from mpicd.bench.clients import render as render_clients
from mpicd.bench.write import render as render_write


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
        lines += render_write(r["write_vs_ranks"])
    if "clients_per_rank" in r:
        lines.append(render_clients(r["clients_per_rank"]["holding"], r["clients_per_rank"]["sweep"]))
    return "\n".join(lines)
