"""A validated experiment: config, data, partition and algorithm, identical on every rank.

``prepare`` does everything that can fail on bad input and holds no MPI state, so ``mpicd check``
uses it without MPI and ``mpicd run`` can agree across ranks on a failure before anyone trains.
"""

from __future__ import annotations

from dataclasses import dataclass

from .algorithms import Algorithm, resolve
from .config import Config, to_mapping
from .data import Dataset, load_dataset
from .data.partition import Partition, make_partition
from .models import build_model


@dataclass
class Plan:
    """A validated experiment, identical on every rank: config, data, partition, algorithm."""

    config: Config
    dataset: Dataset
    partition: Partition
    algorithm_cls: type[Algorithm]
    algorithm_params: object

    @property
    def resolved_config(self) -> dict:
        """The config with every default filled in, the algorithm's hyper-parameters included."""
        tree = to_mapping(self.config)
        tree["algorithm"] = {"name": self.algorithm_cls.name, **to_mapping(self.algorithm_params)}
        return tree


def prepare(config: Config) -> Plan:
    """Validate everything that depends on the input; raises ConfigError naming the culprit."""
    algorithm_cls, params = resolve(config.algorithm)
    dataset = load_dataset(config.data)
    partition = make_partition(dataset.train.y, dataset.num_classes, config.clients, config.data.skew,
                               config.data.images_per_class, config.seed, config.data.skew_mode)
    algorithm_cls.check(params, partition.train_counts, partition.expertise)
    build_model(config.model.name, dataset.input_shape, dataset.num_classes,  # a mismatch fails here
                config.model.feature_dim, config.model.hidden)
    return Plan(config, dataset, partition, algorithm_cls, params)
