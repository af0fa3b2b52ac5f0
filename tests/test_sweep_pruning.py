"""The sweep's pruners decide what the algorithms say: Hyperband's brackets stop as many trials
as the synchronous algorithm prescribes (where Optuna's asynchronous one, on the same arrivals,
stops none), and the forecast pruner stops a trial whose forecast cannot beat the best finished
trial, saying at which step, with which forecast, against which bound."""

from __future__ import annotations

import math

import numpy as np
import optuna
from optuna.trial import TrialState

from thrifty.search.sweep import hyperband
from thrifty.search.sweep.pruning import ForecastPruner, explain


def test_the_brackets_are_hyperbands_own() -> None:
    # R/r = 9, eta = 3: brackets of 9, 5 and 3 trials (Li et al. 2018, Table 1 scaled down).
    plan = hyperband.brackets(every=10, last=90)
    assert [(b.s, b.size, b.rungs) for b in plan] == [(2, 9, (10, 30)), (1, 5, (30,)), (0, 3, ())]
    # R/r = 81: the paper's own table, n = 81, 34, 15, 8, 5.
    assert [b.size for b in hyperband.brackets(every=1, last=81)] == [81, 34, 15, 8, 5]


def simulate(losses: list[float], plan: list[hyperband.Bracket], limit: int) -> dict[int, int]:
    """Run the first bracket's trials one at a time, as one worker would: each trains to its
    next rung and asks; a paused trial waits and is decided when its bracket catches up.
    `losses[n]` is trial n's loss at every step (its rank never changes). Returns the step
    each stopped trial was pruned at."""
    curves: dict[int, dict[int, float]] = {}
    pruned: dict[int, int] = {}
    waiting: list[tuple[int, int]] = []  # (trial, rung)
    queue = [(n, 0) for n in range(limit)]  # (trial, index of its next rung)
    bracket = plan[0]
    while queue or waiting:
        if queue:
            n, k = queue.pop(0)
            if k == len(bracket.rungs):
                continue  # ran to the end
            rung = bracket.rungs[k]
            curves.setdefault(n, {})[rung] = losses[n]
            waiting.append((n, rung))
        still = []
        for n, rung in waiting:
            verdict = hyperband.decide(n, rung, curves, set(), plan, limit)
            if verdict.action == hyperband.WAIT:
                still.append((n, rung))
            elif verdict.action == hyperband.PRUNE:
                pruned[n] = rung
            else:
                queue.append((n, bracket.rungs.index(rung) + 1))
        if not queue and still == waiting:
            raise AssertionError(f"stuck: {still}")
        waiting = still
    return pruned


def test_a_bracket_of_nine_stops_eight_whatever_the_order_they_arrive_in() -> None:
    plan = hyperband.brackets(every=10, last=90)
    for losses in (
        [9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0],  # each better than all before it
        [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
        [5.0, 1.0, 8.0, 3.0, 9.0, 2.0, 7.0, 4.0, 6.0],
    ):
        pruned = simulate(losses, plan, limit=9)
        best = min(range(9), key=lambda n: losses[n])
        # 9 -> 3 at step 10 -> 1 at step 30: 6 + 2 stopped, the best one runs to the end.
        assert sorted(pruned.values()) == [10] * 6 + [30] * 2
        assert best not in pruned
        top3 = sorted(range(9), key=lambda n: losses[n])[:3]
        assert {n for n, step in pruned.items() if step == 30} == set(top3) - {best}


def test_optunas_asynchronous_hyperband_stops_none_of_the_same_arrivals() -> None:
    """The contrast the synchronous brackets exist for: with each trial better than the ones
    before it, an asynchronous rung promotes every arrival."""
    pruner = optuna.pruners.SuccessiveHalvingPruner(min_resource=10, reduction_factor=3)
    study = optuna.create_study(pruner=pruner)
    stopped = 0
    for n in range(9):
        trial = study.ask()
        loss = 9.0 - n
        for step in (10, 30, 90):
            trial.report(loss, step)
            if trial.should_prune():
                stopped += 1
                study.tell(trial, state=TrialState.PRUNED)
                break
        else:
            study.tell(trial, loss)
    assert stopped == 0  # the algorithm prescribes 8


def test_a_cut_short_bracket_decides_among_the_trials_it_has() -> None:
    plan = hyperband.brackets(every=10, last=90)
    pruned = simulate([4.0, 2.0, 3.0, 1.0], plan, limit=4)  # --trials 4: 4 -> 1 at step 10
    assert sorted(pruned) == [0, 1, 2] and set(pruned.values()) == {10}


def test_a_failed_trial_counts_as_the_worst_and_does_not_hold_its_bracket_up() -> None:
    plan = hyperband.brackets(every=10, last=90)
    curves = {n: {10: float(n)} for n in range(8)}  # trial 8 failed before step 10
    verdicts = [hyperband.decide(n, 10, curves, {8}, plan, None).action for n in range(8)]
    assert verdicts == ["go"] * 3 + ["prune"] * 5


# --- the forecast pruner -----------------------------------------------------------------------


def curve(a: float, b: float, c: float, steps: list[int]) -> list[float]:
    rng = np.random.default_rng(0)
    return [a + b * s**-c + 0.002 * rng.standard_normal() for s in steps]


def test_the_forecast_pruner_stops_a_trial_that_cannot_beat_the_best_and_says_why() -> None:
    pruner = ForecastPruner(min_evals=5, confidence=0.99, margin=0.05)
    study = optuna.create_study(pruner=pruner)
    best = study.ask()
    best.report(0.50, 1000)
    study.tell(best, 0.50)

    steps = list(range(20, 220, 20))
    losing = study.ask()  # heads for ~1.0, twice the best, with 1000 steps to go
    losing.set_user_attr(ForecastPruner.END_KEY, 1000)
    decisions = []
    for step, loss in zip(steps, curve(1.0, 2.0, 0.8, steps), strict=True):
        losing.report(loss, step)
        decisions.append(losing.should_prune())
    assert decisions[-1] and not decisions[0]
    first = decisions.index(True)
    assert first >= 5 - 1 + 2  # min_evals, then three forecasts in a row
    why = explain("forecast", pruner, study, study.trials[losing.number])
    assert why["step"] == steps[-1] and why["bound"] == 0.50 * 1.05
    assert why["forecast"]["low"] > why["bound"]
    assert "stays above the target" in why["reason"]

    winning = study.ask()  # heads below the best
    winning.set_user_attr(ForecastPruner.END_KEY, 1000)
    for step, loss in zip(steps, curve(0.3, 2.0, 0.5, steps), strict=True):
        winning.report(loss, step)
        assert not winning.should_prune()


def test_the_forecast_pruner_waits_for_a_finished_trial() -> None:
    pruner = ForecastPruner(min_evals=5, confidence=0.99, margin=0.05)
    study = optuna.create_study(pruner=pruner)
    trial = study.ask()
    trial.set_user_attr(ForecastPruner.END_KEY, 1000)
    for step in range(20, 220, 20):
        trial.report(10.0 + 1 / step, step)
        assert not trial.should_prune()  # nothing to beat yet
    assert math.isfinite(trial.study.trials[0].intermediate_values[200])
