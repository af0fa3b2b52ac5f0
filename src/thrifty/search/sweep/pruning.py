"""Which trials a sweep stops early: Optuna's pruners by name, and thrifty's forecast pruner.

A trial reports its validation loss at each evaluation (`thrifty.callbacks.trial_report`;
`thrifty.search.sweep.verdicts` asks the pruner); the pruner sees every trial's reports in the study
and says whether this one goes on. Its decision depends on the study alone, so a sweep stopped
and run again decides exactly as if it had not stopped.

- `asha`: asynchronous successive halving; rungs at f × 3^k steps, f the first evaluation after
  the schedule's warm-up (eval.every without one), a trial goes on past a rung when it is in the
  best third of the trials that reached it.
- `hyperband`: synchronous successive halving in Hyperband's brackets, from eval.every after the
  warm-up to the run's last step, reduction factor 3 (`thrifty.search.sweep.hyperband`: a trial
  that reaches a rung first is paused until its bracket has, so that as many stop as the
  algorithm says).
- `median`: stops a trial worse than the median of the earlier trials at the same step, after 5
  trials, from the first evaluation after the warm-up on (eval.every without one).

During the warm-up (schedule.warmup_steps) the learning rate is still climbing and the highest
rates lead, so `asha`, `hyperband` and `median` never judge a trial at or before its last step;
where no evaluation before run.max_steps is left to judge at, the sweep is refused in one line.
- `forecast`: thrifty's own. The guard's learning-curve forecast (`thrifty.measure.forecast`) is
  fitted to the trial's reports and extended to its last step; the trial stops when even the
  optimistic edge of the band, at guard.forecast_confidence (99%), misses the best finished
  trial by more than FORECAST_MARGIN (5%), three forecasts in a row, after
  guard.forecast_min_evals evaluations. The margin is the guard's own idea (what a fit to the
  curve so far cannot see: the late drop of a decaying learning rate) at a smaller size: every
  trial of a sweep runs the same schedule, and the best one's value already holds that drop.
- `none`: every trial runs to its end.
"""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from thrifty.errors import ConfigError
from thrifty.search.sweep import hyperband

PRUNERS = ("forecast", "asha", "hyperband", "median", "none")
REDUCTION = 3
MEDIAN_STARTUP_TRIALS = 5
FORECAST_MARGIN = 0.05


def make_pruner(
    name: str, every: int, guard: Any, *, warmup: int = 0, last: int | None = None
) -> optuna.pruners.BasePruner:
    """The pruner called `name` (see the module's docstring) for trials evaluated every
    `every` steps, after a warm-up of `warmup` steps, up to step `last` (None: unknown);
    `guard` is the config's [guard] section. Raises ConfigError, one line, where the warm-up
    leaves `asha`, `hyperband` or `median` no evaluation to judge at (`check_rungs`)."""
    check_rungs(name, every, warmup, last)
    first = hyperband.first_judged(every, warmup)  # `every` without a warm-up
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=MEDIAN_STARTUP_TRIALS, n_warmup_steps=first
        )
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=first, reduction_factor=REDUCTION
        )
    if name == "hyperband":  # decided by thrifty.search.sweep.hyperband, not by an Optuna pruner
        return optuna.pruners.NopPruner()
    if name == "forecast":
        return ForecastPruner(
            min_evals=guard.forecast_min_evals,
            confidence=guard.forecast_confidence,
            margin=FORECAST_MARGIN,
        )
    raise ConfigError(f"--pruner {name!r} is unknown: use one of {', '.join(PRUNERS)}")


