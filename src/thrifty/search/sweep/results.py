"""What a sweep found and what it cost: DIR/sweep.json, DIR/best.toml, and the budget's check.

Compute is counted in the trials' wall seconds: every session of a trial, its process's
start-up and a preempted session's lost steps included, since a machine is paid for all of it
(a trial paused at a Hyperband rung and resumed pays two start-ups). Dollars are those seconds
at the trial's own price (`[cost]`: the catalog's spot or on-demand rate, as the run's cost
meter has it).

`unpruned_seconds` is what an unpruned sweep would really pay: every trial run once, in a
process of its own, to its end (a pruned trial to the step its budget ends at, any other to the
last step it reached). From the trial's sessions (`thrifty.search.sweep.trial.session_record`):
one start-up (its first measured session's), its steps at the pace its sessions ran them
(the evaluations and saves between them included) and one exit (its last session's). A trial
no session of which was measured (each lost with its worker, or run before sessions were
recorded) counts the median start-up of the measured trials plus its steps at its median step
time, evaluations left out (`unpruned_from` "step time"); without a measured trial to take the
median from, what it paid plus, if pruned, the steps it did not run at that step time ("as
paid"), as does a trial that ran no step. `saved_seconds` is the difference and is negative
when the start-ups pruning added cost more than the steps it did not run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from thrifty.search.sweep.pruning import ForecastPruner
from thrifty.search.sweep.study import PAUSED_KEY
from thrifty.search.sweep.trial import (
    ERROR_KEY,
    FACTS_KEY,
    PRUNED_KEY,
    RUN_DIR_KEY,
    SECONDS_KEY,
    SESSIONS_KEY,
)

SWEEP_JSON = "sweep.json"
BEST_TOML = "best.toml"
CONFIG_KEY = "thrifty.config"  # the base config (redacted) the study was made from
_STATES = {
    TrialState.COMPLETE: "complete",
    TrialState.PRUNED: "pruned",
    TrialState.FAIL: "failed",
    TrialState.RUNNING: "running",
    TrialState.WAITING: "waiting",
}
BEST_HEADER = (
    "# Written by thrifty sweep: the best trial ({number}, validation loss {value:.6g}); "
    "`thrifty train best.toml` runs it.\n"
)


_SESSION_FIGURES = ("seconds", "startup_seconds", "steps", "tail_seconds")


def sessions(trial: FrozenTrial) -> list[dict[str, float]]:
    """The trial's recorded sessions, oldest first (a malformed one left out)."""
    found = trial.user_attrs.get(SESSIONS_KEY)
    if not isinstance(found, list):
        return []
    return [
        {key: float(s[key]) for key in _SESSION_FIGURES}
        for s in found
        if isinstance(s, dict)
        and all(isinstance(s.get(k), (int, float)) and s[k] >= 0 for k in _SESSION_FIGURES)
    ]


def median_startup(trials: Sequence[FrozenTrial]) -> float | None:
    """The median start-up of the trials measured: each one's first session that reached a
    step. None without one."""
    found = []
    for trial in trials:
        measured = [s for s in sessions(trial) if s["steps"] > 0]
        if measured:
            found.append(measured[0]["startup_seconds"])
    if not found:
        return None
    found.sort()
    middle = len(found) // 2
    return found[middle] if len(found) % 2 else (found[middle - 1] + found[middle]) / 2


def unpruned_seconds(
    trial: FrozenTrial, seconds: float, steps: int | None, startup: float | None
) -> tuple[float, str]:
    """What running `trial` once to its end in a process of its own would take (see the
    module's docstring), and what it is taken from: "sessions", "step time" or "as paid".
    `startup`: the sweep's median start-up, for a trial not measured."""
    reached = steps or 0
    end = trial.user_attrs.get(ForecastPruner.END_KEY)
    target = reached
    if trial.state == TrialState.PRUNED and isinstance(end, int):
        target = max(end, reached)
    measured = [s for s in sessions(trial) if s["steps"] > 0]
    if measured:
        running = sum(s["seconds"] - s["startup_seconds"] - s["tail_seconds"] for s in measured)
        pace = max(0.0, running) / sum(s["steps"] for s in measured)
        whole = measured[0]["startup_seconds"] + target * pace + measured[-1]["tail_seconds"]
        return whole, "sessions"
    step_seconds = (trial.user_attrs.get(FACTS_KEY) or {}).get("step_seconds")
    if not reached or not isinstance(step_seconds, (int, float)):
        return seconds, "as paid"
    if startup is not None:
        return startup + target * step_seconds, "step time"
    return seconds + (target - reached) * step_seconds, "as paid"


def trial_record(trial: FrozenTrial, startup: float | None = None) -> dict[str, Any]:
    """One trial as sweep.json holds it. `startup`: the sweep's median start-up
    (`median_startup`), for a trial whose sessions were not measured."""
    attrs = trial.user_attrs
    facts = attrs.get(FACTS_KEY) or {}
    curve = sorted(trial.intermediate_values.items())
    steps = facts.get("steps") or (curve[-1][0] if curve else None)
    seconds = float(attrs.get(SECONDS_KEY, 0.0))
    end = attrs.get(ForecastPruner.END_KEY)
    unpruned, unpruned_from = unpruned_seconds(trial, seconds, steps, startup)
    paid = sessions(trial)
    price = facts.get("usd_per_second")
    usd = None if price is None else seconds * price
    unpruned_usd = None if price is None else unpruned * price
    state = _STATES.get(trial.state, trial.state.name.lower())
    if trial.state == TrialState.RUNNING and isinstance(attrs.get(PAUSED_KEY), int):
        state = "paused"  # saved at a Hyperband rung, waiting for its bracket
    record: dict[str, Any] = {
        "number": trial.number,
        "state": state,
        "params": trial.params,
        "value": trial.value,
        "steps": steps,
        "end_step": end,
        "seconds": seconds,
        "sessions": len(paid) if paid else None,
        "startup_seconds": sum(s["startup_seconds"] for s in paid) if paid else None,
        "unpruned_seconds": unpruned,
        "unpruned_from": unpruned_from,
        "cost": usd,
        "unpruned_cost": unpruned_usd,
        "run_dir": attrs.get(RUN_DIR_KEY),
        "curve": [[step, value] for step, value in curve],
    }
    if trial.state == TrialState.PRUNED:
        record["pruned"] = attrs.get(PRUNED_KEY) or {"step": steps}
    if trial.state == TrialState.FAIL:
        record["error"] = attrs.get(ERROR_KEY)
    return record


