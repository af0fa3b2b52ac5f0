"""What a sweep says pruning saved: the trials' sessions as paid (every session's start-up, so a
trial paused at a Hyperband rung and resumed pays two) against every trial run once to its end
in a process of its own (one start-up each, its steps at the pace its sessions ran them, one
exit). When the added start-ups cost more than the steps not run, the line says pruning cost
more, never that it saved."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from thrifty.search.sweep.report import compute_line, print_table
from thrifty.search.sweep.results import sweep_record
from thrifty.search.sweep.trial import (
    FACTS_KEY,
    SECONDS_KEY,
    SESSIONS_KEY,
    SessionClock,
    session_record,
)

END_KEY = "thrifty.end_step"


def session(seconds: float, startup: float, steps: int, tail: float) -> dict[str, float]:
    return {"seconds": seconds, "startup_seconds": startup, "steps": steps, "tail_seconds": tail}


def add_trial(
    study: optuna.Study,
    state: str,
    sessions: list[dict[str, float]] | None,
    steps: int,
    end: int = 30,
    step_seconds: float = 0.4,
    seconds: float | None = None,
) -> None:
    """A trial that ran `steps` of `end` in `sessions` (its seconds their sum, or `seconds`)."""
    trial = study.ask()
    paid = seconds if seconds is not None else sum(s["seconds"] for s in sessions or [])
    trial.set_user_attr(SECONDS_KEY, paid)
    if sessions is not None:
        trial.set_user_attr(SESSIONS_KEY, sessions)
    facts = {"steps": steps, "step_seconds": step_seconds, "usd_per_second": 0.01}
    trial.set_user_attr(FACTS_KEY, facts)
    trial.set_user_attr(END_KEY, end)
    trial.report(1.0, min(steps, 10))
    if state == "complete":
        study.tell(trial, 1.0)
    else:
        study.tell(trial, state=TrialState.PRUNED)


# Each session: 15-16 s to its first step, 0.4 s a step (evaluations included), 1-2 s to exit.
PAUSED_AND_RESUMED = [session(20.0, 15.0, 10, 1.0), session(26.0, 16.0, 20, 2.0)]
PRUNED_AT_10 = [session(20.0, 15.0, 10, 1.0)]
RAN_ONCE = [session(28.0, 15.0, 30, 1.0)]


def test_a_paused_and_resumed_trial_pays_two_start_ups_and_the_unpruned_sweep_one() -> None:
    study = optuna.create_study()
    add_trial(study, "complete", PAUSED_AND_RESUMED, steps=30)
    add_trial(study, "pruned", PRUNED_AT_10, steps=10)
    record = sweep_record(study)
    resumed, pruned = record["trials"]
    # One start-up (15), 30 steps at (4 + 8) / 30 = 0.4 s, its last exit (2).
    assert resumed["seconds"] == 46.0
    assert resumed["unpruned_seconds"] == pytest.approx(15.0 + 30 * 0.4 + 2.0)
    assert resumed["sessions"] == 2 and resumed["startup_seconds"] == 31.0
    # Pruned at step 10 of 30: the 20 steps it did not run at its own pace.
    assert pruned["unpruned_seconds"] == pytest.approx(15.0 + 30 * 0.4 + 1.0)
    assert resumed["unpruned_from"] == pruned["unpruned_from"] == "sessions"
    c = record["compute"]
    assert c["seconds"] == 66.0 and c["unpruned_seconds"] == pytest.approx(57.0)
    assert c["saved_seconds"] == pytest.approx(-9.0)
    assert c["saved_share"] == pytest.approx(1 - 66.0 / 57.0)
    assert c["sessions"] == 3 and c["startup_seconds"] == 46.0 and c["estimated_trials"] == 0
    assert c["cost"] == pytest.approx(0.66) and c["unpruned_cost"] == pytest.approx(0.57)
    assert c["saved_cost"] == pytest.approx(-0.09)


def test_pruning_that_cost_more_than_it_saved_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = optuna.create_study()
    add_trial(study, "complete", PAUSED_AND_RESUMED, steps=30)
    add_trial(study, "pruned", PRUNED_AT_10, steps=10)
    record = sweep_record(study)
    print_table(record, tmp_path)
    printed = " ".join(capsys.readouterr().out.split())
    assert (
        "compute: 66.0 s of trials in 3 sessions (46.0 s of start-ups); every trial once to its "
        "end, one start-up each, would have taken 57.0 s (pruning cost 16% more)"
    ) in printed  # 66 / 57 = 1.158
    assert "saved" not in printed


def test_pruning_that_saved_says_how_much() -> None:
    study = optuna.create_study()
    add_trial(study, "complete", RAN_ONCE, steps=30)
    add_trial(study, "pruned", PRUNED_AT_10, steps=10)
    record = sweep_record(study)
    ran_once = record["trials"][0]
    assert ran_once["unpruned_seconds"] == pytest.approx(ran_once["seconds"])  # as it ran
    c = record["compute"]
    assert c["seconds"] == 48.0 and c["unpruned_seconds"] == pytest.approx(56.0)
    assert c["saved_seconds"] == pytest.approx(8.0)
    assert "(pruning saved 14%)" in compute_line(c)  # 1 - 48 / 56


def test_a_trial_never_measured_counts_the_median_start_up_and_its_step_time() -> None:
    study = optuna.create_study()
    add_trial(study, "complete", RAN_ONCE, steps=30)  # start-up 15
    add_trial(study, "complete", [session(30.0, 17.0, 30, 1.0)], steps=30)  # start-up 17
    add_trial(study, "complete", None, steps=30, step_seconds=0.5, seconds=35.0)
    record = sweep_record(study)
    unmeasured = record["trials"][2]
    assert unmeasured["unpruned_seconds"] == pytest.approx(16.0 + 30 * 0.5)
    assert unmeasured["unpruned_from"] == "step time" and unmeasured["sessions"] is None
    c = record["compute"]
    assert c["estimated_trials"] == 1 and c["sessions"] == 2
    assert "1 trial(s) without measured sessions counted at their step time" in compute_line(c)


def test_a_sweep_of_trials_recorded_without_sessions_counts_as_before() -> None:
    # No session anywhere: what each paid, and a pruned one's steps not run at its step time.
    study = optuna.create_study()
    add_trial(study, "complete", None, steps=30, seconds=40.0)
    add_trial(study, "pruned", None, steps=10, seconds=10.0)
    record = sweep_record(study)
    assert [t["unpruned_seconds"] for t in record["trials"]] == pytest.approx([40.0, 18.0])
    assert {t["unpruned_from"] for t in record["trials"]} == {"as paid"}
    assert record["compute"]["sessions"] is None
    assert "sessions" not in compute_line(record["compute"]).split(";")[0]


class _Clock:
    """A child's clock the test sets."""

    def __init__(self) -> None:
        self.elapsed = 0.0


