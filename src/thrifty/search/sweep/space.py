"""A sweep's search space: SPACE.toml, one table per config key.

```toml
["optimizer.lr"]            # a range: low and high, both numbers
low = 1e-4
high = 3e-2
log = true                  # sampled on a log scale (optional; low must then be above 0)

["batch.micro"]             # integers when low and high are: an integer range
low = 4
high = 32
step = 4                    # optional: a grid of steps from low

["batch.effective"]         # a choice among values
choices = [32, 64, 128]

["task.model_args.n_embd"]  # an argument of a factory: one the config's table already sets
choices = [64, 96, 128]
```

Every key must be one `thrifty train` takes (`--set` checks it the same way), and every value
the space can give must be one the config accepts: a range's ends and every choice are tried on
the base config before a trial runs, so a wrong one is one line, not a failed trial.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thrifty.config import (
    OPTIMIZER_BUILT_ONLY,
    TrainConfig,
    apply_overrides,
    parse_set_args,
    read_config_file,
    toml_loads,
)
from thrifty.errors import ConfigError, ThriftyError

if TYPE_CHECKING:
    import optuna

Value = bool | int | float | str
_RANGE_KEYS = {"low", "high", "log", "step"}


@dataclass(frozen=True, slots=True)
class Param:
    """One config key to search: a range (`low`, `high`, `log`, `step`) or `choices`."""

    key: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple[Value, ...] | None = None

    @property
    def integer(self) -> bool:
        return self.choices is None and all(
            isinstance(v, int) and not isinstance(v, bool) for v in (self.low, self.high)
        )

    def suggest(self, trial: optuna.Trial) -> Value:
        """The value `trial` takes (sampled, or the one it already has when resumed)."""
        if self.choices is not None:
            chosen = trial.suggest_categorical(self.key, list(self.choices))
            assert chosen is not None  # the choices hold no None
            return chosen
        assert self.low is not None and self.high is not None
        if self.integer:
            step = int(self.step) if self.step is not None else 1
            return trial.suggest_int(
                self.key, int(self.low), int(self.high), step=step, log=self.log
            )
        return trial.suggest_float(
            self.key, float(self.low), float(self.high), step=self.step, log=self.log
        )

    def to_dict(self) -> dict[str, Any]:
        if self.choices is not None:
            return {"choices": list(self.choices)}
        data: dict[str, Any] = {"low": self.low, "high": self.high, "log": self.log}
        if self.step is not None:
            data["step"] = self.step
        return data


@dataclass(frozen=True, slots=True)
class Space:
    params: tuple[Param, ...]

    def suggest(self, trial: optuna.Trial) -> dict[str, Value]:
        """Every key's value for `trial`, in the space's order."""
        return {p.key: p.suggest(trial) for p in self.params}

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {p.key: p.to_dict() for p in self.params}

    def canonical(self) -> str:
        """The space as one stable string: what a sweep's identity is computed from."""
        return json.dumps(self.to_dict(), sort_keys=True)


def read_config(config: str | Path | Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """The config every trial starts from: the file (or dict) with the sweep's --set applied."""
    if isinstance(config, Mapping):
        data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    else:
        try:
            data = read_config_file(config)
        except OSError as exc:
            raise ThriftyError(f"cannot read {config}: {exc.strerror or exc}") from None
    return apply_overrides(data, parse_set_args(overrides))


def read_space(path: str | Path, base: Mapping[str, Any]) -> Space:
    """The space in the TOML file at `path`, checked against `base` (the config as a nested
    dict, overrides applied). Raises ConfigError with one line naming the key and the fix."""
    where = f"--space {path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ThriftyError(f"{where}: cannot read it: {exc.strerror or exc}") from exc
    try:
        data = toml_loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where} is not valid TOML: {exc}") from exc
    return parse_space(data, base, where)


def parse_space(
    data: Mapping[str, Any], base: Mapping[str, Any], where: str = "the space"
) -> Space:
    """The space in `data` (SPACE.toml's tables), checked against `base`; see `read_space`."""
    if not data:
        raise ConfigError(f'{where} is empty: add a table per config key, e.g. ["optimizer.lr"]')
    params = []
    for key, table in data.items():
        if not isinstance(table, Mapping):
            raise ConfigError(
                f'{where}: ["{key}"] must be a table with low and high, or choices (quote the '
                'name, as in ["optimizer.lr"])'
            )
        param = _param(key, table, where)
        _check_applies(param, base, where)
        _check_values(param, base, where)
        params.append(param)
    return Space(tuple(params))


