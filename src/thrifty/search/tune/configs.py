"""The two configs a tune writes: the one every trial starts from, and the winner.

Both start from the config as given (TOML data). The trial config keeps what the job trains
(task, model, data, optimizer, schedule, precision and the other levers) and turns off what
would distort a short measurement: validation, early stopping, checkpoints (a trial's weights
are thrown away: writing them would spend the budget on a large model), the spot watcher, the progress bar, traces,
and every budget but the trial's steps. The winner is the config as given with the winning
lever values, so `thrifty train` runs it as is: the same effective batch, learning rate,
schedule, seed and data order as the baseline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from thrifty.config import apply_overrides
from thrifty.search.tune.space import Setting

# Every budget but max_steps, and where the run would go: the trial sets those.
_RUN_KEYS_DROPPED = ("out", "overwrite", "max_time", "max_tokens", "max_epochs")


def trial_config(given: Mapping[str, Any], steps: int, effective: int) -> dict[str, Any]:
    """The TOML data each trial runs (its setting comes as --set items on top)."""
    data = {k: dict(v) if isinstance(v, Mapping) else v for k, v in given.items()}
    run = {k: v for k, v in data.get("run", {}).items() if k not in _RUN_KEYS_DROPPED}
    data["run"] = {**run, "max_steps": steps, "progress": "off"}
    data["batch"] = {**data.get("batch", {}), "effective": effective}
    data["task"] = {k: v for k, v in data.get("task", {}).items() if k != "val_data"}
    data.pop("early_stopping", None)  # it needs validation, which trials leave out
    data["checkpoint"] = {"every": "off", "final": False, "resume": "never"}
    data["spot"] = {"provider": "none"}
    measure = data.get("measure", {})
    data["measure"] = {k: v for k, v in measure.items() if k not in ("trace", "trace_steps")}
    return data


def winner_config(
    given: Mapping[str, Any],
    setting: Setting,
    effective: int,
    cost: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The config as given with `setting`'s values (resolved: no "auto" left but the ones the
    config had) and the effective batch written out. `cost`, when given, replaces the [cost]
    section (the instance the tune priced)."""
    values = dict(setting.config_values())
    values["batch.effective"] = effective
    data = apply_overrides(given, values.items())
    if cost is not None:
        data["cost"] = dict(cost)
    return data
