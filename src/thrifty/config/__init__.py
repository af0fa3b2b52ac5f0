"""Training configuration: small typed sections, one per concern, validated at construction.

A `TrainConfig` is built from a TOML file (or a dict) plus `section.key=value` overrides. Every
invalid value raises `ConfigError` naming the dotted field, the value given and what is allowed;
unknown keys are errors, so a typo is never silently ignored.

`checks` holds the validators every section shares; `sections` what a run trains and how,
`operations` where and with what it runs, `guard` and `cost` their own sections; `train` puts
them together and `files` reads and writes them.
"""

from thrifty.config.checks import check_target, parse_duration
from thrifty.config.cost import PRICINGS, CostConfig
from thrifty.config.files import (
    HISTORY_TABLE,
    apply_overrides,
    dump_toml,
    flatten_keys,
    parse_override_value,
    parse_set_args,
    read_config_file,
    read_config_toml,
    toml_literal,
    toml_loads,
)
from thrifty.config.guard import GuardConfig
from thrifty.config.operations import (
    CheckpointConfig,
    DistributedConfig,
    LogConfig,
    MeasureConfig,
    SpotConfig,
    TaskConfig,
)
from thrifty.config.sections import (
    OPTIMIZER_BUILT_ONLY,
    ActivationCheckpointingConfig,
    BatchConfig,
    CompileConfig,
    DataConfig,
    EarlyStoppingConfig,
    EvalConfig,
    OptimizerConfig,
    PrecisionConfig,
    RunConfig,
    ScheduleConfig,
)
from thrifty.config.train import TrainConfig, load_config

__all__ = [
    "OPTIMIZER_BUILT_ONLY",
    "PRICINGS",
    "HISTORY_TABLE",
    "ActivationCheckpointingConfig",
    "BatchConfig",
    "CheckpointConfig",
    "CompileConfig",
    "CostConfig",
    "DataConfig",
    "DistributedConfig",
    "EarlyStoppingConfig",
    "EvalConfig",
    "GuardConfig",
    "LogConfig",
    "MeasureConfig",
    "OptimizerConfig",
    "PrecisionConfig",
    "RunConfig",
    "ScheduleConfig",
    "SpotConfig",
    "TaskConfig",
    "TrainConfig",
    "apply_overrides",
    "check_target",
    "dump_toml",
    "flatten_keys",
    "load_config",
    "parse_duration",
    "parse_override_value",
    "parse_set_args",
    "read_config_file",
    "read_config_toml",
    "toml_literal",
    "toml_loads",
]
