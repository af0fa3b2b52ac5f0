"""Search the cost levers for the configuration with the lowest cost per token.

`thrifty tune CONFIG.toml` on the command line, `thrifty.tune(model_factory, data, config)` in
Python (`thrifty.search.tune.tune`): short measured trials, each in its own process, in the
seeds' order of impact (precision, the micro-batch activation checkpointing makes room for, torch.compile, with the
data-loader workers measured first), within a time budget.

    space.py      the levers and their values on this hardware
    trials.py     one trial: `thrifty train` in a child process, and what it measured
    search.py     the order, the pruning and the budget
    compare.py    a candidate against the incumbent in alternating runs; paired.py its statistics
    pricing.py    dollars per token and the projected job, from the cost meter and the planner
    waterfall.py  baseline to winner, lever by lever
    configs.py    the trials' config and the winner's
    session.py    one tune from start to end; report.py what it prints; api.py `tune()`
    outdir.py     --out: what a tune writes, what it refuses, the unfinished tune it resumes
    stopping.py   SIGTERM and SIGINT: the running trial ended, one line, exit code 75
"""

from __future__ import annotations

from thrifty.search.tune.api import TuneFailed, tune
from thrifty.search.tune.session import TuneResult
from thrifty.search.tune.stopping import TuneStopped

__all__ = ["TuneFailed", "TuneResult", "TuneStopped", "tune"]
