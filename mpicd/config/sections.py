"""Typed experiment configuration: the sections as validated dataclasses, and which keys are operational.

Every key is declared here (or, for an algorithm's own hyper-parameters, in that algorithm's
``Params`` dataclass), so an unknown key, a wrong type or a value out of range is one clear
``ConfigError`` naming the key, raised before anything trains.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union


from mpicd.core.schema import ConfigError, spec
from mpicd.core.schema import to_mapping as to_mapping  # re-exported: the config's inverse of from_mapping
from mpicd.core.schema import show as _show


@dataclass
class DataConfig:
    name: Literal["breast_cancer", "medmnist", "imagefolder", "aptos", "covid"] = spec(
        "breast_cancer",
        doc="dataset format; breast_cancer is built in (no download); imagefolder: your own images, one "
        "folder per class",
    )
    path: Optional[str] = spec(None, doc="medmnist: the .npz file; imagefolder/aptos/covid: the dataset folder")
    display_name: Optional[str] = spec(
        None,
        doc="imagefolder: the dataset's name in reports and the results file (default: the folder's name)",
    )
    image_size: Optional[int] = spec(
        None,
        ge=8,
        doc="resize images to this square size (aptos/covid default 64; imagefolder and medmnist default: "
        "their own size, not resized)",
    )
    classes: Optional[list[str]] = spec(
        None,
        doc="imagefolder/covid: class folders in label order (imagefolder default: every folder, sorted by "
        "name, or by number where all names are integers; covid default Normal, COVID); medmnist: class "
        "names in label order, after label_map (default: the file's known names, else class0, class1, ...)",
    )
    label_map: Optional[list[int]] = spec(
        None,
        doc="medmnist: the new class of each label of the file, by position (e.g. [0, 1, 1, 1, 1]: "
        "RetinaMNIST grade 0 vs 1-4); one entry per label, values 0..C-1 with each class used, C >= 2; "
        "null: the file's labels",
    )
    test_fraction: float = spec(0.2, gt=0.0, lt=1.0, doc="held-out fraction where no official test split exists")
    val_fraction: float = spec(
        0.1,
        gt=0.0,
        lt=1.0,
        doc="validation fraction of each class where no official val split exists (test_fraction + val_fraction < 1)",
    )
    split_seed: int = spec(
        0, ge=0, doc="seed of those held-out and validation splits; fixed so every run seed sees the same ones"
    )
    images_per_class: Optional[int] = spec(
        None, ge=1, doc="per-client images of each class before skew (null: as many as the rarest class allows)"
    )
    skew: float = spec(0.0, ge=0.0, lt=1.0, doc="each non-expertise class keeps a fraction 1 - skew on each client")
    skew_mode: Literal["symmetric", "authors"] = spec(
        "symmetric",
        doc="symmetric: skew on every client; authors: only on clients whose expertise class is 0 (the authors' code)",
    )
    partition: Literal["expertise", "natural", "dirichlet"] = spec(
        "expertise",
        doc="expertise: client i is expert in class i mod C and keeps 1 - skew of every other class; natural: "
        "every client the training split's class prevalence (within rounding); dirichlet: client i's class "
        "proportions q_i ~ Dirichlet(dirichlet_alpha * prevalence) (Hsu et al. 2019); for natural and "
        "dirichlet a client's expertise class is its most frequent class",
    )
    dirichlet_alpha: Optional[float] = spec(
        None,
        gt=0.0,
        doc="partition dirichlet only (and needed there): the concentration; small (0.1): nearly one class per "
        "client, large (100): close to natural",
    )
    images_per_client: Optional[int] = spec(
        None,
        ge=1,
        doc="partition natural or dirichlet: training images of each client (null: as many as every class allows)",
    )

    def __post_init__(self) -> None:
        check_partition_keys(self)
        if self.test_fraction + self.val_fraction >= 1.0:
            raise ConfigError(
                "data.val_fraction",
                f"test_fraction + val_fraction must be < 1 (nothing left to "
                f"train on), got {self.test_fraction} + {self.val_fraction}",
            )
        if self.label_map is not None:
            check_label_map(self.label_map)


def check_partition_keys(data: "DataConfig") -> None:
    """Each partition's own keys: a key that the chosen partition ignores would silently do nothing."""
    if data.partition == "dirichlet" and data.dirichlet_alpha is None:
        raise ConfigError("data.dirichlet_alpha", "partition dirichlet needs a concentration, e.g. 0.5 (> 0)")
    if data.partition != "dirichlet" and data.dirichlet_alpha is not None:
        raise ConfigError(
            "data.dirichlet_alpha",
            f"is {data.dirichlet_alpha!r}, but it applies to partition dirichlet only (partition is {data.partition})",
        )
    if data.partition == "expertise":
        if data.images_per_client is not None:
            raise ConfigError(
                "data.images_per_client",
                "applies to partition natural or dirichlet only; partition expertise sizes clients by "
                "data.images_per_class",
            )
        return
    expertise_only = {"skew": (data.skew, 0.0), "skew_mode": (data.skew_mode, "symmetric"),
                      "images_per_class": (data.images_per_class, None)}  # fmt: skip
    for key, (value, default) in expertise_only.items():
        if value != default:
            raise ConfigError(
                f"data.{key}",
                f"is {value!r}, but it applies to partition expertise only (partition is "
                f"{data.partition}; its clients are sized by data.images_per_client)",
            )


