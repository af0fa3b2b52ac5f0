"""Everything a sweep is checked for before its first trial: the config, the space, --out,
the storage, the pruner and the budget. Bad input is one line (ConfigError, ThriftyError).
"""

from __future__ import annotations

import os
import re
import socket
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.config import (
    TrainConfig,
    dump_toml,
)
from thrifty.config.checks import parse_duration
from thrifty.errors import ConfigError, ThriftyError
from thrifty.redact import redact_value
from thrifty.rundir.own_files import is_own_report
from thrifty.search.sweep import hyperband, pruning
from thrifty.search.sweep.results import BEST_TOML, CONFIG_KEY, SWEEP_JSON
from thrifty.search.sweep.runner import Budget, Sweep, trial_env
from thrifty.search.sweep.space import Space, parse_space, read_config, read_space
from thrifty.search.sweep.study import JOURNAL, fingerprint, load_or_create, open_storage
from thrifty.search.sweep.trial import HANG_SECONDS, PLACE_KEYS, TrialSetup

# What a sweep writes in --out; anything else there is someone else's and refused.
OWN = (JOURNAL, f"{JOURNAL}.lock", SWEEP_JSON, BEST_TOML, "trials", "workers")
_TEMPORARY = re.compile(rf"\.({re.escape(SWEEP_JSON)}|{re.escape(BEST_TOML)})\.tmp-\d+")
_TRIAL_DIR = re.compile(r"\d{4,}")
_WORKER_LOG = re.compile(r"worker-\d+\.log")  # a warm worker's own output (thrifty.search.engine)
# The sweep's folders in --out: what each holds (its entries' names, and whether they are folders).
_FOLDERS = {"trials": (_TRIAL_DIR, True), "workers": (_WORKER_LOG, False)}
REPORT_HTML = "report.html"  # the page `thrifty report DIR` draws of the sweep, in its --out


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepOptions:
    """How a sweep runs, as `thrifty.search.sweep.sweep` and `thrifty sweep` take it: the most
    `trials`, the `budget`, the `pruner`, the `workers` on this machine, the `storage` and
    `study` several machines share, the `overrides` ("section.key=value") of every trial, and
    `hang_after`: how long a trial may report no step before it is ended as hung ("30m")."""

    trials: int | None = None
    budget: str | None = None
    pruner: str = "forecast"
    workers: int = 1
    storage: str | None = None
    study: str | None = None
    overrides: Sequence[str] = ()
    hang_after: str | None = None


def make_sweep(
    config: str | Path | Mapping[str, Any],
    space: str | Path | Mapping[str, Any],
    out: str | Path,
    options: SweepOptions | None = None,
    *,
    seed: int | None = None,
    say: Callable[[str], None] = print,
) -> Sweep:
    """A sweep ready to run; see `thrifty.search.sweep.sweep`."""
    o = options or SweepOptions()
    trials, budget, pruner, workers, storage = o.trials, o.budget, o.pruner, o.workers, o.storage
    if trials is not None and trials < 1:
        raise ThriftyError(f"--trials {trials} is invalid: at least 1")
    if workers < 1:
        raise ThriftyError(f"--workers {workers} is invalid: at least 1")
    hang = HANG_SECONDS if o.hang_after is None else parse_duration(o.hang_after, "--hang-after")
    if pruner not in pruning.PRUNERS:
        raise ThriftyError(
            f"--pruner {pruner!r} is unknown: use one of {', '.join(pruning.PRUNERS)}"
        )
    given = read_config(config, o.overrides)
    where = "the config" if isinstance(config, Mapping) else str(config)
    cfg = TrainConfig.from_dict(given)
    if cfg.run.out is not None:
        raise ConfigError(
            f"{where} sets run.out = {cfg.run.out!r}: each trial runs in its own folder under "
            "--out; remove run.out for a sweep"
        )
    if isinstance(space, Mapping):
        the_space = parse_space(space, given)
    else:
        the_space = read_space(space, given)
    the_budget = Budget.parse(budget)
    if (
        the_budget.usd is not None
        and cfg.cost.instance is None
        and cfg.cost.usd_per_gpu_hour is None
    ):
        raise ConfigError(
            f"--budget {budget} is in dollars but {where} has no price: set cost.instance or "
            "cost.usd_per_gpu_hour (or give the budget as a time, e.g. 2h)"
        )
    _check_one_trial_fits(cfg, the_budget, budget)
    if pruner == "hyperband" and cfg.run.max_steps is None:
        raise ConfigError(
            f"--pruner hyperband needs run.max_steps in {where}: its brackets run from "
            "eval.every to the last step"
        )
    warmup = _longest_warmup(cfg, the_space)
    the_pruner = pruning.make_pruner(
        pruner, cfg.eval.every, cfg.guard, warmup=warmup, last=cfg.run.max_steps
    )
    folder = Path(out)
    _check_out(folder)
    folder.mkdir(parents=True, exist_ok=True)
    store = open_storage(folder, storage)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print_ = fingerprint(given, the_space.canonical())
    the_study = load_or_create(store, o.study or _study_name(folder), print_, the_pruner)
    base_seed = seed if seed is not None else cfg.run.seed
    if storage is not None:  # several machines ask at once: each its own stream
        base_seed += zlib.crc32(f"{socket.gethostname()}:{os.getpid()}".encode())
    if CONFIG_KEY not in the_study.user_attrs:
        the_study.set_user_attr(CONFIG_KEY, redact_value(given))
        the_study.set_user_attr("thrifty.space", the_space.to_dict())
        the_study.set_user_attr("thrifty.pruner", pruner)
    plan_brackets = None
    if pruner == "hyperband":
        assert cfg.run.max_steps is not None
        plan_brackets = hyperband.brackets(cfg.eval.every, cfg.run.max_steps, warmup=warmup)
        if trials is None and the_budget.seconds is None and the_budget.usd is None:
            trials = hyperband.round_size(plan_brackets)  # one round of every bracket
    places = {
        key: place
        for key in PLACE_KEYS
        if (place := getattr(cfg.checkpoint, key.partition(".")[2])) is not None
    }
    setup = TrialSetup(
        hang_seconds=hang,
        places=places,
        given=given,
        study=the_study.study_name,
        config_text=_config_text(config),
        overrides=list(o.overrides),
        out=folder,
        env=trial_env(workers),
        pruner_name=pruner,
        pruner=the_pruner,
        storage=store,
        brackets=plan_brackets,
        trials=trials,
    )
    return Sweep(the_study, setup, the_space, trials, the_budget, workers, say, base_seed)


