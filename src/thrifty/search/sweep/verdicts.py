"""The pruner's say over a sweep's trial: each evaluation its run reports is reported to Optuna
and judged (`thrifty.search.sweep.pruning`, or the Hyperband brackets of `thrifty.search.sweep.hyperband`):
go on, prune, or pause until the bracket catches up. While the study's storage does not answer,
the evaluations wait (`Backlog`) and the run goes on unjudged.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import TrialState

from thrifty.callbacks.trial_pipe import Evaluation
from thrifty.callbacks.trial_report import GO, PAUSE, PRUNE
from thrifty.console import say
from thrifty.search.sweep import hyperband, pruning
from thrifty.search.sweep.leases import requeue
from thrifty.search.sweep.study import PAUSED_KEY, storage_trouble

if TYPE_CHECKING:
    from thrifty.search.sweep.trial import TrialSetup

PRUNED_KEY = "thrifty.pruned"  # why it was pruned: step, value, reason, forecast, bound
HYPERBAND_LIMIT_KEY = "thrifty.hyperband_limit"  # the trials the budget let start, once it ended


class Backlog:
    """Trial `number`'s evaluations the study's storage has not taken yet, in the order the
    run reported them. While the storage does not answer (a database down for a minute) the
    run goes on unjudged and its evaluations wait here; once it answers, they are reported in
    order, each once, and the newest is judged. One line says the storage is unreachable, one
    how long it was."""

    def __init__(self, number: int) -> None:
        self.number = number
        self.waiting: list[Evaluation] = []
        self.down_since: float | None = None  # monotonic seconds

    def report(
        self, setup: TrialSetup, study: optuna.Study, trial: optuna.Trial, evaluation: Evaluation
    ) -> str:
        """Report what waits, oldest first, then `evaluation`, and judge it: the pruner's
        answer (GO, PRUNE or PAUSE), or GO while the storage does not answer."""
        self.waiting.append(evaluation)
        try:
            while len(self.waiting) > 1:
                _record(setup, trial, self.waiting[0])
                self.waiting.pop(0)
            answer = judge(setup, study, trial, self.waiting[0])
            self.waiting.clear()
        except Exception as exc:
            self._down(exc)
            return GO
        self._back()
        return answer

    def drain(self, setup: TrialSetup, trial: optuna.Trial) -> None:
        """At the run's end: report what waits, trying again while the storage does not
        answer (for as long as the sweep's workers wait for it), so that no evaluation is
        lost before the trial's outcome is told. Raises the storage's error past that."""
        waits = list(DRAIN_RETRIES)
        while True:
            try:
                for evaluation in list(self.waiting):
                    _record(setup, trial, evaluation)
                    self.waiting.pop(0)
            except Exception as exc:
                self._down(exc)
                if not waits:
                    raise
                time.sleep(waits.pop(0))  # the trial has ended: nothing to stop meanwhile
                continue
            self._back()
            return

    def _down(self, exc: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            say("sweep", f"trial {self.number}: {storage_trouble(exc)}: its evaluations are "
                "kept and reported once it answers; the trial goes on unjudged meanwhile")  # fmt: skip

    def _back(self) -> None:
        if self.down_since is None:
            return
        seconds = time.monotonic() - self.down_since
        self.down_since = None
        say("sweep", f"trial {self.number}: the study's database was unreachable for "
            f"{seconds:.0f} s; the evaluations kept meanwhile are reported")  # fmt: skip


DRAIN_RETRIES = (2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0)  # seconds: 130 s in all


def _record(setup: TrialSetup, trial: optuna.Trial, evaluation: Evaluation) -> None:
    """Report one evaluation to Optuna without asking its pruner (one the storage took
    late: the pruner judges the newest), never a step twice."""
    step, value = evaluation.step, evaluation.value
    if not math.isfinite(value):
        return
    if step not in setup.storage.get_trial(trial._trial_id).intermediate_values:
        trial.report(value, step)


def judge(
    setup: TrialSetup, study: optuna.Study, trial: optuna.Trial, evaluation: Evaluation
) -> str:
    """Report one evaluation to Optuna and ask its pruner: GO, PRUNE or PAUSE. A step
    reported before (a resumed run evaluating again what it had evaluated before its last
    checkpoint) is not reported twice; the pruner decides from the study alone, so it answers
    as it did."""
    step, value, end = evaluation.step, evaluation.value, evaluation.end
    frozen = setup.storage.get_trial(trial._trial_id)
    if end is not None and frozen.user_attrs.get(pruning.ForecastPruner.END_KEY) != end:
        trial.set_user_attr(pruning.ForecastPruner.END_KEY, end)
    if not math.isfinite(value):
        return GO  # the run's guard judges a non-finite loss
    if step not in frozen.intermediate_values:
        trial.report(value, step)
    if setup.brackets is not None:
        verdict = bracket_verdict(setup, study, trial.number, step)
        if verdict.action == hyperband.PRUNE:
            _record_pruned(trial, step, value, verdict)
            return PRUNE
        return PAUSE if verdict.action == hyperband.WAIT else GO
    if not trial.should_prune():
        return GO
    frozen = setup.storage.get_trial(trial._trial_id)
    trial.set_user_attr(PRUNED_KEY, pruning.explain(setup.pruner_name, setup.pruner, study, frozen))
    return PRUNE


def bracket_verdict(
    setup: TrialSetup, study: optuna.Study, number: int, step: int
) -> hyperband.Verdict:
    """The Hyperband verdict for trial `number` at `step`, from the study's reports."""
    assert setup.brackets is not None
    trials = study.get_trials(deepcopy=False)
    curves = {t.number: t.intermediate_values for t in trials}
    failed = {t.number for t in trials if t.state == TrialState.FAIL}
    limit = study.user_attrs.get(HYPERBAND_LIMIT_KEY, setup.trials)
    return hyperband.decide(number, step, curves, failed, setup.brackets, limit)


def _record_pruned(trial: Any, step: int, value: float | None, verdict: hyperband.Verdict) -> None:
    why = {"step": step, "value": value, "pruner": "hyperband", "reason": verdict.reason}
    if verdict.bound is not None:
        why["bound"] = verdict.bound
    trial.set_user_attr(PRUNED_KEY, why)


def release_paused(setup: TrialSetup, study: optuna.Study) -> list[tuple[int, str]]:
    """Decide the paused trials whose bracket has caught up: back in the queue (WAITING) to
    go on, or PRUNED. Returns (number, "resumes" | "pruned") for each decided."""
    if setup.brackets is None:
        return []
    decided = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        step = frozen.user_attrs.get(PAUSED_KEY)
        if not isinstance(step, int):
            continue
        verdict = bracket_verdict(setup, study, frozen.number, step)
        if verdict.action == hyperband.WAIT:
            continue
        handle = optuna.Trial(study, frozen._trial_id)
        handle.set_user_attr(PAUSED_KEY, None)
        if verdict.action == hyperband.PRUNE:
            _record_pruned(handle, step, frozen.intermediate_values.get(step), verdict)
            study.tell(frozen.number, state=TrialState.PRUNED)
            decided.append((frozen.number, "pruned"))
        else:
            requeue(setup.storage, frozen._trial_id)
            decided.append((frozen.number, "resumes"))
    return decided
