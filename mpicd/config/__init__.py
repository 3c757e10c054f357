"""The experiment configuration: typed sections read from YAML and overrides (sections), as people
read it (text), and a run's identity (identity). ``Config``, ``ConfigError`` and ``load_config`` are
its public face."""

from mpicd.config.sections import Config, ConfigError, load_config

__all__ = ["Config", "ConfigError", "load_config"]
