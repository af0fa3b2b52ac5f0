"""`TrainConfig`: every section of a run's config, built from a dict with every value checked."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from thrifty.config.cost import CostConfig
from thrifty.config.files import apply_overrides, read_config_file
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
from thrifty.errors import ConfigError


@dataclass(frozen=True, kw_only=True, slots=True)
class TrainConfig:
    """Every section of a training run. Build with `TrainConfig.from_dict` or `load_config`."""

    run: RunConfig
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    activation_checkpointing: ActivationCheckpointingConfig = field(
        default_factory=ActivationCheckpointingConfig
    )
    batch: BatchConfig = field(default_factory=BatchConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    compile: CompileConfig = field(default_factory=CompileConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    spot: SpotConfig = field(default_factory=SpotConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    log: LogConfig = field(default_factory=LogConfig)
    task: TaskConfig = field(default_factory=TaskConfig)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        return _build(cls, data, prefix="")

    def to_dict(self, secrets: bool = True) -> dict[str, Any]:
        """Plain nested dict (None values dropped), suitable for TOML.

        With `secrets=False` (what is written to disk) the dict goes through
        `thrifty.redact.redact_value`: storage_options are left out, URLs lose any
        user:password part and signed query values, and secret-named values are masked.
        """
        data = {
            f.name: {
                k: v for k, v in dataclasses.asdict(getattr(self, f.name)).items() if v is not None
            }
            for f in dataclasses.fields(self)
        }
        if secrets:
            return data
        from thrifty.redact import redact_value

        redacted: dict[str, Any] = redact_value(data)
        return redacted

    def replace(self, **overrides: str) -> TrainConfig:
        """A copy with `section.key` overrides applied, e.g. `replace(**{"batch.micro": "8"})`."""
        return TrainConfig.from_dict(apply_overrides(self.to_dict(), overrides.items()))


# --------------------------------------------------------------------------------------------
# Building sections from plain data, with type checks that name the field


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin is list:
        return f"a list of {_type_name(get_args(tp)[0])}"
    if origin is dict:
        return "a table"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _matches(value: Any, tp: Any) -> bool:
    origin = get_origin(tp)
    if tp is Any:
        return True
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in get_args(tp))
    if origin in (Union, types.UnionType):
        return any(_matches(value, a) for a in get_args(tp))
    if tp is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_matches(v, get_args(tp)[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return (
            isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        )
    return isinstance(value, tp)


def _build(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a table, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        close = difflib.get_close_matches(key, fields, n=1)
        hint = f"did you mean {prefix}{close[0]}?" if close else f"allowed: {', '.join(fields)}"
        where = prefix.rstrip(".") or "the config"
        raise ConfigError(f"unknown key {prefix}{key} in {where}: {hint}")
    kwargs = {}
    for name, value in data.items():
        tp = hints[name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[name] = _build(tp, value, f"{name}.")
            continue
        if isinstance(value, int) and not isinstance(value, bool) and tp is float:
            value = float(value)
        if value is False and tp == (str | None):  # an optional text left unset: log.mlflow=false
            value = None
        if not _matches(value, tp):
            raise ConfigError(f"{prefix}{name} = {value!r} is invalid: expected {_type_name(tp)}")
        kwargs[name] = value
    if cls is TrainConfig and "run" not in kwargs:
        kwargs["run"] = _build(RunConfig, {}, "run.")
    return cls(**kwargs)


# --------------------------------------------------------------------------------------------
# TOML files and overrides


# config.toml's array of tables recording what changed on each resume (thrifty.rundir.config_changes);
# load_config skips it, so a run's config.toml starts that run again as it is now.


def load_config(
    path: str | Path | None = None,
    overrides: Iterable[tuple[str, Any]] = (),
    base: Mapping[str, Any] | None = None,
) -> TrainConfig:
    """Read a TOML file (optionally on top of `base`) and apply `section.key` overrides."""
    data: dict[str, Any] = {k: dict(v) for k, v in (base or {}).items()}
    if path is not None:
        for section, table in read_config_file(path).items():
            if isinstance(table, dict) and isinstance(data.get(section), dict):
                data[section] = {**data[section], **table}
            else:
                data[section] = table
    return TrainConfig.from_dict(apply_overrides(data, overrides))