def check_label_map(label_map: list[int]) -> None:
    """What ``data.label_map`` must be whatever the file: a new class (>= 0) for each of at least two
    labels, the classes 0..C-1 each reached by some label, C >= 2 (the file's label count is checked
    by the loader)."""
    shown = _show(label_map)
    if len(label_map) < 2:
        raise ConfigError("data.label_map", f"needs one entry per label of the file (at least 2), got {shown}")
    if min(label_map) < 0:
        raise ConfigError("data.label_map", f"new classes must be >= 0, got {shown}")
    classes = max(label_map) + 1
    if classes < 2:
        raise ConfigError(
            "data.label_map", f"maps every label to class 0; at least two classes are needed, got {shown}"
        )
    unused = sorted(set(range(classes)) - set(label_map))
    if unused:
        raise ConfigError(
            "data.label_map",
            f"new classes must be 0..C-1, each the class of some label; {shown} maps no label to class "
            f"{unused[0]} (classes 0..{classes - 1})",
        )


@dataclass
class ModelConfig:
    name: Literal["auto", "lenet", "fedavgcnn", "mlp", "resnet18"] = spec(
        "auto", doc="auto: lenet for images, mlp for tabular data; fedavgcnn needs images >= 16x16"
    )
    feature_dim: int = spec(
        200,
        ge=1,
        le=65536,
        doc="D, the width of the feature vector the head reads (lenet, mlp; "
        "fedavgcnn and resnet18 have D = 512 and ignore it)",
    )
    hidden: int = spec(64, ge=1, le=65536, doc="mlp: hidden layer width")


@dataclass
class TrainConfig:
    optimizer: Literal["adam", "sgd"] = spec("adam", doc="the local optimizer (the authors': adam)")
    lr: float = spec(1e-3, gt=0.0, doc="learning rate")
    momentum: float = spec(0.9, ge=0.0, lt=1.0, doc="sgd only")
    weight_decay: float = spec(0.0, ge=0.0, doc="L2 penalty of the optimizer")
    batch_size: int = spec(32, ge=1, doc="training minibatch size (a trailing batch of one is merged)")
    local_epochs: int = spec(1, ge=1, doc="local epochs per round")
    optimizer_state: Literal["keep", "reset"] = spec(
        "keep",
        doc="keep: the optimizer's state (Adam's moments, SGD's momentum) carries over from round to round; "
        "reset: a fresh optimizer at the start of every round's local training (McMahan's FedAvg, Flower's clients)",
    )
    loss: Literal["ce", "balanced"] = spec(
        "ce",
        doc="the cross-entropy term of every method; balanced: weighted by the inverse class frequency of "
        "the client's own training split, w_c = n / (C n_c), normalised by the batch's weight sum as torch does",
    )
    sampler: Literal["shuffle", "balanced"] = spec(
        "shuffle",
        doc="the images of a local epoch: shuffle, each image once in a random order; balanced, n draws with "
        "replacement with probability 1 / (K n_c) for an image of class c (K the classes the client holds): "
        "every class it holds equally often; refused with DP-SGD (privacy with fedavg, fedamp)",
    )
    eval_batch_size: int = spec(512, ge=1, doc="evaluation batch size (operational: memory and speed)")