def _sum(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def trial_records(trials: Sequence[FrozenTrial]) -> list[dict[str, Any]]:
    """Each trial as sweep.json holds it, those not measured at the sweep's median start-up."""
    startup = median_startup(trials)
    return [trial_record(t, startup) for t in trials]


def sweep_record(study: optuna.Study, budget: Any = None) -> dict[str, Any]:
    """sweep.json: the trials, the best, the compute used and what pruning saved."""
    trials = trial_records(study.get_trials(deepcopy=False))
    best: dict[str, Any] | None = None
    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if complete:
        top = min(complete, key=lambda t: t.value if t.value is not None else math.inf)
        best = {"number": top.number, "value": top.value, "params": top.params}
    seconds = sum(t["seconds"] for t in trials)
    unpruned = sum(t["unpruned_seconds"] for t in trials)
    usd = _sum([t["cost"] for t in trials])
    unpruned_usd = _sum([t["unpruned_cost"] for t in trials])
    compute = {
        "seconds": seconds,
        "sessions": _sum([t["sessions"] for t in trials]),
        "startup_seconds": _sum([t["startup_seconds"] for t in trials]),
        "unpruned_seconds": unpruned,
        "saved_seconds": unpruned - seconds,
        "saved_share": 1 - seconds / unpruned if unpruned else None,
        "estimated_trials": sum(
            1 for t in trials if t["unpruned_from"] != "sessions" and (t["steps"] or 0) > 0
        ),
        "cost": usd,
        "unpruned_cost": unpruned_usd,
        "saved_cost": None if usd is None or unpruned_usd is None else unpruned_usd - usd,
    }
    states = [*_STATES.values(), "paused"]
    counts = {state: sum(1 for t in trials if t["state"] == state) for state in states}
    return {
        "study": study.study_name,
        "objective": "validation loss (the training loss without validation data), minimized",
        "trials": trials,
        "counts": counts,
        "best": best,
        "compute": compute,
        "budget": None if budget is None else budget.describe(),
        "importances": importances(study),
    }


def importances(study: optuna.Study) -> dict[str, float] | None:
    """Optuna's parameter importances (fANOVA) over the finished trials; None before two
    finished trials with different parameters."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(complete) < 2 or len({json.dumps(t.params, sort_keys=True) for t in complete}) < 2:
        return None
    try:
        found = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError, ZeroDivisionError):
        return None
    return {k: float(v) for k, v in found.items()}


def write(study: optuna.Study, out: Path, budget: Any = None) -> dict[str, Any]:
    """Write sweep.json and best.toml in `out` (each whole or not at all); the record."""
    record = sweep_record(study, budget)
    _write_atomic(out / SWEEP_JSON, json.dumps(record, indent=1) + "\n")
    best = record["best"]
    config = study.user_attrs.get(CONFIG_KEY)
    if best is not None and isinstance(config, Mapping):
        _write_atomic(out / BEST_TOML, best_toml(config, best))
    return record


def best_toml(config: Mapping[str, Any], best: Mapping[str, Any]) -> str:
    """The base config (already redacted) with the best trial's parameters set."""
    from thrifty.config import apply_overrides, dump_toml

    data = apply_overrides(config, list(best["params"].items()))
    run = dict(data.get("run", {}))
    run.pop("out", None)  # a new run directory of its own, not the trial's
    data["run"] = run
    return BEST_HEADER.format(number=best["number"], value=best["value"]) + dump_toml(data)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


# --- the budget ------------------------------------------------------------------------------


def budget_allows(trials: Sequence[FrozenTrial], budget: Any, say: Callable[[str], None]) -> bool:
    """Whether the budget can pay for one more trial: what the trials used (those running
    counted at their expected cost) plus one trial's expected cost, the mean of the finished
    trials' full cost (a pruned one's as if run to its end). Before any trial has finished
    there is nothing to expect from: the first trial of each worker starts."""
    if budget.seconds is None and budget.usd is None:
        return True
    records = trial_records(trials)
    finished = [r for r in records if r["state"] in ("complete", "pruned")]
    key, limit = ("seconds", budget.seconds) if budget.usd is None else ("cost", budget.usd)
    used = sum((r[key] or 0.0) for r in records)
    if not finished:
        return True
    full = [r["unpruned_seconds" if key == "seconds" else "unpruned_cost"] for r in finished]
    known = [v for v in full if v is not None]
    if not known:
        return True
    expected = sum(known) / len(known)
    running = sum(1 for r in records if r["state"] == "running")
    if used + (running + 1) * expected > limit:
        say(
            f"budget: {used:,.2f} of {limit:,.2f} {'s' if key == 'seconds' else 'USD'} used, "
            f"{running} trial(s) running; one more would need ~{expected:,.2f}: no new trial"
        )
        return False
    return True
