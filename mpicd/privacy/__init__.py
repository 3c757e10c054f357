"""Differential privacy for what leaves a rank: mechanisms, accountant, DP-SGD, audit.

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

What the mechanisms and the accountant agree on (the privacy unit and its neighbours, :data:`ADJACENCY`):
one record = one training image of one client, with its label; two datasets are neighbours when
one record of one is replaced by a null record (**zero-out adjacency**, Kairouz et al. 2021): the
null record has no image and no class and contributes nothing (a zero row to every sum, to no
count, a zero gradient). So a client's number of records n is the same in both (public: FedAvg's
n_i, DP-SGD's rate 1 / ceil(n / b) and its expected batch q n may be released exactly), while its
per-class sizes n_c are not (the null record has no class): a class size is only ever released
noised (``privacy.counts: public``, the exact q n_c, is refused unless the run is already marked
not private). Each record contributes at most one row, clipped to L2 norm C, so replacing it by
the null record moves a sum by at most C and a count by at most 1. Every release depends on the
data only through such sums (and counts) and public constants, so a zero-out neighbour's release
is distributed exactly as the release of the dataset without that record: the privacy loss is the
add/remove-one loss of the Poisson-subsampled Gaussian in both directions, and dp-accounting's PLD
for ``ADD_OR_REMOVE_ONE`` (:mod:`.accountant`) is its epsilon. Epsilon is per client: each client's
data is protected by its own releases, whatever the others do.

Importing this package, or any module but :mod:`.accountant`, :mod:`.dpsgd` and :mod:`.audit`'s
private-path functions, imports neither opacus nor dp_accounting: they are imported inside the
functions that need them, so the default (privacy off) path never loads them (Opacus imports
torch._dynamo at import time).
"""

ADJACENCY = (
    "zero-out: neighbouring datasets differ in one record replaced by a null record (no image, no class, "
    "contributing nothing); a client's record count n is public, its class sizes n_c are not"
)
"""The neighbouring relation every release and the accountant assume (attr privacy_adjacency)."""
