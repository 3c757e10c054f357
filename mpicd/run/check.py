"""What ``mpicd check`` prints of a plan besides its resolved config: per client the partition, the
minibatches of an epoch and the optimizer steps of the run.
"""

from __future__ import annotations


def batch_layout(n: int, batch_size: int) -> str:
    """Minibatch sizes of one local epoch over ``n`` images, e.g. ``4x32 + 1x33``."""
    from mpicd.run.client import batch_bounds

    sizes = [stop - start for start, stop in batch_bounds(n, batch_size)]
    runs: list[list[int]] = []
    for size in sizes:
        if runs and runs[-1][1] == size:
            runs[-1][0] += 1
        else:
            runs.append([1, size])
    return " + ".join(f"{count}x{size}" for count, size in runs) or "0"


def partition_table(plan) -> str:
    """Per client: expertise class, training images per class, held-out images per class, batches,
    and the optimizer steps of the whole run (a run of a few dozen steps cannot be expected to learn)."""
    names = plan.dataset.class_names
    test_counts = [int((plan.dataset.test.y == c).sum()) for c in range(plan.dataset.num_classes)]
    union = plan.algorithm_cls.trains_on_union
    from mpicd.run.client import batch_bounds

    cfg = plan.config
    header = ["client", "expertise"] + [f"train:{n}" for n in names] + [f"test:{n}" for n in names]
    header += ["batches/epoch", "optimizer steps"]
    sizes = [
        int(plan.partition.train_counts.sum() if union else plan.partition.train_counts[i].sum())
        for i in range(cfg.clients)
    ]
    rows = [
        [str(i), names[int(plan.partition.expertise[i])]]
        + [str(int(v)) for v in plan.partition.train_counts[i]]
        + [str(v) for v in test_counts]
        + [
            batch_layout(sizes[i], cfg.train.batch_size),
            f"{len(batch_bounds(sizes[i], cfg.train.batch_size)) * cfg.train.local_epochs * cfg.rounds:,d}",
        ]
        for i in range(cfg.clients)
    ]
    widths = [max(len(r[j]) for r in [header, *rows]) for j in range(len(header))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in [header, *rows]]
    if plan.dataset.label_map is not None:
        lines.append(f"labels mapped (data.label_map): {plan.dataset.label_map_text}")
    lines.append(f"held-out set: {plan.dataset.eval_split}; no client trains on it")
    if getattr(plan.dataset, "val_split", None):
        lines.append(f"validation set: {plan.dataset.val_split}; no client trains on it")
    lines.append("a trailing minibatch of one image is merged into the one before it")
    lines.append(
        f"optimizer steps: batches per epoch x {cfg.train.local_epochs} local epoch(s) x {cfg.rounds} rounds, "
        "for the whole run"
    )
    return "\n".join(lines)