def check_rungs(name: str, every: int, warmup: int, last: int | None) -> None:
    """Refuse, in one line (ConfigError), a pruner among `asha`, `hyperband` and `median` that
    has nowhere to judge between the warm-up's end (step `warmup` > 0) and step `last`: its
    first rung would be inside the warm-up. Hyperband needs `last` at least 3 evaluations past
    the last evaluation of the warm-up (`thrifty.search.sweep.hyperband`)."""
    if warmup <= 0 or last is None or name not in ("asha", "hyperband", "median"):
        return
    if name == "hyperband":
        if hyperband.has_rungs(hyperband.brackets(every, last, warmup=warmup)):
            return
        least = warmup // every * every + REDUCTION * every
        needs = f"its brackets need run.max_steps {least} or more"
    else:
        first = hyperband.first_judged(every, warmup)
        if first < last:
            return
        needs = f"the first evaluation after the warm-up, step {first}, is not before the last"
    raise ConfigError(
        f"--pruner {name}: no rung fits between the warm-up's end (step {warmup}) and "
        f"run.max_steps {last} with eval.every {every} ({needs}): give more steps, a shorter "
        "schedule.warmup_steps, or --pruner none"
    )


def _last_step(trial: FrozenTrial) -> int | None:
    return max(trial.intermediate_values) if trial.intermediate_values else None


def _curve(trial: FrozenTrial) -> tuple[list[int], list[float]]:
    steps = sorted(s for s in trial.intermediate_values if s > 0)
    return steps, [trial.intermediate_values[s] for s in steps]


def best_value(study: optuna.Study) -> float | None:
    """The best value of the study's finished (COMPLETE) trials, or None before there is one."""
    values = [
        t.value
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.value is not None and math.isfinite(t.value)
    ]
    return min(values) if values else None


class ForecastPruner(optuna.pruners.BasePruner):
    """The forecast pruner (see the module's docstring). `explain` gives the decision's
    reason, forecast and the bound it failed, for the sweep's record of a pruned trial."""

    END_KEY = "thrifty.end_step"  # the trial's last step, which its run reports

    def __init__(self, *, min_evals: int, confidence: float, margin: float) -> None:
        self.min_evals, self.confidence, self.margin = min_evals, confidence, margin

    def decide(self, study: optuna.Study, trial: FrozenTrial) -> Any:
        """`thrifty.measure.forecast.Decision`, or None when there is nothing to compare with."""
        from thrifty.measure.forecast import cannot_reach

        best = best_value(study)
        end = trial.user_attrs.get(self.END_KEY)
        steps, values = _curve(trial)
        if best is None or not isinstance(end, int) or not steps:
            return None
        return cannot_reach(
            steps,
            values,
            best,
            end,
            min_evals=self.min_evals,
            confidence=self.confidence,
            margin=self.margin,
        )

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        decision = self.decide(study, trial)
        return bool(decision)

    def explain(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        decision = self.decide(study, trial)
        best = best_value(study)
        if decision is None or best is None:
            return {}
        out: dict[str, Any] = {"reason": decision.reason}
        if decision.forecast is not None:
            out["forecast"] = decision.forecast.to_dict()
        out["bound"] = best * (1 + self.margin)
        return out


def explain(name: str, pruner: Any, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
    """Why `pruner` stopped `trial`, at which step, against what: `step`, `value`, `reason`
    and, for the forecast pruner, `forecast` and `bound`."""
    step = _last_step(trial)
    value = trial.intermediate_values.get(step) if step is not None else None
    out: dict[str, Any] = {"step": step, "value": value, "pruner": name}
    if isinstance(pruner, ForecastPruner):
        out.update(pruner.explain(study, trial))
        return out
    others = [
        t.intermediate_values[step]
        for t in study.get_trials(deepcopy=False)
        if t.number != trial.number and step in t.intermediate_values
    ]
    if value is None:
        out["reason"] = f"stopped by the {name} pruner"
    elif name == "median" and others:
        median = sorted(others)[len(others) // 2]
        out["bound"] = median
        out["reason"] = (
            f"loss {value:.4g} at step {step} is worse than the median {median:.4g} of "
            f"{len(others)} other trials there"
        )
    elif others:
        ranked = sorted([*others, value])
        keep = max(1, len(ranked) // REDUCTION)
        out["bound"] = ranked[keep - 1]
        out["reason"] = (
            f"loss {value:.4g} at step {step} is not in the best 1/{REDUCTION} of the "
            f"{len(ranked)} trials that reached it (needs {ranked[keep - 1]:.4g} or less)"
        )
    else:
        out["reason"] = f"stopped by the {name} pruner at step {step}"
    return out
