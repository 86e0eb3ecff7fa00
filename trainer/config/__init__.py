"""The training configuration: typed sections (`schema`), the estimators' sections (`estimators`),
the shipped presets (`presets`), the config a run writes (`written`), the key reference (`docs`)
and `pvpo config` (`cli`).

This package imports no runtime code: loading and validating a preset needs neither torch nor
transformers (names of pluggable parts are checked against their registries' name lists).
"""

from pvpo.trainer.config.schema import (
    ConfigError,
    TrainConfig,
    apply_overrides,
    config_from_dict,
    load_config,
)
from pvpo.trainer.config.written import dump_config

__all__ = ["ConfigError", "TrainConfig", "apply_overrides", "config_from_dict", "dump_config", "load_config"]
