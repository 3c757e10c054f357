"""What a peer learns from what each method shares, with privacy off and on: the audit.

    .venv/bin/python tools/privacy_audit.py [--data ../shared/data/pneumoniamnist.npz] [--trials 2000]
        [--members 100] [--attack-members 10 100] [--epsilons 1 4 16] [--train-epochs 1] [--seed 0]
        [--tables releases canary attack methods] [--method-trials 200] [--fedavg-rounds 100] [--json out.json]
        [--release-trials 10000] [--repeats 100] [--composition-repeats 30] [--write-docs]

0. ``releases`` (the audit table of docs/explanation/privacy.md; ``--write-docs`` puts it there): every private release
   through the code a run calls (mpicd.bench.release_audit: co-distillation's R with noised counts, the
   default, and its logit reading; FedProto's and FedDistill's payloads; FedAvg's/FedAMP's DP-SGD
   epoch), each at the sigma a run of --config resolves for a claimed epsilon of --release-epsilon
   per release (DP-SGD: one local epoch of 4 steps at q = 1/4 costs it); the composition of --rounds
   co-distillation releases at --rounds-epsilon; and the positive controls at half the claimed
   sigma, the default's and the composition's audited --repeats / --composition-repeats times
   (independent seeds) to measure how often they are flagged. --release-trials trials per
   neighbour; the claim tested against the accountant's whole privacy profile
   (mpicd.privacy.tradeoff). Full defaults: about an hour on this 2-core machine.

Features: the project's LeNet (mpicd.models.networks, initialised from seeds.INIT, trained --train-epochs
epochs of plain SGD on the training split) on real PneumoniaMNIST images read by the project's
loader. The teacher's expertise set is --members images of class 0 (normal, the minority class).

1. Canary audit of one release of R (mpicd.privacy.release.sampled_private_mean, clip C = --clip):
   --trials releases on D and on D + canary each, the canary being the held-out test image least
   aligned with the class's mean feature; the Clopper-Pearson (95%) lower bound on epsilon
   (mpicd.privacy.audit) against the accountant's epsilon for that release, for q = 1 and
   q = 0.5 (Poisson sampling), D = the real set and D = empty (the worst case), noise off
   (positive control: the bound must be large) and sigma calibrated to each --epsilons.
2. Membership inference by a peer on R: AUC and TPR at 1% FPR, privacy off (today's exact mean
   of all the set's features) and on (each epsilon, q = 1 and 0.5).

3. Membership inference per method (``methods``), from what a peer receives, privacy off and at
   each epsilon: the client is client 0 of --config's partition (--clients, --images-per-class,
   --skew: 150 normal + 30 pneumonia images at the defaults), its images drawn from the pool of
   LeNet vectors per trial (mpicd.privacy.audit.class_mean_attack, --method-trials trials,
   --reference images of each class held by the peer):
   co-distillation's R of its expertise class (share: features and share: logits;
   mpicd.privacy.release.sampled_private_mean, public denominator q n), FedProto's prototypes and
   FedDistill's mean logits (one client's payload [sums ; counts] of release.private_class_sums,
   counts noised; the peer divides), all at q = --sample-rate and sigma such that ONE release
   costs epsilon; and FedAvg's averaged model after --fedavg-rounds rounds of a real run
   (mpiexec -n --clients tools/final_models.py: `mpicd run` of --config with algorithm=fedavg,
   privacy off or DP-SGD at the sigma whose steps over the WHOLE RUN cost epsilon), attacked by
   the loss threshold (mpicd.privacy.audit.loss_attack): members = every client's training
   images, non-members = as many unused training-split images of each class.

Prints markdown tables (and writes them as JSON with --json). One release = one round; the
epsilons of tables 1, 2 and of the statistics in 3 are per release (over T rounds the same sigma
costs more: mpicd.privacy.accountant); FedAvg's is per run (every DP-SGD step of the run).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpicd.config.loading import load_config  # noqa: E402
from mpicd.config.sections import DataConfig  # noqa: E402
from mpicd.core import seeds  # noqa: E402
from mpicd.data import load_dataset  # noqa: E402
from mpicd.mpi import launch  # noqa: E402
from mpicd.privacy import accountant, audit  # noqa: E402
from mpicd.privacy.clip import clip_rows  # noqa: E402
from mpicd.privacy.gaussian import release_multiplier  # noqa: E402
from mpicd.privacy.streams import ATTACK  # noqa: E402

TABLES = ("releases", "canary", "attack", "methods")
DOCS_BEGIN, DOCS_END = "<!-- release audit: begin -->", "<!-- release audit: end -->"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "pneumoniamnist.npz"))
    parser.add_argument("--trials", type=int, default=2000, help="releases per neighbouring dataset")
    parser.add_argument("--members", type=int, default=100, help="images in the teacher's expertise set")
    parser.add_argument("--attack-trials", type=int, default=50)
    parser.add_argument("--attack-members", type=int, nargs="+", default=[10, 100], help="sizes m of the attacked set")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--train-epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tables", nargs="+", choices=TABLES, default=list(TABLES), help="which tables to print")
    parser.add_argument("--config", default=str(ROOT / "configs" / "pneumoniamnist.yaml"), help="methods: the run")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--images-per-class", type=int, default=150)
    parser.add_argument("--skew", type=float, default=0.8)
    parser.add_argument("--sample-rate", type=float, default=1.0, help="methods: q of the statistics' releases")
    parser.add_argument("--method-trials", type=int, default=200, help="methods: draws per statistics release")
    parser.add_argument("--reference", type=int, default=300, help="methods: the peer's images of each class")
    parser.add_argument("--fedavg-rounds", type=int, default=100, help="methods: FedAvg run length (the study's)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--release-trials", type=int, default=10000, help="releases: trials per neighbour")
    parser.add_argument("--release-epsilon", type=float, default=2.0, help="releases: claimed epsilon of one release")
    parser.add_argument("--rounds", type=int, default=10, help="releases: the composition's releases (rounds)")
    parser.add_argument("--rounds-epsilon", type=float, default=4.0, help="releases: the composition's claimed epsilon")
    parser.add_argument("--repeats", type=int, default=100, help="releases: audits of the half-sigma control")
    parser.add_argument("--composition-repeats", type=int, default=30, help="releases: audits of its control")
    parser.add_argument(
        "--write-docs", action="store_true", help="releases: put the table in docs/explanation/privacy.md"
    )
    args = parser.parse_args(argv)
    start = time.time()

    ds = load_dataset(DataConfig(name="medmnist", path=args.data))
    # one LeNet, trained on the training split only, featurises the training and the test images
    everything, logits = audit.lenet_outputs(
        np.concatenate([ds.train.x, ds.test.x]), seed=args.seed, feature_dim=200, num_classes=ds.num_classes,
        fit=(ds.train.x, ds.train.y), train_epochs=args.train_epochs,
    )  # fmt: skip
    train_features, test_features = everything[: len(ds.train.x)], everything[len(ds.train.x) :]
    pool = train_features[ds.train.y == 0]
    print(f"features: {len(pool)} class-0 training images, D = {pool.shape[1]}, trained {args.train_epochs} epoch(s)")

    sigmas = {
        (q, eps): accountant.noise_multiplier(eps, args.delta, q, 1, tol=1e-2)
        for q in sorted({1.0, 0.5, args.sample_rate}, reverse=True)
        for eps in args.epsilons
    }
    results = {"args": vars(args)}
    if "releases" in args.tables:
        results["releases"] = releases_table(
            args, ds, train_features, logits[: len(ds.train.x)], test_features, logits[len(ds.train.x) :]
        )
    if "canary" in args.tables:
        results["audit"] = canary_table(args, pool, test_features, sigmas)
    if "attack" in args.tables:
        results["attack"] = attack_table(args, pool, sigmas)
    if "methods" in args.tables:
        train_logits = logits[: len(ds.train.x)]
        results["methods"] = methods_table(args, ds, train_features, train_logits, sigmas)
    print(f"\n({time.time() - start:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps(results, default=str))
    return 0


def release_settings(args, epsilon: float, rounds: int):
    """The privacy settings a run of --config resolves for ``privacy: {epsilon: epsilon}`` over
    ``rounds`` rounds (mpicd.privacy.budget.settings: sigma derived, counts noised, secret noise)."""
    from mpicd.privacy.budget import settings

    cfg = load_config(args.config, [f"rounds={rounds}", "privacy=" + json.dumps(
        {"epsilon": epsilon, "delta": args.delta, "clip": args.clip})])  # fmt: skip
    return settings(cfg.privacy, rounds)


def releases_table(args, ds, features, logits, test_features, test_logits) -> list[dict]:
    """Table 0: the canary audit of every private release through the run's code
    (mpicd.bench.release_audit, mpicd.privacy.tradeoff), its composition and the half-sigma controls."""
    from dataclasses import replace

    from mpicd.bench import release_audit
    from mpicd.privacy import dpsgd, tradeoff

    index = np.concatenate([np.flatnonzero(ds.train.y == c)[: args.members] for c in range(ds.num_classes)])
    labels = ds.train.y[index]
    one = release_settings(args, args.release_epsilon, 1)
    many = release_settings(args, args.rounds_epsilon, args.rounds)
    n = 4 * 32 - 1  # DP-SGD: D of 127 images and the canary's slot, batches of 32: q = 1/4, 4 steps
    q, steps = dpsgd.schedule(n + 1, 32)
    dp = replace(
        one, sigma=accountant.noise_multiplier(args.release_epsilon, args.delta, q, steps), noised_counts=False
    )
    pick = np.flatnonzero(np.isin(np.arange(len(ds.train.y)), index, invert=True))[:n]

    def scores(kind, settings, trials, rounds=1, seed=args.seed, scale=1.0):
        if kind == "dpsgd":
            return release_audit.dpsgd_scores(ds.train.x[pick], ds.train.y[pick], settings=settings, batch_size=32,
                                              trials=trials, seed=seed, noise_scale=scale)  # fmt: skip
        reads_logits = kind in ("codistill-logits", "feddistill")
        vectors, toward = (logits, test_logits[0]) if reads_logits else (features, test_features[0])
        return release_audit.representation_scores(
            kind, vectors[index], labels, canary_class=0, towards=toward, settings=settings, trials=trials,
            rounds=rounds, seed=seed, noise_scale=scale,
        )  # fmt: skip

    plan = [(kind, kind, one, 1, 1.0, 0) for kind in release_audit.KINDS if kind != "dpsgd"]
    plan += [("dpsgd", "dpsgd", dp, 1, 1.0, 0)]
    plan += [("composition", "codistill", many, args.rounds, 1.0, 0)]
    plan += [("control: half sigma", "codistill", one, 1, 0.5, args.repeats)]
    plan += [("control: composition at half sigma", "codistill", many, args.rounds, 0.5, args.composition_repeats)]
    plan += [("control: DP-SGD at half sigma", "dpsgd", dp, 1, 0.5, 0)]
    rows = []
    for label, kind, settings, rounds, scale, repeats in plan:
        began = time.time()
        first = scores(kind, settings, args.release_trials, rounds, scale=scale)
        result = release_audit.audit(first, args.delta)
        region, flagged = tradeoff.Region(first.claim), [result.verdict.flagged]
        for r in range(1, repeats):  # the control's power: independent audits, seeds args.seed + r
            again = scores(kind, settings, args.release_trials, rounds, seed=args.seed + r, scale=scale)
            flagged.append(release_audit.audit(again, args.delta, family=False, region=region).verdict.flagged)
            print(f"  {label}: audit {r + 1} of {repeats}, {sum(flagged)} flagged, {time.time() - began:.0f} s",
                  file=sys.stderr, flush=True)  # fmt: skip
        v = result.verdict
        power = audit.clopper_pearson(sum(flagged), len(flagged)) if repeats else None
        rows.append(dict(
            row=label, kind=kind, description=release_audit.DESCRIPTIONS[kind], rounds=rounds, scale=scale,
            claim=[list(entry) for entry in first.claim], accounted=result.accounted, trials=args.release_trials,
            tpr=v.tpr, fpr=v.fpr, tpr_lower=v.tpr_lower, fpr_upper=v.fpr_upper, allowed_tpr=v.allowed_tpr,
            flagged=v.flagged, family=result.family, repeats=len(flagged), flagged_count=int(sum(flagged)),
            power=power, seconds=time.time() - began,
        ))  # fmt: skip
        print(
            f"{label}: flagged {v.flagged}, family eps {result.family:.2f}, accounted {result.accounted:.2f}, "
            f"{sum(flagged)} of {len(flagged)} flagged, {time.time() - began:.0f} s",
            file=sys.stderr,
            flush=True,
        )
    text = release_markdown(args, rows)
    print("\n" + text)
    if args.write_docs:
        page = ROOT / "docs" / "explanation" / "privacy.md"
        head, rest = page.read_text().split(DOCS_BEGIN, 1)
        _, tail = rest.split(DOCS_END, 1)
        page.write_text(f"{head}{DOCS_BEGIN}\n{text}\n{DOCS_END}{tail}")
    return rows


def release_markdown(args, rows: list[dict]) -> str:
    """The privacy page's audit table (``--write-docs`` puts it between the markers)."""
    lines = [
        f"Command: `.venv/bin/python tools/privacy_audit.py --tables releases --write-docs` (seed {args.seed}, "
        f"{args.release_trials} trials per neighbour, the threshold from the first half, the rates from the "
        f"second; C = {args.clip}, delta = {args.delta}; {sum(r['seconds'] for r in rows):.0f} s on this machine).",
        "",
        "| release | releases per trial | noise | claim (q, multiplier, count) | accounted eps | TPR / FPR "
        "| TPR lower bound / the claim's largest TPR at the FPR upper bound | flagged | eps of the least noise "
        "refuted | flagged in repeated audits (95% CI) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        claim = "; ".join(f"({q:g}, {m:.3f}, {c})" for q, m, c in r["claim"])
        power = "" if not r["power"] else (
            f"{r['flagged_count']} of {r['repeats']}: {r['flagged_count'] / r['repeats']:.2f} "
            f"[{r['power'][0]:.3f}, {r['power'][1]:.3f}]")  # fmt: skip
        noise = "as claimed" if r["scale"] == 1.0 else f"{r['scale']:g} x the claimed sigma"
        lines.append(
            f"| {r['row']}: {r['description']} | {r['rounds']} | {noise} | {claim} | {r['accounted']:.2f} "
            f"| {r['tpr']:.3f} / {r['fpr']:.3f} | {r['tpr_lower']:.3f} / {r['allowed_tpr']:.3f} "
            f"| {'**yes**' if r['flagged'] else 'no'} | {r['family']:.2f} | {power} |"
        )
    return "\n".join(lines)


def canary_table(args, pool: np.ndarray, test_features: np.ndarray, sigmas: dict) -> list[dict]:
    """Table 1: the canary audit of one release of R (see the module docstring)."""
    rows = pool[: args.members]
    mean_direction = clip_rows(pool, args.clip).mean(axis=0)
    held_out = clip_rows(test_features, args.clip)
    cosine = held_out @ mean_direction / (np.linalg.norm(held_out, axis=1) * np.linalg.norm(mean_direction))
    canary = test_features[int(np.argmin(cosine))]
    audit_rows = []
    for q in (1.0, 0.5):
        for name, data in (("real", rows), ("empty", rows[:0])):
            for sigma in [0.0] + [sigmas[q, eps] for eps in args.epsilons]:
                bound = audit.canary_audit(
                    data, canary, q=q, clip=args.clip, sigma=sigma, trials=args.trials, seed=args.seed,
                    delta=args.delta, denominator=q * args.members,
                )  # fmt: skip
                accounted = accountant.epsilon(q, sigma, 1, args.delta) if sigma else float("inf")
                audit_rows.append(dict(q=q, D=name, sigma=sigma, accounted=accounted, empirical=bound.epsilon,
                                       tpr=bound.tpr, fpr=bound.fpr, trials=bound.trials))  # fmt: skip
    print(f"\nCanary audit of one release of R (|D| = {args.members} or empty, C = {args.clip}, delta = {args.delta}, "
          f"{args.trials} releases per neighbour, bound on the second half, 95% Clopper-Pearson):\n")  # fmt: skip
    table(
        ["q", "D", "sigma", "accounted eps", "empirical eps (lower bound)", "TPR", "FPR"],
        [[f"{r['q']:g}", r["D"], *(f"{r[k]:.3f}" for k in ("sigma", "accounted", "empirical", "tpr", "fpr"))]
         for r in audit_rows],
    )  # fmt: skip
    return audit_rows


def attack_table(args, pool: np.ndarray, sigmas: dict) -> list[dict]:
    """Table 2: the membership attack on one R of m class-0 images (mpicd.privacy.audit.membership_attack)."""
    attack_rows = []
    for m in args.attack_members:
        off = audit.membership_attack(
            pool, members=m, reference=300, trials=args.attack_trials, seed=args.seed, private=False
        )
        attack_rows.append(dict(members=m, privacy="off", q=1.0, sigma=0.0, accounted=float("inf"), **vars_of(off)))
        for q, eps in [(q, eps) for q in (1.0, 0.5) for eps in args.epsilons]:
            sigma = sigmas[q, eps]
            on = audit.membership_attack(
                pool, members=m, reference=300, trials=args.attack_trials, seed=args.seed,
                private=True, q=q, clip=args.clip, sigma=sigma,
            )  # fmt: skip
            accounted = accountant.epsilon(q, sigma, 1, args.delta)
            attack_rows.append(dict(members=m, privacy="on", q=q, sigma=sigma, accounted=accounted, **vars_of(on)))
    print(f"\nMembership inference on R by a peer (m members, as many non-members, 300 reference "
          f"images, {args.attack_trials} trials):\n")  # fmt: skip
    table(
        ["m", "privacy", "q", "sigma", "accounted eps (one release)", "AUC", "TPR at 1% FPR"],
        [[str(r["members"]), r["privacy"], f"{r['q']:g}",
          *(f"{r[k]:.3f}" for k in ("sigma", "accounted", "auc", "tpr_at_1pct_fpr"))] for r in attack_rows],
    )  # fmt: skip
    return attack_rows


def run_overrides(args) -> list[str]:
    """The FedAvg run of table 3: --config with the audit's data, clients, rounds and seed."""
    return [
        f"data.path={args.data}", f"data.images_per_class={args.images_per_class}", f"data.skew={args.skew}",
        f"clients={args.clients}", f"rounds={args.fedavg_rounds}", f"seed={args.seed}", "algorithm=fedavg",
    ]  # fmt: skip


def methods_table(args, ds, features: np.ndarray, logits: np.ndarray, sigmas: dict) -> list[dict]:
    """Table 3: membership inference per method, from what a peer receives (module docstring, 3)."""
    from mpicd.run.plan import prepare

    plan = prepare(load_config(args.config, run_overrides(args)))
    if not np.array_equal(plan.dataset.train.y, ds.train.y):
        raise RuntimeError(f"{args.config} reads another training split than --data {args.data}")
    counts, expertise = plan.partition.train_counts[0], int(plan.partition.expertise[0])
    labels, num_classes, q = ds.train.y, ds.num_classes, args.sample_rate
    expert_only = [m if c == expertise else 0 for c, m in enumerate(counts)]
    statistics = [  # (method, what a peer receives, vectors, members per class, view of a Release)
        ("codistill (share: features)", "R: mean feature of the expertise class", features, expert_only,
         lambda r: audit.codistill_view(r, num_classes, expertise)),
        ("codistill (share: logits)", "R: mean logits of the expertise class", logits, expert_only,
         lambda r: audit.codistill_view(r, num_classes, expertise)),
        ("FedProto", "per-class sums / counts of features", features, list(counts),
         lambda r: audit.class_means_view(r, num_classes)),
        ("FedDistill", "per-class sums / counts of logits", logits, list(counts),
         lambda r: audit.class_means_view(r, num_classes)),
    ]  # fmt: skip
    method_rows = []
    for method, shared, vectors, members, make_view in statistics:
        noised = method.startswith("Fed")  # FedProto/FedDistill: counts noised (the default); R: public q n
        for eps in [math.inf, *args.epsilons]:
            if eps == math.inf:
                release, sigma, accounted = audit.Release(), 0.0, math.inf
            else:  # the sigma whose release multiplier costs eps in one release
                sigma = sigmas[q, eps] * (math.sqrt(2.0) if noised else 1.0)
                release = audit.Release(sigma=sigma, q=q, clip=args.clip, noised_counts=noised)
                accounted = accountant.epsilon(q, release_multiplier(sigma, noised), 1, args.delta)
            result = audit.class_mean_attack(
                vectors, labels, members=members, reference=args.reference, trials=args.method_trials,
                seed=args.seed, view=make_view(release), clip=args.clip if release.private else None,
            )  # fmt: skip
            method_rows.append(dict(method=method, shared=shared, target=eps, sigma=sigma, accounted=accounted,
                                    per="one release", **vars_of(result)))  # fmt: skip
    method_rows += fedavg_rows(args, plan)
    print(f"\nMembership inference per method by a peer, from what it receives (client 0 of {args.clients}: "
          f"{', '.join(f'{m} of class {c}' for c, m in enumerate(counts))}; statistics: "
          f"{args.method_trials} draws, {args.reference} reference images per class, q = {q:g}, C = {args.clip}; "
          f"FedAvg: {args.fedavg_rounds} rounds, loss threshold; delta = {args.delta}):\n")  # fmt: skip
    table(
        ["method", "a peer receives", "privacy", "sigma", "accounted eps", "eps is per", "AUC", "TPR at 1% FPR"],
        [[r["method"], r["shared"], "off" if r["target"] == math.inf else f"eps = {r['target']:g}",
          f"{r['sigma']:.3f}", f"{r['accounted']:.3f}", r["per"], f"{r['auc']:.3f}", f"{r['tpr_at_1pct_fpr']:.3f}"]
         for r in method_rows],
    )  # fmt: skip
    return method_rows


def table(columns: list[str], rows: list[list[str]]) -> None:
    """One markdown table on stdout."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def fedavg_rows(args, plan) -> list[dict]:
    """FedAvg's averaged model, off and with DP-SGD at each epsilon over the whole run, attacked by the
    loss threshold; every run is ``mpiexec -n --clients tools/final_models.py`` (real mpicd training)."""
    import h5py
    import torch

    from mpicd.models.networks import build_model

    cfg, ds, partition = plan.config, plan.dataset, plan.partition
    sizes = [len(index) for index in partition.train_indices]
    batches = math.ceil(max(sizes) / cfg.train.batch_size)  # DP-SGD: q = 1 / batches, one step per batch
    steps = args.fedavg_rounds * cfg.train.local_epochs * batches
    members = np.concatenate(partition.train_indices)
    unused = np.setdiff1d(np.arange(len(ds.train.y)), members)
    pick = seeds.rng(args.seed, seeds.PRIVACY, 0, 1, ATTACK)  # b = 1: not a trial's stream (t, 0)
    non_members = np.concatenate([
        pick.permutation(unused[ds.train.y[unused] == c])[: int((ds.train.y[members] == c).sum())]
        for c in range(ds.num_classes)
    ])  # fmt: skip
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    rows = []
    for eps in [math.inf, *args.epsilons]:
        privacy, sigma = [], 0.0
        if eps != math.inf:
            sigma = accountant.noise_multiplier(eps, args.delta, 1.0 / batches, steps, tol=1e-2)
            privacy = [f"privacy={{noise_multiplier: {sigma!r}, clip: {args.clip!r}, delta: {args.delta!r}}}"]
        with tempfile.TemporaryDirectory(prefix="mpicd-audit-") as folder:
            command = launch.command(args.clients, [
                sys.executable, str(ROOT / "tools" / "final_models.py"), folder, args.config, *run_overrides(args),
                *privacy,
            ], launcher="mpirun")  # fmt: skip
            began = time.time()
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(
                    f"the FedAvg run failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-4000:]}"
                )
            states = [torch.load(Path(folder) / f"model_client{i}.pt", weights_only=True) for i in range(args.clients)]
            with h5py.File(Path(folder) / "run.h5", "r") as results:
                accounted = float(results["metrics/epsilon"][-1].max()) if privacy else math.inf
        if any(any(not torch.equal(s[k], states[0][k]) for k in s) for s in states[1:]):
            raise RuntimeError("FedAvg's clients end the run with different models")
        model = build_model(cfg.model.name, ds.input_shape, ds.num_classes, cfg.model.feature_dim, cfg.model.hidden)
        model.load_state_dict(states[0])
        result = audit.loss_attack(
            model, (ds.train.x[members], ds.train.y[members]), (ds.train.x[non_members], ds.train.y[non_members])
        )
        print(f"fedavg run, eps {eps:g}: sigma {sigma:.3f}, {time.time() - began:.0f} s", file=sys.stderr)
        rows.append(dict(method="FedAvg (DP-SGD when on)", shared="the averaged model (loss threshold)",
                         target=eps, sigma=sigma, accounted=accounted,
                         per=f"the run ({args.fedavg_rounds} rounds, {steps} steps)", **vars_of(result)))  # fmt: skip
    return rows


def vars_of(result: audit.AttackResult) -> dict:
    return {"auc": result.auc, "tpr_at_1pct_fpr": result.tpr_at_1pct_fpr, "candidates": result.candidates}


if __name__ == "__main__":
    raise SystemExit(main())