def test_a_sessions_seconds_split_into_start_up_steps_and_exit() -> None:
    child = _Clock()
    clock = SessionClock()
    clock.child = child  # type: ignore[assignment]
    pipe = SimpleNamespace(step=None, steps=0)
    child.elapsed = 4.0
    clock.heard(pipe)  # type: ignore[arg-type]  # nothing yet
    # Resumed from step 10: its first three steps' lines read together, 5 s after its start.
    pipe.step, pipe.steps, child.elapsed = 13, 3, 5.0
    clock.heard(pipe)  # type: ignore[arg-type]
    pipe.step, pipe.steps, child.elapsed = 20, 10, 8.0
    clock.heard(pipe)  # type: ignore[arg-type]
    child.elapsed = 8.5
    clock.evaluated()  # its evaluation at step 20, its last report
    record: dict[str, Any] = session_record(clock, 10.0, 0.2)
    assert record == pytest.approx(
        {"seconds": 10.0, "startup_seconds": 5.0 - 3 * 0.2, "steps": 10, "tail_seconds": 1.5}
    )


def test_a_session_that_reached_no_step_is_start_up_only() -> None:
    record = session_record(SessionClock(), 7.0, None)
    assert record == {"seconds": 7.0, "startup_seconds": 7.0, "steps": 0, "tail_seconds": 0.0}