@dataclass
class EvalConfig:
    every: int = spec(
        1,
        ge=1,
        doc="evaluate on the test and validation splits every N rounds and after the last one; "
        "the rounds in between hold NaN metrics and the report scores evaluated rounds only",
    )
    train_split: bool = spec(
        False,
        doc="an audit, not a score: also evaluate every client on its own training images (centralized: the "
        "union) in the same rounds, into /metrics/train_acc, train_balanced_acc, train_minority_acc, "
        "train_personal_acc, train_recall (NaN when false); changes nothing that is trained",
    )
    share_train_metrics: bool = spec(
        False,
        doc="with privacy on, a client's training metrics (train_loss, train_ce, train_extra and the train_split "
        "scores) are exact functions of its training data outside the accountant, so they stay on its rank and "
        "the file holds NaN (attr train_metrics says why); true sends them to the writing rank: refused with "
        "privacy; without privacy they are always written",
    )
    shared_models: Literal["once", "per_client"] = spec(
        "once",
        doc="once: the clients of a rank whose algorithm ends the round with one model for all (fedavg) and whose "
        "models are equal bit for bit are evaluated once, each client scored from the same predictions (the "
        "same numbers, far less time with clients packed on ranks); per_client: every client's model evaluated "
        "itself, as a cross-check or a baseline to time",
    )
    diagnostics: bool = spec(
        False,
        doc="an audit of the mechanism: per round and client, /diag/term_grad_share (the extra term's share of "
        "the gradient norm), and for co-distillation /diag/r_distance (||m - R|| / ||R||, the student's own "
        "class mean against the received R) and /diag/cka_teacher (linear CKA with the teacher's features on "
        "64 validation images, sent after the round: bytes outside rounds); NaN when false; changes nothing "
        "that is trained",
    )


@dataclass
class CheckpointConfig:
    every: int = spec(
        1, ge=0, doc="save every rank's state every N rounds (0: never) beside the results file, for --resume"
    )
    flush_every: Union[int, Literal["auto"]] = spec(
        "auto",
        ge=1,
        doc="write and flush the results file's rows every N rounds (they wait in memory in between: a crash "
        "loses at most N-1 rounds, which --resume recomputes); auto: ceil(ranks / 4), so the write per round "
        "grows less with the ranks (BENCHMARKS.md); always at a stop and at the end",
    )


@dataclass
class DebugConfig:
    """Built-in fault injection, to test a cluster setup (and mpicd) against a failing rank."""

    fail_rank: Optional[int] = spec(None, ge=0, doc="inject a fault on this rank (null: no fault)")
    fail_round: int = spec(0, ge=0, doc="in this round, counted from 0 (2: the third round fails, 2 stay in the file)")
    fail_kind: Literal["exception", "exit", "kill", "hang", "nan"] = spec(
        "exception", doc="raise | os._exit(1) | SIGKILL itself | sleep instead of the next exchange | NaN in the model"
    )
    fail_at: Literal["before_exchange", "in_exchange", "after_epoch", "in_write", "in_checkpoint"] = spec(
        "after_epoch",
        doc="where in the round: before the algorithm's exchange, inside it (after posting), "
        "after the local epoch, inside the collective results write, inside the checkpoint write",
    )


