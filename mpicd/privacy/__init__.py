"""Differential privacy for what leaves a rank (issue 20): mechanisms, accountant, DP-SGD, audit.

One concept per module:

* :mod:`.clip` -- per-vector L2 clipping to a bound C (the sensitivity bound every mechanism needs);
* :mod:`.sampling` -- Poisson subsampling (each record independently with probability q);
* :mod:`.secret` -- the secret randomness of a release: a key per client, SHAKE-256 streams of it;
* :mod:`.streams` -- which stream each draw comes from: the client's secret one, or seeded (not private);
* :mod:`.gaussian` -- the Gaussian mechanism on a sum of clipped vectors (noise std sigma * C);
* :mod:`.release` -- the private releases the algorithms make: co-distillation's R, FedProto's
  per-class feature sums + counts, FedDistill's per-class logit sums + counts;
* :mod:`.accountant` -- epsilon of the Poisson-subsampled Gaussian, per client (dp-accounting PLD);
* :mod:`.dpsgd` -- DP-SGD (Opacus) for the model-sharing baselines FedAvg and FedAMP;
* :mod:`.audit` -- an empirical lower bound on epsilon (canary, Clopper-Pearson) and a
  membership-inference attack on R.

What the mechanisms and the accountant agree on (the privacy unit and its neighbours):
one record = one training image of one client; two datasets are neighbours when one is the
other plus one record (add/remove-one adjacency, the relation under which Poisson subsampling
amplifies privacy and the one dp-accounting's PLD accountant uses for a PoissonSampledDpEvent).
Each record contributes at most one row to a release, clipped to L2 norm C, so adding or removing
it moves the sum by at most C (and a count by at most 1). Denominators of means are public
constants (never computed from the sampled data). Epsilon is per client: each client's data is
protected by its own releases, whatever the others do.

Importing this package, or any module but :mod:`.accountant`, :mod:`.dpsgd` and :mod:`.audit`'s
private-path functions, imports neither opacus nor dp_accounting: they are imported inside the
functions that need them, so the default (privacy off) path never loads them (Opacus imports
torch._dynamo at import time).
"""
