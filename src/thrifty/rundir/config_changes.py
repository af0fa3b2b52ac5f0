"""A changed config on resume is never silent.

A resumed run's config is compared, key by key, with the one stored in its checkpoint:

- **safe** changes (budgets, logging, evaluation, checkpoint cadence and location, data loading,
  compile, measurement, cost, the device) are applied and listed in one line;
- **optimization** changes (learning rate, schedule, optimizer, seed, precision, batch shape,
  data order, and the task: model, data, loss) are refused with the list of differences unless
  `run.allow_config_change = true` (`--allow-config-change`); then they are applied, recorded as
  an event in metrics.jsonl, and config.toml keeps the earlier values in `[[config_changes]]`.

A larger budget keeps the learning-rate schedule's horizon (`resume_horizon`) unless
`schedule.total_steps` is given, so the rate never jumps; a finished run is extended through the
same rule (`budget_grew`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from thrifty.config import (
    HISTORY_TABLE,
    RunConfig,
    TrainConfig,
    dump_toml,
    flatten_keys,
    parse_duration,
    read_config_toml,
    toml_loads,
)
from thrifty.errors import ConfigError
from thrifty.rundir.own_files import CONFIG_HEADER_LINE

Kind = Literal["safe", "optimization"]
SAFE: Kind = "safe"
OPTIMIZATION: Kind = "optimization"

# Sections and dotted keys -> kind; the longest matching prefix wins. A key no rule names counts
# as an optimization change, so a setting added later is never applied without a word.
KINDS: dict[str, Kind] = {
    "run": SAFE,  # name, out, device, deterministic, budgets, log_every, progress
    "run.seed": OPTIMIZATION,  # the data order and every random stream from here on
    "precision": OPTIMIZATION,
    "activation_checkpointing": SAFE,  # recomputes the same activations
    # The micro-batch moves the data position and, with the effective batch, the optimization.
    "batch": OPTIMIZATION,
    "optimizer": OPTIMIZATION,
    "schedule": OPTIMIZATION,
    "data": SAFE,  # how batches are loaded, not which
    "data.shuffle": OPTIMIZATION,  # which samples the rest of the epoch holds
    "compile": SAFE,
    "eval": SAFE,
    "early_stopping": SAFE,
    "checkpoint": SAFE,
    "spot": SAFE,
    # A strategy or world size a checkpoint cannot continue with is refused by the layout
    # checks (`Strategy.check_resumable`); backend and timeout change no numbers.
    "distributed": SAFE,
    "measure": SAFE,
    "cost": SAFE,
    "guard": SAFE,  # when to skip, roll back or stop: not what a step computes
    "log": SAFE,  # where figures are sent besides the run directory
    # Another model, data or loss changes what is learned; the shape check catches only a
    # changed architecture, so every task change needs --allow-config-change.
    "task": OPTIMIZATION,
}
# Keys that say how to resume rather than what to train, and storage_options (never on disk).
IGNORED = frozenset(
    {
        "run.allow_config_change",
        "run.overwrite",
        "checkpoint.resume",
        "checkpoint.storage_options",
    }
)
BUDGET_KEYS = ("run.max_steps", "run.max_tokens", "run.max_time", "run.max_epochs")
FIX = (
    "resume with the config that wrote the checkpoint, or pass --allow-config-change "
    "(run.allow_config_change = true) to apply the changes"
)


class _Unset:
    def __repr__(self) -> str:
        return "unset"


UNSET: Any = _Unset()  # a key one side does not set (and that has no default)


def classify(key: str) -> Kind:
    """Whether changing the dotted config `key` on a resume is safe or changes the optimization."""
    parts = key.split(".")
    for end in range(len(parts), 0, -1):
        kind = KINDS.get(".".join(parts[:end]))
        if kind is not None:
            return kind
    return OPTIMIZATION


@dataclass(frozen=True, slots=True)
class Change:
    """One dotted key whose value differs between the checkpoint's config and this run's."""

    key: str
    old: Any
    new: Any

    @property
    def kind(self) -> Kind:
        return classify(self.key)

    def describe(self) -> str:
        return f"{self.key} {_show(self.old)} → {_show(self.new)}"

    def to_dict(self) -> dict[str, Any]:
        """Plain values for metrics.jsonl and config.toml (an unset side is left out). The name
        is `setting`: a field called `key` reads as a credential and would be redacted."""
        record: dict[str, Any] = {"setting": self.key, "kind": self.kind}
        for name in ("old", "new"):
            value = getattr(self, name)
            if value is not UNSET:
                record[name] = value
        return record


def _show(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _defaults() -> dict[str, Any]:
    """Every key's default (unset ones absent): a key one config lacks compares as its default,
    so a checkpoint written before a setting existed does not read as changed."""
    return flatten_keys(TrainConfig(run=RunConfig(max_steps=1)).to_dict(secrets=False))


def diff_configs(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """The dotted keys whose values differ, in key order. Pass both as
    `TrainConfig.to_dict(secrets=False)` (a checkpoint stores that), so redaction matches."""
    defaults = _defaults()
    defaults.pop("run.max_steps")  # a budget, not a default
    old_flat, new_flat = flatten_keys(saved), flatten_keys(current)
    changes = []
    for key in sorted(set(old_flat) | set(new_flat)):
        if key in IGNORED:
            continue
        old = old_flat.get(key, defaults.get(key, UNSET))
        new = new_flat.get(key, defaults.get(key, UNSET))
        if old != new:
            changes.append(Change(key, old, new))
    return changes


# --------------------------------------------------------------------------------------------
# The rule


@dataclass(frozen=True, slots=True)
class ResumeChanges:
    """What differs from the checkpoint's config, after `check_resume_changes` allowed it."""

    changes: tuple[Change, ...] = ()

    @property
    def safe(self) -> list[Change]:
        return [c for c in self.changes if c.kind == SAFE]

    @property
    def optimization(self) -> list[Change]:
        return [c for c in self.changes if c.kind == OPTIMIZATION]

    @property
    def keeps_optimizer_state(self) -> bool:
        """False when the optimizer itself changed: its saved moments belong to another one."""
        return not any(c.key in ("optimizer.name", "task.optimizer") for c in self.changes)

    def event(self) -> dict[str, Any]:
        """The record for metrics.jsonl (the caller adds the step)."""
        return {"event": "config_changed", "changes": [c.to_dict() for c in self.changes]}


