"""Search the cost levers for the configuration with the lowest cost per token.

`thrifty tune CONFIG.toml` on the command line, `thrifty.tune(model_factory, data, config)` in
Python: short measured trials, each in its own process, in the seeds' order of impact
(precision, the micro-batch activation checkpointing makes room for, torch.compile, with the
data-loader workers measured first), within a time budget.

    space.py      the levers and their values on this hardware
    trials.py     one trial: `thrifty train` in a child process, and what it measured
    search.py     the order, the pruning and the budget
    pricing.py    dollars per token and the projected job, from the cost meter and the planner
    waterfall.py  baseline to winner, lever by lever
    configs.py    the trials' config and the winner's
    session.py    one tune from start to end; report.py what it prints; api.py `tune()`
"""

from __future__ import annotations

import sys
import types
from typing import Any

from thrifty.tune.api import TuneFailed, tune
from thrifty.tune.session import TuneResult

__all__ = ["TuneFailed", "TuneResult", "tune"]


class _CallablePackage(types.ModuleType):
    """`thrifty.tune` names both this package and its function. Once a submodule is imported,
    the attribute `thrifty.tune` is this package, so calling the package calls `tune`."""

    def __call__(self, *args: Any, **kwargs: Any) -> TuneResult:
        return tune(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