def _param(key: str, table: Mapping[str, Any], where: str) -> Param:
    name = f'{where}: ["{key}"]'
    if "." not in key or not all(key.split(".")):
        raise ConfigError(f"{name} is not a config key; use section.key, e.g. optimizer.lr")
    if "choices" in table:
        extra = sorted(set(table) - {"choices"})
        if extra:
            raise ConfigError(f"{name} has choices and {', '.join(extra)}: give one or the other")
        choices = table["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{name}: choices must be a non-empty list, e.g. [32, 64]")
        kinds = {type(c) for c in choices}
        if (
            any(isinstance(c, (list, dict)) for c in choices)
            or len(kinds - {int, float}) > 1
            or (kinds & {int, float} and kinds - {int, float})
        ):
            raise ConfigError(f"{name}: choices must be numbers, strings or booleans of one kind")
        if len(set(map(repr, choices))) != len(choices):
            raise ConfigError(f"{name}: choices repeat a value; list each once")
        return Param(key, choices=tuple(choices))
    unknown = sorted(set(table) - _RANGE_KEYS)
    if unknown:
        raise ConfigError(
            f"{name}: unknown field {unknown[0]}: a range has low, high, log, step; a choice "
            "has choices"
        )
    low, high = table.get("low"), table.get("high")
    if not (_number(low) and _number(high)):
        raise ConfigError(f"{name} needs numbers low and high (or choices = [...])")
    assert low is not None and high is not None
    if low >= high:
        what = "empty" if low == high else "inverted"
        raise ConfigError(
            f"{name}: the range {low:g} to {high:g} is {what}: low must be below high "
            "(a single value belongs in the config, or --set)"
        )
    log = table.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{name}: log must be true or false")
    if log and low <= 0:
        raise ConfigError(f"{name}: a log range needs low above 0, got {low:g}")
    step = table.get("step")
    if step is not None:
        if not _number(step) or step <= 0:
            raise ConfigError(f"{name}: step must be a number above 0")
        if log:
            raise ConfigError(f"{name}: give log or step, not both")
    param = Param(key, low=low, high=high, log=log, step=step)
    if step is not None and not param.integer and isinstance(step, int):
        param = Param(key, low=low, high=high, step=float(step))
    return param


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# The keys a factory of [task] takes over: [optimizer]'s that only build thrifty's optimizer,
# and the whole of [schedule].
_TAKEN_OVER = {
    "optimizer": ("optimizer", OPTIMIZER_BUILT_ONLY),
    "scheduler": ("schedule", None),
}


def _check_applies(param: Param, base: Mapping[str, Any], where: str) -> None:
    """Refuse a key that a factory of the config makes a no-op: every trial would train alike."""
    section, _, name = param.key.partition(".")
    task = base.get("task")
    for factory, (taken, keys) in _TAKEN_OVER.items():
        path = task.get(factory) if isinstance(task, Mapping) else None
        if path and section == taken and (keys is None or name in keys):
            raise ConfigError(
                f'{where}: ["{param.key}"] would change nothing: task.{factory} = {path!r} '
                f"builds the {factory} and {param.key} does not reach it, so every trial "
                f"would train alike; remove task.{factory} to sweep [{taken}]"
            )


def _check_values(param: Param, base: Mapping[str, Any], where: str) -> None:
    """Every value the space can give is one the config accepts: the ends of a range, each
    choice. A config error names the value and the key."""
    values: Sequence[Any] = param.choices if param.choices is not None else (param.low, param.high)
    *tables, last = param.key.split(".")
    if len(tables) > 1:  # a factory's argument (task.model_args.n_embd): one the config sets
        table: Any = base
        for part in tables:
            table = table.get(part) if isinstance(table, Mapping) else None
        if not isinstance(table, Mapping) or last not in table:
            raise ConfigError(
                f'{where}: ["{param.key}"] is not in the config: set {param.key} there first '
                "(a factory's arguments are not checked before its trial runs)"
            )
    for value in values:
        try:
            TrainConfig.from_dict(apply_overrides(base, [(param.key, value)]))
        except ConfigError as exc:
            raise ConfigError(f'{where}: ["{param.key}"] = {value!r}: {exc}') from None