def check_resume_changes(
    saved: Mapping[str, Any] | None, current: Mapping[str, Any], allow: bool
) -> ResumeChanges:
    """Compare a checkpoint's config with this run's; raise `ConfigError` (one line listing the
    refused differences and the fix) for optimization changes unless `allow`.

    `saved` is the checkpoint's `config` (None for a checkpoint that stored none: nothing to
    compare). A `schedule.total_steps` equal to the horizon the run already had is no change.
    """
    if not saved:
        return ResumeChanges()
    horizon = schedule_horizon(saved)
    changes = tuple(
        c
        for c in diff_configs(saved, current)
        if not (c.key == "schedule.total_steps" and c.old is UNSET and c.new == horizon)
    )
    refused = [c for c in changes if c.kind == OPTIMIZATION]
    if refused and not allow:
        listed = ", ".join(c.describe() for c in refused)
        raise ConfigError(
            f"the config changes the optimization of the checkpoint it resumes: {listed}; {FIX}"
        )
    return ResumeChanges(changes)


def format_applied(changes: ResumeChanges, kept_horizon: int | None = None) -> str | None:
    """The one line a resume logs about its config changes; None when there are none.

    `kept_horizon` (optimizer steps) is the schedule horizon `resume_horizon` kept although a
    budget changed; the line then says so.
    """
    if not changes.changes:
        return None
    line = "config changed on resume, applied: " + ", ".join(
        c.describe() + (" (allowed)" if c.kind == OPTIMIZATION else "") for c in changes.changes
    )
    if kept_horizon is not None and any(c.key in BUDGET_KEYS for c in changes.changes):
        line += (
            f"; the learning-rate schedule keeps its horizon of {kept_horizon} steps "
            "(set schedule.total_steps to change it)"
        )
    return line


# --------------------------------------------------------------------------------------------
# Budgets and the schedule's horizon


def schedule_horizon(config: Mapping[str, Any], steps_per_epoch: int | None = None) -> int | None:
    """Optimizer steps the cosine schedule spans: schedule.total_steps, else run.max_steps,
    else run.max_epochs × `steps_per_epoch`; None when the config gives none of them."""
    run, schedule = config.get("run", {}), config.get("schedule", {})
    horizon = schedule.get("total_steps") or run.get("max_steps")
    if horizon is None and run.get("max_epochs") is not None and steps_per_epoch:
        horizon = run["max_epochs"] * steps_per_epoch
    return horizon


