"""`thrifty sweep` and `thrifty.sweep(...)`: a hyperparameter search over thrifty runs, on Optuna.

Each trial is a whole thrifty run (every lever, the run lock, spot-safe checkpoints, the guard)
in its own folder under the sweep's --out; Optuna samples the parameters, prunes the trials
that cannot win and stores the study. The modules, from the bottom up: `space` (SPACE.toml),
`study` (storage, identity, leases), `pruning` (the pruners, thrifty's forecast pruner among
them), `trial` (one trial in its warm worker, `thrifty.search.engine`), `results` (sweep.json, best.toml, dollars, the budget),
`runner` (the workers) and `plan` (the checks before the first trial).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def sweep(
    config: str | os.PathLike[str] | Mapping[str, Any],
    space: str | os.PathLike[str] | Mapping[str, Any],
    out: str | os.PathLike[str],
    *,
    trials: int | None = None,
    budget: str | None = None,
    pruner: str = "forecast",
    workers: int = 1,
    storage: str | None = None,
    study: str | None = None,
    overrides: Sequence[str] = (),
    hang_after: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run a sweep (or continue the one in `out`) and return its record, as sweep.json holds it.

    `config`: a TOML file (or its dict) that `thrifty train` runs; `space`: SPACE.toml (or its
    dict: {"optimizer.lr": {"low": 1e-4, "high": 3e-2, "log": True}, "batch.effective":
    {"choices": [32, 64]}}); `out`: the sweep's folder. `trials`: how many trials the study
    holds at most; `budget`: trial time ("2h") or dollars ("$40"); `pruner`: forecast, asha,
    hyperband, median or none; `workers`: trials at once on this machine; `storage`: a database
    URL shared by several machines (default: a journal file in `out`); `overrides`:
    "section.key=value" for every trial; `hang_after`: a trial that reports no step for this
    long ("30m", the default) is ended as hung, with its worker. Raises SweepStopped after SIGTERM or SIGINT (the same
    call continues the sweep), and SweepFailed when every trial failed or 3 in a row failed
    alike (sweep.json is written all the same; the message names the failure).
    """
    from pathlib import Path

    from thrifty.search.sweep.plan import SweepOptions, make_sweep
    from thrifty.search.sweep.runner import run_sweep

    options = SweepOptions(
        trials=trials,
        budget=budget,
        pruner=pruner,
        workers=workers,
        storage=storage,
        study=study,
        overrides=overrides,
        hang_after=hang_after,
    )
    plan = make_sweep(
        config if isinstance(config, Mapping) else Path(config),
        space if isinstance(space, Mapping) else Path(space),
        Path(out),
        options,
        say=say,
    )
    return run_sweep(plan)
