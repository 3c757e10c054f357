"""What ``mpicd check`` prints of a plan besides its resolved config: per client the partition, the
minibatches of an epoch and the optimizer steps of the run.
"""

from __future__ import annotations


# Fewer optimizer steps per client than this in a whole run draw a warning. Measured by
# tools/steps_to_learn.py on the consortium study's 88 tuning runs (LeNet, Adam at lr 0.001, batch 32,
# PneumoniaMNIST and RetinaMNIST at skew 0.8): a run took a median 102 (PneumoniaMNIST) and 35
# (RetinaMNIST) steps to reach 80% of its final gain in validation balanced accuracy over chance,
# and 90% of runs got there within 174 and 77. Below 100 steps a run has most likely not finished
# learning when it ends, and a method that shares what the model learned (co-distillation) may have
# nothing to share yet.
FEW_STEPS = 100


def batch_layout(n: int, batch_size: int) -> str:
    """Minibatch sizes of one local epoch over ``n`` images, e.g. ``4x32 + 1x33``."""
    from mpicd.run.client import batch_bounds  # torch (seconds): not on `mpicd --help`'s path, which imports this

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
    cfg = plan.config
    sizes, steps = training_sizes(plan), steps_per_client(plan)
    header = ["client", "expertise"] + [f"train:{n}" for n in names] + [f"test:{n}" for n in names]
    header += ["batches/epoch", "optimizer steps"]
    rows = [
        [str(i), names[int(plan.partition.expertise[i])]]
        + [str(int(v)) for v in plan.partition.train_counts[i]]
        + [str(v) for v in test_counts]
        + [batch_layout(sizes[i], cfg.train.batch_size), f"{steps[i]:,d}"]
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


def training_sizes(plan) -> list[int]:
    """Each client's training images per epoch: its own, or every client's where the method trains on the union."""
    counts = plan.partition.train_counts
    union = plan.algorithm_cls.trains_on_union
    return [int(counts.sum() if union else counts[i].sum()) for i in range(plan.config.clients)]


def steps_per_client(plan) -> list[int]:
    """Each client's optimizer steps over the whole run (batches per epoch x local epochs x rounds)."""
    from mpicd.run.client import batch_bounds  # torch (seconds): not on `mpicd --help`'s path, which imports this

    cfg = plan.config
    return [
        len(batch_bounds(n, cfg.train.batch_size)) * cfg.train.local_epochs * cfg.rounds for n in training_sizes(plan)
    ]


def too_few_steps(plan) -> str | None:
    """A warning when some client takes fewer than FEW_STEPS optimizer steps in the whole run, for
    images (what FEW_STEPS was measured on; the built-in tabular data is learned in far fewer)."""
    if plan.dataset.kind != "image":
        return None
    steps = steps_per_client(plan)
    if min(steps) >= FEW_STEPS:
        return None
    cfg = plan.config
    return (
        f"client {steps.index(min(steps))} takes {min(steps)} optimizer steps in the whole run, fewer than "
        f"{FEW_STEPS}: in the consortium study's tuning runs a LeNet took a median 35 to 102 steps to reach "
        f"80% of what it learned, and 90% of runs up to 174, so this run will most likely end before its "
        f"model has learned; raise rounds (now {cfg.rounds}), train.local_epochs (now {cfg.train.local_epochs}) or "
        f"the images per client, or lower train.batch_size (now {cfg.train.batch_size})"
    )


def mlp_on_images(plan) -> str | None:
    """A warning when the tabular MLP is asked to learn images (a config copied from the quick start)."""
    if plan.dataset.kind != "image" or plan.config.model.name != "mlp":
        return None
    return (
        "model.name mlp flattens each image into one vector and ignores its 2-D structure: for images a "
        "CNN is the usual choice (model.name lenet, or auto; configs/imagefolder.yaml is a starting config)"
    )


def warnings(plan) -> list[str]:
    """Everything suspect but not wrong about a plan, one line each: ``mpicd check`` and ``mpicd run`` print them."""
    found = [*plan.dataset.warnings, too_few_steps(plan), mlp_on_images(plan)]
    return [line for line in found if line]


def data_lines(plan) -> list[str]:
    """The dataset as the run will see it: name, split sizes, input shape and what reading did."""
    d = plan.dataset
    shape = "x".join(str(n) for n in d.input_shape)
    sizes = f"{len(d.train.y)} train, {len(d.val.y)} validation, {len(d.test.y)} test"
    lines = [f"data: {d.name} ({plan.config.data.name}), {d.num_classes} classes, {sizes}; input {shape}"]
    if d.preprocessing:
        lines.append(f"images: {d.preprocessing}")
    return lines