@dataclass
class TimeoutConfig:
    round_seconds: Optional[float] = spec(
        None, gt=0.0, doc="watchdog: a round that takes longer ends the job, naming rank and round (null: off)"
    )


@dataclass
class PrivacyConfig:
    """Differential privacy of what leaves a rank (mpicd/privacy; docs/explanation/privacy.md). The section absent
    (the default) is privacy off: nothing is clipped, sampled or noised, and no accountant runs."""

    epsilon: Optional[float] = spec(
        None,
        gt=0.0,
        doc="the budget per client: a client whose next release would take its epsilon above it stops sharing "
        "(/metrics/privacy_stopped); without noise_multiplier the noise is derived so that every planned "
        "release fits; null: no budget (noise_multiplier then needed)",
    )
    delta: float = spec(1e-5, gt=0.0, lt=1.0, doc="the delta of every (epsilon, delta) the accountant reports")
    clip: float = spec(1.0, gt=0.0, doc="C: each image's vector (feature, logits) is clipped to L2 norm C")
    noise_multiplier: Optional[float] = spec(
        None,
        ge=0.0,
        doc="sigma: the noise std on a sum is sigma * C (on a count sigma); null: the smallest sigma that keeps "
        "rounds releases at sample_rate within (epsilon, delta)",
    )
    sample_rate: float = spec(
        1.0,
        gt=0.0,
        le=1.0,
        doc="q: each image is in a release independently with probability q (Poisson sampling, what the "
        "accountant's amplification by subsampling assumes)",
    )
    counts: Literal["public", "noised"] = spec(
        "noised",
        doc="noised: the count dividing a sum is released with noise std sigma (the release's multiplier is then "
        "sigma / sqrt 2); public: the expected count q n_c (n_c, the client's images of class c): exact class sizes, "
        "not covered under the zero-out adjacency, so only with privacy.noise: seeded or noise_multiplier 0 (runs "
        "marked not private)",
    )

    noise: Literal["secret", "seeded"] = spec(
        "secret",
        doc="secret: every draw a release rests on (Poisson sample, noise) comes from a key per client drawn from "
        "the operating system's entropy, which never leaves its rank (only its own checkpoint holds it); seeded: "
        "drawn from the run's seed, which every peer knows, so a peer can subtract the noise: NOT PRIVATE, for "
        "tests and audits that need repeatable noise (marked so in the results file, mpicd verify and the report)",
    )
    key_dir: Optional[str] = spec(
        None,
        doc="a folder of this site's secret keys, one file per client (client-<c>.key, mode 0600), made on first "
        "use and read by later runs, each drawing under its own nonce (privacy.nonce: the same keys, config, seed and "
        "nonce give the same results at this site); null: "
        "fresh keys every run (a resumed run takes them from its checkpoint)",
    )
    nonce: Optional[str] = spec(
        None,
        doc="null: every run draws its noise under its own nonce, its run id (64 random bits, the results file's "
        "attr privacy_nonce), so a key folder shared by runs never gives two releases the same noise; 16 hex "
        "digits (quoted): another run's privacy_nonce, to repeat its noise with the same keys (privacy.key_dir; the "
        "file says so; two such "
        "runs' releases subtract to the difference of their sums, without noise)",
    )

    def __post_init__(self) -> None:
        if self.nonce is not None:
            text = str(self.nonce)
            if len(text) != 16 or any(c not in "0123456789abcdef" for c in text):
                raise ConfigError(
                    "privacy.nonce", f"is {self.nonce!r}: a run's nonce is 16 hex digits (attr privacy_nonce)"
                )
            if self.noise != "secret":
                raise ConfigError(
                    "privacy.nonce", f"names the secret noise's nonce, but privacy.noise is {self.noise!r}"
                )
            if self.key_dir is None:
                raise ConfigError(
                    "privacy.nonce",
                    "repeats another run's noise with the same keys, but privacy.key_dir is null (fresh keys: nothing "
                    "is repeated); name the key folder of the run to repeat",
                )
        if self.key_dir is not None and self.noise != "secret":
            raise ConfigError("privacy.key_dir", f"holds secret keys, but privacy.noise is {self.noise!r}")
        if self.noise_multiplier is None and self.epsilon is None:
            raise ConfigError("privacy.noise_multiplier", "needs a value, or privacy.epsilon to derive it from")
        if self.counts == "public" and self.noise == "secret" and self.noise_multiplier != 0.0:
            raise ConfigError(
                "privacy.counts",
                "is public: it releases each class's exact size (q n_c), which differs between zero-out "
                "neighbours (the null record has no class), so no epsilon covers it; use noised (the default), or "
                "privacy.noise: seeded for a repeatable audit run (marked NOT PRIVATE)",
            )
        if self.noise_multiplier == 0.0 and self.epsilon is not None:
            raise ConfigError(
                "privacy.noise_multiplier",
                f"is 0 (exact releases, epsilon infinite), but privacy.epsilon is a budget of {self.epsilon}",
            )


