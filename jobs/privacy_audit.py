"""What a peer learns from co-distillation's R, with privacy off and on: the audit of issue 20.

    .venv/bin/python jobs/privacy_audit.py [--data ../shared/data/pneumoniamnist.npz] [--trials 2000]
        [--members 100] [--attack-members 10 100] [--epsilons 1 4 16] [--train-epochs 1] [--seed 0]
        [--json out.json]

Features: the project's LeNet (mpicd.models, initialised from seeds.INIT, trained --train-epochs
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

Prints two markdown tables (and writes them as JSON with --json). One release = one round; the
epsilons are per release (over T rounds the same sigma costs more: mpicd.privacy.accountant).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mpicd.config import DataConfig  # noqa: E402
from mpicd.data import load_dataset  # noqa: E402
from mpicd.privacy import accountant, audit  # noqa: E402
from mpicd.privacy.clip import clip_rows  # noqa: E402


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
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    start = time.time()

    ds = load_dataset(DataConfig(name="medmnist", path=args.data))
    # one LeNet, trained on the training split only, featurises the training and the test images
    everything = audit.lenet_features(
        np.concatenate([ds.train.x, ds.test.x]), seed=args.seed, feature_dim=200, num_classes=ds.num_classes,
        fit=(ds.train.x, ds.train.y), train_epochs=args.train_epochs,
    )  # fmt: skip
    train_features, test_features = everything[: len(ds.train.x)], everything[len(ds.train.x) :]
    pool = train_features[ds.train.y == 0]
    rows = pool[: args.members]
    mean_direction = clip_rows(pool, args.clip).mean(axis=0)
    held_out = clip_rows(test_features, args.clip)
    cosine = held_out @ mean_direction / (np.linalg.norm(held_out, axis=1) * np.linalg.norm(mean_direction))
    canary = test_features[int(np.argmin(cosine))]
    print(f"features: {len(pool)} class-0 training images, D = {pool.shape[1]}, trained {args.train_epochs} epoch(s)")

    sigmas = {
        (q, eps): accountant.noise_multiplier(eps, args.delta, q, 1, tol=1e-2)
        for q in (1.0, 0.5)
        for eps in args.epsilons
    }
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
    attack_rows = []
    for m in args.attack_members:
        off = audit.membership_attack(
            pool, members=m, reference=300, trials=args.attack_trials, seed=args.seed, private=False
        )
        attack_rows.append(dict(members=m, privacy="off", q=1.0, sigma=0.0, accounted=float("inf"), **vars_of(off)))
        for (q, _), sigma in sigmas.items():
            on = audit.membership_attack(
                pool, members=m, reference=300, trials=args.attack_trials, seed=args.seed,
                private=True, q=q, clip=args.clip, sigma=sigma,
            )  # fmt: skip
            accounted = accountant.epsilon(q, sigma, 1, args.delta)
            attack_rows.append(dict(members=m, privacy="on", q=q, sigma=sigma, accounted=accounted, **vars_of(on)))

    print(f"\nCanary audit of one release of R (|D| = {args.members} or empty, C = {args.clip}, delta = {args.delta}, "
          f"{args.trials} releases per neighbour, bound on the second half, 95% Clopper-Pearson):\n")  # fmt: skip
    print("| q | D | sigma | accounted eps | empirical eps (lower bound) | TPR | FPR |")
    print("|---|---|---|---|---|---|---|")
    for r in audit_rows:
        print(f"| {r['q']:g} | {r['D']} | {r['sigma']:.3f} | {r['accounted']:.3f} | {r['empirical']:.3f} | "
              f"{r['tpr']:.3f} | {r['fpr']:.3f} |")  # fmt: skip
    print(f"\nMembership inference on R by a peer (m members, as many non-members, 300 reference "
          f"images, {args.attack_trials} trials):\n")  # fmt: skip
    print("| m | privacy | q | sigma | accounted eps (one release) | AUC | TPR at 1% FPR |")
    print("|---|---|---|---|---|---|---|")
    for r in attack_rows:
        print(f"| {r['members']} | {r['privacy']} | {r['q']:g} | {r['sigma']:.3f} | {r['accounted']:.3f} | {r['auc']:.3f} | "
              f"{r['tpr_at_1pct_fpr']:.3f} |")  # fmt: skip
    print(f"\n({time.time() - start:.0f} s)")
    if args.json is not None:
        args.json.write_text(json.dumps({"audit": audit_rows, "attack": attack_rows, "args": vars(args)}, default=str))
    return 0


def vars_of(result: audit.AttackResult) -> dict:
    return {"auc": result.auc, "tpr_at_1pct_fpr": result.tpr_at_1pct_fpr, "candidates": result.candidates}


if __name__ == "__main__":
    raise SystemExit(main())
