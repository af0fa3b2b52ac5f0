"""--budget: no trial starts that the rest of the budget cannot pay for, counted in trial time or
dollars at the mean full cost of the finished trials; a trial in flight is never cut off."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from thrifty.errors import ThriftyError
from thrifty.search.sweep.results import budget_allows
from thrifty.search.sweep.runner import Budget
from thrifty.search.sweep.trial import FACTS_KEY, SECONDS_KEY


def study_with(*trials: tuple[str, float, float | None, int, int]) -> optuna.Study:
    """Trials as (state, seconds, usd, steps run, last step); a step takes 0.4 s."""
    study = optuna.create_study()
    for state, seconds, usd, steps, end in trials:
        trial = study.ask()
        trial.set_user_attr(SECONDS_KEY, seconds)
        price = None if usd is None else usd / seconds
        facts = {"steps": steps, "step_seconds": 0.4, "usd_per_second": price}
        trial.set_user_attr(FACTS_KEY, facts)
        trial.set_user_attr("thrifty.end_step", end)
        trial.report(1.0, steps)
        if state == "complete":
            study.tell(trial, 1.0)
        elif state == "pruned":
            study.tell(trial, state=TrialState.PRUNED)
    return study


def allows(study: optuna.Study, budget: Budget) -> bool:
    said: list[str] = []
    verdict = budget_allows(study.get_trials(), budget, said.append)
    assert verdict or len(said) == 1
    return verdict


def test_a_time_budget_pays_for_what_ran_and_one_more_at_the_mean_full_cost() -> None:
    # 40 s complete, and a pruned one that ran 10 s to step 25 of 100 (+ 75 x 0.4 s in full).
    study = study_with(("complete", 40.0, None, 100, 100), ("pruned", 10.0, None, 25, 100))
    assert allows(study, Budget(seconds=90.0))  # used 50 + expected 40 = 90
    assert not allows(study, Budget(seconds=89.0))


def test_a_running_trial_counts_at_its_expected_cost() -> None:
    study = study_with(("complete", 40.0, None, 100, 100), ("running", 5.0, None, 10, 100))
    assert allows(study, Budget(seconds=125.0))  # 45 used, 2 x 40 expected
    assert not allows(study, Budget(seconds=124.0))


def test_a_dollar_budget_counts_the_runs_own_dollars() -> None:
    study = study_with(("complete", 40.0, 2.0, 100, 100), ("complete", 40.0, 4.0, 100, 100))
    assert allows(study, Budget(usd=9.0))  # 6 used + mean 3
    assert not allows(study, Budget(usd=8.99))


def test_before_any_trial_finished_the_first_ones_start() -> None:
    assert allows(study_with(("running", 5.0, None, 10, 100)), Budget(seconds=1.0))
    assert allows(optuna.create_study(), Budget(usd=0.01))


@pytest.mark.parametrize(
    ("text", "budget"),
    [("2h", Budget(seconds=7200.0)), ("90m", Budget(seconds=5400.0)), ("$40", Budget(usd=40.0))],
)
def test_a_budget_reads_as_time_or_dollars(text: str, budget: Budget) -> None:
    assert Budget.parse(text) == budget


@pytest.mark.parametrize("text", ["$-1", "$zero", "0s", "later"])
def test_a_bad_budget_is_one_line(text: str) -> None:
    with pytest.raises(ThriftyError) as caught:
        Budget.parse(text)
    assert "--budget" in str(caught.value) and "\n" not in str(caught.value)


def test_each_worker_has_a_gpu_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    from thrifty.search.sweep.runner import _device_env, visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    gpus = visible_gpus()
    assert [_device_env(gpus, i) for i in range(4)] == [
        {"CUDA_VISIBLE_DEVICES": "2"},
        {"CUDA_VISIBLE_DEVICES": "3"},
        {"CUDA_VISIBLE_DEVICES": "5"},
        {"CUDA_VISIBLE_DEVICES": "2"},  # more workers than GPUs: shared round-robin
    ]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _device_env(visible_gpus(), 0) == {}  # no GPU: the trials' environment as it is


def test_each_trial_gets_its_share_of_the_cores_unless_you_set_the_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from thrifty.search.sweep.runner import trial_env

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    shares = [(e["OMP_NUM_THREADS"], e["MKL_NUM_THREADS"]) for e in map(trial_env, (1, 2, 3, 16))]
    assert shares == [("8", "8"), ("4", "4"), ("2", "2"), ("1", "1")]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # yours: kept, as `--nprocs` keeps it
    assert (trial_env(2)["OMP_NUM_THREADS"], trial_env(2)["MKL_NUM_THREADS"]) == ("3", "3")
    monkeypatch.setenv("MKL_NUM_THREADS", "5")
    assert (trial_env(2)["OMP_NUM_THREADS"], trial_env(2)["MKL_NUM_THREADS"]) == ("3", "5")