def resume_horizon(
    saved: Mapping[str, Any] | None,
    current: Mapping[str, Any],
    steps_per_epoch: int | None,
    trained: int | None = None,
) -> int | None:
    """The horizon (optimizer steps) a resumed run's schedule must use: this run's
    schedule.total_steps when it gives one, else the horizon the checkpoint was trained with,
    so that a larger budget does not move the cosine and make the learning rate jump. That is
    `trained`, the horizon its run used (a run resumed with a larger budget keeps its older
    one, and its config no longer says so), else the one its config gives (a checkpoint
    written before the horizon was kept in it)."""
    given = current.get("schedule", {}).get("total_steps")
    if given is not None:
        return int(given)
    if trained is not None:
        return int(trained)
    kept = schedule_horizon(saved or {}, steps_per_epoch)
    return kept if kept is not None else schedule_horizon(current, steps_per_epoch)


def _budget_value(key: str, value: Any) -> float | None:
    if value is None or value is UNSET:
        return None
    return parse_duration(value, key) if key == "run.max_time" else float(value)


def same_config(saved: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether `current` (`to_dict(secrets=False)`) is the config a run's config.toml holds
    (`thrifty.config.read_config_file`), read back as TOML so that a tuple equals the list it
    was written as. Where the run directory is (run.out) is no difference: this is that
    directory."""
    written = toml_loads(dump_toml(current))
    return not [c for c in diff_configs(saved, written) if c.key != "run.out"]


def budget_grew(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """The budget keys (run.max_steps, max_tokens, max_time, max_epochs) that are larger now
    or no longer set: what lets a finished run be resumed to train further."""
    grew = []
    for change in diff_configs(saved, current):
        if change.key not in BUDGET_KEYS:
            continue
        old = _budget_value(change.key, change.old)
        new = _budget_value(change.key, change.new)
        if old is not None and (new is None or new > old):
            grew.append(change)
    return grew


# --------------------------------------------------------------------------------------------
# config.toml: the current config, and what earlier resumes changed


def read_history(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The `[[config_changes]]` entries of a run's config.toml; [] when it has none (or when
    there is no readable file: the history is a record, never a reason to stop a run)."""
    try:
        history = read_config_toml(path).get(HISTORY_TABLE, [])
    except ConfigError:
        return []
    return history if isinstance(history, list) else []


def write_run_config(
    path: str | os.PathLike[str],
    config: Mapping[str, Any],
    *,
    step: int = 0,
    changes: Sequence[Change] = (),
    resumed: bool = False,
) -> None:
    """Write config.toml atomically: a header line that marks it as thrifty's (so that it is
    told from a user's config.toml: thrifty.rundir.own_files), `config` (pass
    `to_dict(secrets=False)`) and, after a resume, one `[[config_changes]]` table per change
    with the step, key, old and new values.

    Entries from earlier resumes are kept, except those at or after `step` (a resume from an
    earlier checkpoint replays them). `load_config` skips the table, so `thrifty train
    config.toml` starts the run again as it is now.
    """
    path = Path(path)
    history: list[dict[str, Any]] = []
    if resumed:
        history = [e for e in read_history(path) if e.get("step", 0) < step]
        history += [{"step": step, **c.to_dict()} for c in changes]
    data = dict(config)
    if history:
        data[HISTORY_TABLE] = history
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(CONFIG_HEADER_LINE + dump_toml(data))
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------
# Applying allowed optimizer changes after a checkpoint's state is loaded


def optimizer_settings(optimizer: Any) -> list[dict[str, Any]]:
    """Each param group's hyperparameters (lr, initial_lr, weight_decay, betas, ...) as this run
    built them; take them before a checkpoint's optimizer state overwrites them."""
    return [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]


def reapply_optimizer_settings(
    optimizer: Any, scheduler: Any, settings: Sequence[Mapping[str, Any]]
) -> None:
    """Put this run's hyperparameters back after loading a checkpoint (whose optimizer and
    LambdaLR state hold the old ones), and set each group's learning rate to the new peak rate
    times the schedule's factor at the step the schedule has reached."""
    for group, fresh in zip(optimizer.param_groups, settings, strict=True):
        group.update(fresh)
    scheduler.base_lrs = [g["initial_lr"] for g in optimizer.param_groups]
    for group, factor in zip(optimizer.param_groups, scheduler.lr_lambdas, strict=True):
        group["lr"] = group["initial_lr"] * factor(scheduler.last_epoch)