def _longest_warmup(cfg: TrainConfig, space: Space) -> int:
    """The longest warm-up (schedule.warmup_steps) a trial may have: the config's, or the
    largest the space gives when it searches it. The pruners judge only after it."""
    longest = cfg.schedule.warmup_steps
    for param in space.params:
        if param.key == "schedule.warmup_steps":
            values = param.choices if param.choices is not None else (param.low, param.high)
            longest = max(int(v) for v in values if isinstance(v, int | float))
    return longest


def _config_text(config: str | Path | Mapping[str, Any]) -> bytes:
    """What each trial's run reads as its config (sent on its stdin, never written): the file
    as given, or the config given as a dict, as TOML."""
    if isinstance(config, Mapping):
        return dump_toml(config).encode()
    return Path(config).read_bytes()


def _check_one_trial_fits(cfg: TrainConfig, budget: Budget, text: str | None) -> None:
    """A budget below one trial's own time limit (run.max_time) cannot pay for a trial."""
    seconds = cfg.run.max_seconds
    if seconds is None:
        return
    if budget.seconds is not None and budget.seconds < seconds:
        raise ThriftyError(
            f"--budget {text} is less than one trial (run.max_time = {cfg.run.max_time}): "
            "raise the budget or lower run.max_time"
        )


def _check_out(out: Path) -> None:
    """--out is a folder a sweep may write in: new, empty, or a sweep's own."""
    if out.exists() and not out.is_dir():
        raise ThriftyError(f"--out {out} is a file: give a directory")
    if not out.is_dir():
        return
    strangers = []
    for entry in sorted(out.iterdir()):
        lock = entry.name == f"{JOURNAL}.lock"  # the journal's lock: a symlink while held
        report = entry.name == REPORT_HTML and entry.is_file() and is_own_report(entry)
        if (entry.is_symlink() and not lock) or not (
            entry.name in OWN or _TEMPORARY.fullmatch(entry.name) or report
        ):
            strangers.append(entry.name)
        elif entry.name in _FOLDERS:
            strangers += _strangers_in(entry, *_FOLDERS[entry.name])
    if strangers:
        more = f" and {len(strangers) - 1} more" if len(strangers) > 1 else ""
        raise ThriftyError(
            f"--out {out} holds {strangers[0]}{more}, which thrifty sweep did not write: choose "
            "a new or empty --out; a sweep never deletes or replaces what it did not write"
        )


def _strangers_in(folder: Path, pattern: re.Pattern[str], folders: bool) -> list[str]:
    """What a sweep's own folder holds that the sweep did not write: the folder itself when
    it is a symlink or a file, else each entry that is a symlink, not a folder (`folders`) or
    not a file, or not named as `pattern` says."""
    if folder.is_symlink() or not folder.is_dir():
        return [folder.name]
    return [
        f"{folder.name}/{e.name}"
        for e in sorted(folder.iterdir())
        if e.is_symlink() or e.is_dir() != folders or not pattern.fullmatch(e.name)
    ]


def _study_name(out: Path) -> str:
    """The default study name: the --out folder's name (the same on every machine that joins
    one sweep through --storage)."""
    return out.resolve().name or "thrifty-sweep"
