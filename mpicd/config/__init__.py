"""The experiment configuration: its typed sections (sections), read from YAML and overrides
(loading), as people read it (text), and a run's identity (identity). ``Config``, ``ConfigError`` and ``load_config`` are
its public face."""

from mpicd.config.loading import load_config
from mpicd.config.sections import Config, ConfigError

__all__ = ["Config", "ConfigError", "load_config"]
