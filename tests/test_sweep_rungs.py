"""Where the sweep's pruners judge: never at or before the schedule's warm-up's last step, while
the learning rate still climbs and the highest rates lead. Hyperband counts its resource from the
warm-up (its brackets and rungs), ASHA and the median pruner start at the first evaluation after
it, and a sweep whose warm-up leaves no rung before run.max_steps is refused in one line."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from test_sweep import write_inputs
from test_sweep_input import one_line_error, sweep_args
from thrifty.errors import ConfigError
from thrifty.search.sweep import hyperband
from thrifty.search.sweep.plan import SweepOptions, make_sweep
from thrifty.search.sweep.pruning import make_pruner


def shape(plan: list[hyperband.Bracket]) -> list[tuple[int, int, tuple[int, ...]]]:
    return [(b.s, b.size, b.rungs) for b in plan]


def test_hyperband_counts_its_resource_from_the_warm_up() -> None:
    # 90 steps, a 30-step warm-up, eval.every 10: R = 90 - 30 = 60, R/r = 6, s_max = 1.
    plan = hyperband.brackets(every=10, last=90, warmup=30)
    assert shape(plan) == [(1, 3, (40,)), (0, 2, ())]
    assert hyperband.round_size(plan) == 5
    # Longer trials: rungs at 30 + 10 × 3^k, each bracket's sizes Hyperband's own.
    assert shape(hyperband.brackets(every=10, last=300, warmup=30)) == [
        (3, 27, (40, 60, 120)),
        (2, 12, (60, 120)),
        (1, 6, (120,)),
        (0, 4, ()),
    ]
    # A warm-up between evaluations counts from the last evaluation inside it (step 20).
    assert shape(hyperband.brackets(every=10, last=90, warmup=25)) == [(1, 3, (30,)), (0, 2, ())]


def test_without_a_warm_up_the_brackets_are_as_they_were() -> None:
    today = [(2, 9, (10, 30)), (1, 5, (30,)), (0, 3, ())]
    assert shape(hyperband.brackets(every=10, last=90)) == today
    assert shape(hyperband.brackets(every=10, last=90, warmup=0)) == today
    # A warm-up over before the first evaluation moves nothing (the sweep tests' 2 steps).
    assert shape(hyperband.brackets(every=10, last=30, warmup=2)) == [(1, 3, (10,)), (0, 2, ())]


@pytest.mark.parametrize("every", [1, 7, 10, 20])
@pytest.mark.parametrize("warmup", [0, 1, 9, 10, 30, 55])
@pytest.mark.parametrize("last", [40, 90, 300, 1000])
def test_every_rung_is_an_evaluation_after_the_warm_up_and_before_the_end(
    every: int, warmup: int, last: int
) -> None:
    plan = hyperband.brackets(every=every, last=last, warmup=warmup)
    for bracket in plan:
        assert list(bracket.rungs) == sorted(set(bracket.rungs))
        for rung in bracket.rungs:
            assert warmup < rung < last and rung % every == 0
    assert hyperband.first_judged(every, warmup) > warmup
    assert hyperband.first_judged(every, warmup) - every <= warmup


def test_judging_at_the_warm_up_keeps_the_wrong_trial_and_after_it_the_right_one() -> None:
    """The measured harm, in miniature: during a 30-step warm-up the highest learning rate
    leads; after it the best one does. Judged inside the warm-up (the brackets that ignore it),
    the best trial is pruned; judged after it, it survives its bracket."""

    def loss(n: int, step: int) -> float:
        if step <= 30:  # trial 0 (the highest rate) leads while the rate climbs, 2 trails
            return {0: 1.0, 2: 20.0}.get(n, 2.0 + n)
        return 0.5 if n == 2 else 3.0 + n  # trial 2 is the best configuration

    def stopped(plan: list[hyperband.Bracket]) -> set[int]:
        first = plan[0]
        limit = first.size
        curves = {n: {step: loss(n, step) for step in first.rungs} for n in range(limit)}
        verdicts = [
            hyperband.decide(n, first.rungs[0], curves, set(), plan, limit) for n in range(limit)
        ]
        return {n for n, v in enumerate(verdicts) if v.action == hyperband.PRUNE}

    blind = hyperband.brackets(every=10, last=90)  # its first rung, step 10, is in the warm-up
    assert 2 in stopped(blind) and 0 not in stopped(blind)
    aware = hyperband.brackets(every=10, last=90, warmup=30)
    assert 2 not in stopped(aware) and 0 in stopped(aware)


def test_hyperband_says_go_at_every_evaluation_inside_the_warm_up() -> None:
    plan = hyperband.brackets(every=10, last=90, warmup=30)
    curves = {n: {s: float(n) for s in range(10, 100, 10)} for n in range(3)}
    for step in (10, 20, 30):
        assert all(
            hyperband.decide(n, step, curves, set(), plan, 3).action == "go" for n in range(3)
        )
    assert [hyperband.decide(n, 40, curves, set(), plan, 3).action for n in range(3)] == [
        "go",
        "prune",
        "prune",
    ]


@pytest.mark.parametrize("name", ["asha", "median"])
def test_asha_and_median_first_judge_at_the_first_evaluation_after_the_warm_up(name: str) -> None:
    """A trial far worse than every other at every step is left alone through the warm-up
    (steps 10 to 30) and stopped at step 40, the first evaluation after it."""
    pruner = make_pruner(name, 10, None, warmup=30, last=90)
    study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
    for n in range(6):
        trial = study.ask()
        for step in range(10, 100, 10):
            trial.report(1.0 + n / 10, step)
            trial.should_prune()  # ASHA keeps a rung's value when it is asked there
        study.tell(trial, 1.0 + n / 10)
    worst = study.ask()
    judged = {}
    for step in range(10, 100, 10):
        worst.report(100.0, step)
        judged[step] = worst.should_prune()
        if judged[step]:
            break
    study.tell(worst, state=TrialState.PRUNED)
    assert judged == {10: False, 20: False, 30: False, 40: True}


def test_asha_and_median_without_a_warm_up_judge_from_eval_every() -> None:
    median = make_pruner("median", 10, None)
    asha = make_pruner("asha", 10, None)
    assert isinstance(median, optuna.pruners.MedianPruner)
    assert isinstance(asha, optuna.pruners.SuccessiveHalvingPruner)
    assert median._n_warmup_steps == 10 and asha._min_resource == 10


@pytest.mark.parametrize("name", ["hyperband", "asha", "median"])
def test_a_warm_up_that_leaves_no_rung_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as error:
        make_pruner(name, 10, None, warmup=30, last=35)
    text = str(error.value)
    assert "\n" not in text
    assert text.startswith(
        f"--pruner {name}: no rung fits between the warm-up's end (step 30) and run.max_steps 35 "
        "with eval.every 10"
    )
    assert text.endswith("give more steps, a shorter schedule.warmup_steps, or --pruner none")
    # Hyperband names the steps its brackets need: the warm-up's last evaluation + 3 × 10.
    assert name != "hyperband" or "need run.max_steps 60 or more" in text
    make_pruner(name, 10, None, warmup=30, last=60)  # enough steps: accepted


def test_the_command_line_refuses_it_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, space = write_inputs(tmp_path, steps=35)
    out = tmp_path / "out"
    argv = sweep_args(config, space, out, "--pruner", "hyperband")
    err = one_line_error(capsys, [*argv, "--set", "schedule.warmup_steps=30"])
    assert "no rung fits between the warm-up's end (step 30) and run.max_steps 35" in err
    assert not out.exists()


def test_a_searched_warm_up_places_the_rungs_after_the_longest(tmp_path: Path) -> None:
    config, _ = write_inputs(tmp_path, steps=90)
    space = {
        "optimizer.lr": {"low": 0.001, "high": 0.3, "log": True},
        "schedule.warmup_steps": {"choices": [0, 30]},
    }
    options = SweepOptions(pruner="hyperband")
    sweep = make_sweep(config, space, tmp_path / "out", options, say=lambda _: None)
    assert sweep.setup.brackets is not None
    assert shape(sweep.setup.brackets) == [(1, 3, (40,)), (0, 2, ())]
    assert sweep.trials == 5  # one round of those brackets
