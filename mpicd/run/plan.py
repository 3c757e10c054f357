"""A validated experiment: config, data, partition and algorithm, identical on every rank.

``prepare`` does everything that can fail on bad input, so ``mpicd run`` can agree across ranks on
a failure before anyone trains; without a communicator it needs no MPI (``mpicd check``), with one
each node reads the data once and its ranks share it (:mod:`mpicd.data.node_shared`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpicd.algorithms import Algorithm, resolve
from mpicd.config.sections import Config, ConfigError, to_mapping
from mpicd.data import Dataset, load_dataset
from mpicd.data.partition import make_partition, Partition
from mpicd.models.networks import build_model, num_parameters
from mpicd.privacy.budget import settings


@dataclass
class Plan:
    """A validated experiment, identical on every rank: config, data, partition, algorithm."""

    config: Config
    dataset: Dataset
    partition: Partition
    algorithm_cls: type[Algorithm]
    algorithm_params: object
    num_parameters: int  # P of the model every client builds (sizes the checkpoints before training)
    shared: object = None  # nodeshare.SharedMemory under the dataset's arrays (None: a private load)
    privacy: object = None  # mpicd.privacy.budget.Settings (None: privacy off)

    @property
    def resolved_config(self) -> dict:
        """The config with every default filled in, the algorithm's hyper-parameters included."""
        tree = to_mapping(self.config)
        tree["algorithm"] = {"name": self.algorithm_cls.name, **to_mapping(self.algorithm_params)}
        return tree

    def release(self) -> None:
        """Free the node's shared data (collective over the node's ranks); the arrays are gone after."""
        if self.shared is not None:
            self.shared.free()


def prepare(config: Config, comm=None) -> Plan:
    """Validate everything that depends on the input; raises ConfigError naming the culprit.

    ``comm`` (a :class:`mpicd.mpi.comm.Comm`, collective): one rank per node loads the data and the
    node's ranks share it read-only; without it this rank loads its own copy and MPI is never imported.
    """
    algorithm_cls, params = resolve(config.algorithm)  # the registry chooses: the method, its keys, its switches
    if comm is None:
        dataset, shared = load_dataset(config.data), None
    else:
        from mpicd.data.node_shared import load_shared  # mpi4py: never imported without a communicator

        dataset, shared = load_shared(comm, lambda: load_dataset(config.data))
    try:
        partition = make_partition(
            dataset.train.y,
            dataset.num_classes,
            config.clients,
            config.data.skew,
            config.data.images_per_class,
            config.seed,
            config.data.skew_mode,
            config.data.partition,
            config.data.dirichlet_alpha,
            config.data.images_per_client,
        )
        algorithm_cls.check(params, partition.train_counts, partition.expertise)
        privacy = private_settings(config, algorithm_cls, params)
        parameters = num_parameters(
            build_model(
                config.model.name,
                dataset.input_shape,
                dataset.num_classes,  # a mismatch fails here
                config.model.feature_dim,
                config.model.hidden,
            )
        )
    except ConfigError:
        if shared is not None:  # the same data and config: every rank of the node fails here alike
            shared.free()
        raise
    return Plan(config, dataset, partition, algorithm_cls, params, parameters, shared, privacy)


def private_settings(config: Config, algorithm_cls: type[Algorithm], params):
    """The ``privacy`` section resolved (mpicd.privacy.budget.Settings; sigma derived from the budget
    over ``rounds`` releases if not given), None when it is off; ConfigError for what has no private path."""
    if config.privacy is None:
        return None
    algorithm_cls.check_private(params)
    if algorithm_cls.dpsgd:
        check_dpsgd(config)
    try:
        return settings(config.privacy, config.rounds)
    except ValueError as err:
        raise ConfigError("privacy.epsilon", str(err).removeprefix("privacy: ")) from None


def check_dpsgd(config: Config) -> None:
    """What DP-SGD's local training (Opacus, mpicd.run.client) needs of the rest of the config."""
    refused = {
        "privacy.noise_multiplier": (config.privacy.noise_multiplier is None, "needs a value for DP-SGD (the steps "
                                     "per round differ per client: no sigma is derived from the budget)"),
        "privacy.sample_rate": (config.privacy.sample_rate != 1.0, "must stay 1 for DP-SGD: batches are Poisson-"
                                "sampled at q = 1 / ceil(n / train.batch_size)"),
        "train.loss": (config.train.loss != "ce", "must be ce for DP-SGD (a weighted mean is not per sample)"),
        "train.sampler": (config.train.sampler != "shuffle", "must be shuffle for DP-SGD: its accountant charges "
                          "Poisson batches that take every image at one rate q, and balanced draws take a "
                          "minority image more often, at a rate set by the private class sizes"),
        "train.optimizer_state": (config.train.optimizer_state != "keep", "must be keep for DP-SGD"),
        "model.name": (config.model.name == "resnet18", "resnet18's BatchNorm mixes samples: DP-SGD needs "
                       "lenet, fedavgcnn or mlp"),
    }  # fmt: skip
    for key, (bad, why) in refused.items():
        if bad:
            raise ConfigError(key, why)