# Keys that say how a run is executed, not what it computes: a resumed run may change them, and
# the report does not split cells by them. A section name covers every key inside it.
OPERATIONAL_KEYS = (
    "output",
    "device",
    "checkpoint",
    "debug",
    "timeout",
    "eval",
    "train.eval_batch_size",
    "clients_per_rank",
    "privacy.key_dir",
)


def is_operational(dotted: str) -> bool:
    return any(dotted == key or dotted.startswith(key + ".") for key in OPERATIONAL_KEYS)


def computed_config(tree: dict, prefix: str = "") -> dict:
    """A resolved config as flat dotted keys, without the operational ones (checkpoint, device ...)."""
    flat = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if is_operational(dotted):
            continue
        if isinstance(value, dict):
            flat.update(computed_config(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


# Keys added after results files and checkpoints were already being written, each with the value
# that reproduces what those older files did; a file without the key counts as holding it (resume,
# sweeps, report cells). A key whose default changed what a run computes must never be listed.
ADDED_LATER: dict[str, tuple[str | tuple[str, ...] | None, Any]] = {
    "on_nonfinite": (None, "abort"),  # before: no check; a finished run never met a NaN either way
    "algorithm.exchange": ("fedamp", "allgather"),  # before: always the Allgather
    "algorithm.share": ("codistill", "features"),  # before: always the mean feature vector
    "algorithm.term_mean": ("codistill", "matching"),  # before: the mean over the matching samples
    "train.optimizer_state": (None, "keep"),  # before: one optimizer for the whole run
    "train.loss": (None, "ce"),  # before: plain cross-entropy
    "train.sampler": (None, "shuffle"),  # before: every epoch a permutation of the client's images
    "data.label_map": (None, None),  # before: always the file's own labels (null: no mapping)
    "data.partition": (None, "expertise"),  # before: always expertise classes round-robin with skew
    "data.dirichlet_alpha": (None, None),  # before: no Dirichlet partition
    "data.images_per_client": (None, None),  # before: clients sized by images_per_class only
    "participation": (None, 1.0),  # before: every client in every round
    "algorithm.reduction": (("fedavg", "fedproto", "feddistill"), "mpi"),  # before: the float32 Allreduce
    "privacy.noise": (None, "seeded"),  # before: a private run's draws came from the public seed
    "data.display_name": (None, None),  # before: no display name (imagefolder is newer still)
    "privacy.nonce": (None, None),  # before: no nonce (every run at a key folder drew the same streams)
}


def _applies(algorithms: str | tuple[str, ...] | None, name) -> bool:
    """An ``ADDED_LATER`` entry's algorithm(s) (None: every algorithm) include ``name``."""
    return algorithms is None or name in ((algorithms,) if isinstance(algorithms, str) else algorithms)


def with_added_keys(flat: dict) -> dict:
    """A flat (dotted) config plus the ``ADDED_LATER`` keys it lacks, at their older-version values
    (a ``privacy.`` key only where the config has a privacy section: without one, privacy is off)."""
    name = flat.get("algorithm.name")
    private = any(k.startswith("privacy.") for k in flat)
    return {
        **{
            k: v
            for k, (algorithms, v) in ADDED_LATER.items()
            if _applies(algorithms, name) and (private or not k.startswith("privacy."))
        },
        **flat,
    }


def config_difference(saved: dict, current: dict, saved_as: str, current_as: str) -> str | None:
    """The first key whose computed value differs between two resolved configs, or None; e.g.
    ``algorithm.lambda: the checkpoint has 1.0, this run 0.3``. Either may predate a key of
    ``ADDED_LATER`` (a ledger line and a results file both written by an older version are compared
    by a newer one): it then counts as what the older version did."""
    a, b = with_added_keys(computed_config(saved)), with_added_keys(computed_config(current))
    for key in sorted(set(a) | set(b)):
        if a.get(key, "<absent>") != b.get(key, "<absent>"):
            return f"{key}: {saved_as} has {a.get(key, '<absent>')!r}, {current_as} {b.get(key, '<absent>')!r}"
    return None


@dataclass
class Config:
    """The whole experiment. ``algorithm`` stays a mapping here; the registry validates it."""

    clients: int = spec(4, ge=1, doc="number of clients (= MPI ranks unless clients_per_rank: balanced)")
    clients_per_rank: Literal["one", "balanced"] = spec(
        "one",
        doc="one: one client per MPI rank; balanced: any R <= clients ranks, several clients per rank "
        "trained in turn, assigned by training-set size (mpicd/mpi/assignment.py); the results are the same",
    )
    rounds: int = spec(20, ge=1, doc="communication rounds")
    seed: int = spec(0, ge=0, doc="run seed: partition, initialisation, teachers, batches")
    device: Literal["auto", "cpu", "cuda"] = spec("auto", doc="auto: one GPU per rank where there are GPUs, else CPU")
    output: str = spec("results/run.h5", doc="results file (HDF5); --out overrides")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    algorithm: dict = field(
        default_factory=lambda: {"name": "codistill"},
        metadata={"doc": "the method and its own keys (mpicd config --algorithm NAME)"},
    )
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    participation: float = spec(
        1.0,
        gt=0.0,
        le=1.0,
        doc="the fraction C of clients that train and communicate each round (FedAvg's C): a seeded sample "
        "of max(1, floor(C clients)), the others keep their state (mpicd/run/participation.py)",
    )
    on_nonfinite: Literal["abort", "skip"] = spec(
        "abort",
        doc="NaN/inf in a loss or a payload: abort naming rank and round, or skip: drop that "
        "client's update for the round (recorded in /metrics/skipped)",
    )
    debug: DebugConfig = field(default_factory=DebugConfig)
    timeout: TimeoutConfig = field(default_factory=TimeoutConfig)
    privacy: Optional[PrivacyConfig] = field(
        default=None,
        metadata={"doc": "differential privacy (null: off)", "omit_when_none": True},
    )

    def __post_init__(self) -> None:
        if self.privacy is not None and self.eval.share_train_metrics:
            raise ConfigError(
                "eval.share_train_metrics",
                "is true, but privacy is on: a client's exact training loss and training-split scores would reach "
                "the writing rank outside the accountant; set eval.share_train_metrics: false, or privacy: null",
            )
        if self.privacy is not None and self.eval.diagnostics:
            raise ConfigError(
                "eval.diagnostics",
                "is true, but privacy is on: its probe features (raw eval-mode representations of the teacher's "
                "model) would reach the students outside the accountant; set eval.diagnostics: false, or privacy: null",
            )
        fail = self.debug
        if fail.fail_rank is not None and fail.fail_rank >= self.clients:
            raise ConfigError("debug.fail_rank", f"is {fail.fail_rank}, but ranks are 0..{self.clients - 1}")
        if fail.fail_rank is not None and fail.fail_round >= self.rounds:
            raise ConfigError("debug.fail_round", f"is {fail.fail_round}, but rounds are 0..{self.rounds - 1}")


# --------------------------------------------------------------------------- description
