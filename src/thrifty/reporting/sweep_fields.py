"""A sweep's sweep.json (written by `thrifty sweep`, thrifty.search.sweep.results.sweep_record)
checked field by field before the report reads it.

Read as plain JSON: the report sits below the sweep and never imports it, so a sweep can be
reported without Optuna. A field of the wrong type (text where a number is expected, a list
where a table is) is left out and named in one note; null is kept (it means "not known", e.g.
no price, no importances yet). A trial that is not a table, or has no whole-number `number`, is
left out whole; a curve's point that is not [step, loss] is left out on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from thrifty.reporting.fields import COUNT, LIST, NUMBER, TABLE, TEXT, fits, kind_of

SWEEP_FIELDS = {
    "study": TEXT,
    "objective": TEXT,
    "trials": LIST,
    "counts": TABLE,
    "best": TABLE,
    "compute": TABLE,
    "budget": TEXT,
    "importances": TABLE,
}
TRIAL_FIELDS = {
    "number": COUNT,
    "state": TEXT,
    "params": TABLE,
    "value": NUMBER,
    "steps": COUNT,
    "end_step": COUNT,
    "seconds": NUMBER,
    "sessions": COUNT,
    "startup_seconds": NUMBER,
    "unpruned_seconds": NUMBER,
    "unpruned_from": TEXT,
    "cost": NUMBER,
    "unpruned_cost": NUMBER,
    "run_dir": TEXT,
    "curve": LIST,
    "pruned": TABLE,
    "error": TEXT,
}
PRUNED_FIELDS = {
    "step": COUNT,
    "value": NUMBER,
    "pruner": TEXT,
    "reason": TEXT,
    "bound": NUMBER,
    "forecast": TABLE,
}
BEST_FIELDS = {"number": COUNT, "value": NUMBER, "params": TABLE}
COMPUTE_FIELDS = {
    **dict.fromkeys(
        ("seconds", "unpruned_seconds", "saved_seconds", "cost", "unpruned_cost", "saved_cost"),
        NUMBER,
    ),
    **dict.fromkeys(("startup_seconds", "saved_share"), NUMBER),
    **dict.fromkeys(("sessions", "estimated_trials"), COUNT),
}


def checked(
    data: Mapping[str, Any], fields: Mapping[str, str], where: str, notes: list[str]
) -> dict[str, Any]:
    """`data` without the fields of the wrong type, one note each naming `where` and the
    field; nulls and fields the report does not read are kept as they are."""
    kept = {}
    for key, value in data.items():
        kind = fields.get(key)
        if value is not None and kind is not None and not fits(value, kind):
            notes.append(f"{where}{key} is {kind_of(value)}, not {kind}: left out of the report")
            continue
        kept[key] = value
    return kept


def check_sweep(data: Mapping[str, Any], path: Path, notes: list[str]) -> dict[str, Any]:
    """sweep.json's object with what the report cannot read left out (see the module's
    docstring); `notes` gets one line for each thing left out."""
    where = f"{path}: "
    sweep = checked(data, SWEEP_FIELDS, where, notes)
    for key, fields in (("best", BEST_FIELDS), ("compute", COMPUTE_FIELDS)):
        if isinstance(sweep.get(key), dict):
            sweep[key] = checked(sweep[key], fields, f"{where}{key}.", notes)
    if isinstance(sweep.get("importances"), dict):
        sweep["importances"] = {
            name: share
            for name, share in sweep["importances"].items()
            if _kept(share, NUMBER, f"{where}importances.{name}", notes)
        }
    trials = []
    for index, trial in enumerate(sweep.get("trials") or []):
        found = _check_trial(trial, f"{where}trials[{index}]", notes)
        if found is not None:
            trials.append(found)
    if "trials" in sweep:
        sweep["trials"] = trials
    return sweep


def _check_trial(trial: Any, where: str, notes: list[str]) -> dict[str, Any] | None:
    if not isinstance(trial, dict):
        notes.append(f"{where} is {kind_of(trial)}, not a table: the trial is left out")
        return None
    if not fits(trial.get("number"), COUNT):
        notes.append(
            f"{where}.number is {kind_of(trial.get('number'))}, not {COUNT}: the trial is left out"
        )
        return None
    found = checked(trial, TRIAL_FIELDS, f"{where}.", notes)
    if isinstance(found.get("pruned"), dict):
        found["pruned"] = checked(found["pruned"], PRUNED_FIELDS, f"{where}.pruned.", notes)
    if isinstance(found.get("curve"), list):
        points = [p for p in found["curve"] if _is_point(p)]
        if len(points) < len(found["curve"]):
            left_out = len(found["curve"]) - len(points)
            notes.append(
                f"{where}.curve: {left_out} point(s) that are not [step, loss] left out of the "
                "report"
            )
        found["curve"] = sorted((int(step), float(loss)) for step, loss in points)
    return found


def _kept(value: Any, kind: str, where: str, notes: list[str]) -> bool:
    if fits(value, kind):
        return True
    notes.append(f"{where} is {kind_of(value)}, not {kind}: left out of the report")
    return False


def _is_point(point: Any) -> bool:
    """[step, loss]: a whole step and a number (a loss of NaN is kept, and not drawn)."""
    return (
        isinstance(point, list)
        and len(point) == 2
        and fits(point[0], COUNT)
        and fits(point[1], NUMBER)
    )
