"""Reading what a run, a tune or a sweep left in its directory, for the report.

A run directory holds config.toml, metrics.jsonl (one JSON object a line: a step's record, an
evaluation `{"step", "val_loss"}`, or an event `{"step", "event": "resumed" | "rollback" |
...}`), and once the run ends diagnosis.json and (finished runs only) summary.json; its saves
are folders under checkpoints/ with a manifest.json. A tune's --out holds tune.json; a sweep's
--out holds sweep.json (checked field by field in `sweep_fields`).

A run killed mid-write may leave its last metrics line cut short: that line is dropped. Other
damaged lines (bad bytes, not a JSON object) are left out too, and the page says which. A field
of summary.json or diagnosis.json of the wrong type (a string where a number is expected, a
list where a table is) is left out of the page, which names the file and the field (`notes`).
A directory with no step record yet has nothing to report and is refused with one line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.errors import ThriftyError
from thrifty.ledger.files import read_text
from thrifty.reporting.fields import LIST, NUMBER, TABLE, TEXT, WHOLE, fits, kind_of
from thrifty.reporting.sweep_fields import check_sweep

WHAT_A_RUN_IS = (
    "a run directory (it holds metrics.jsonl), a tune's --out (it holds tune.json) or a sweep's "
    "--out (it holds sweep.json)"
)
SWEEP_JSON_FIX = "thrifty sweep writes it anew from its study when it next runs with this --out"


@dataclass(frozen=True, slots=True)
class Run:
    """One training run as its directory tells it.

    `steps`: the step records in file order (each has "step" and "loss"); `evals`: (step,
    validation loss) pairs; `events`: the records with an "event" key; `checkpoints`: the
    steps of the saves seen (a step's breakdown spent time saving, or a folder under
    checkpoints/ holds a manifest), ascending. `summary` is None for a run that did not finish
    (preempted, stopped by its data, or still running)."""

    path: Path
    name: str
    config: dict[str, Any]
    steps: list[dict[str, Any]]
    evals: list[tuple[int, float]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    diagnosis: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # what was left out of its files, and why

    @property
    def finished(self) -> bool:
        return self.summary is not None


@dataclass(frozen=True, slots=True)
class Tune:
    """A `thrifty tune` --out: `data` is its tune.json (tuning.report.result_dict)."""

    path: Path
    name: str
    data: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Sweep:
    """A `thrifty sweep` --out: `data` is its sweep.json (thrifty.search.sweep.results.sweep_record)
    with what the report cannot read left out; `notes` says what, one line each."""

    path: Path
    name: str
    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def load(path: str | os.PathLike[str]) -> Run | Tune | Sweep:
    """The run, tune or sweep in `path`; anything else is a ThriftyError naming what is
    missing."""
    path = Path(path)
    if not path.exists():
        raise ThriftyError(f"{path} does not exist: give {WHAT_A_RUN_IS}")
    if not path.is_dir():
        raise ThriftyError(f"{path} is not a directory: give {WHAT_A_RUN_IS}")
    if (path / "tune.json").is_file():
        return Tune(path, path.resolve().name, _read_json(path / "tune.json"))
    if (path / "sweep.json").is_file():
        return load_sweep(path)
    return load_run(path)


def load_sweep(path: Path) -> Sweep:
    """The sweep whose --out is `path`: its sweep.json, checked."""
    notes: list[str] = []
    data = _read_json(path / "sweep.json", SWEEP_JSON_FIX)
    return Sweep(path, path.resolve().name, check_sweep(data, path / "sweep.json", notes), notes)


def load_run(path: Path) -> Run:
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        if (path / "config.toml").is_file():
            raise ThriftyError(
                f"run directory {path} has no metrics.jsonl: the run ended before its first "
                "metrics flush (every run.log_every steps), so there is nothing to report yet"
            )
        raise ThriftyError(f"{path} is not a run: it has no metrics.jsonl; give {WHAT_A_RUN_IS}")
    records, damaged = read_records(metrics)
    notes = [_damage_note(metrics, damaged)] if damaged else []
    steps = [r for r in records if _is_step(r)]
    if not steps:
        raise ThriftyError(
            f"{metrics} holds no step record yet: the run ended before its first metrics "
            "flush (every run.log_every steps), so there is nothing to report"
        )
    events = [r for r in records if isinstance(r.get("event"), str)]
    summary = _read_checked(path / "summary.json", SUMMARY_FIELDS, notes)
    diagnosis = _read_checked(path / "diagnosis.json", DIAGNOSIS_FIELDS, notes)
    if diagnosis is not None and isinstance(diagnosis.get("guard"), dict):
        diagnosis["guard"] = _checked(
            diagnosis["guard"], GUARD_FIELDS, f"{path / 'diagnosis.json'}: guard.", notes
        )
    return Run(
        path=path,
        name=path.resolve().name,
        config=_read_config(path / "config.toml"),
        steps=steps,
        evals=[(int(r["step"]), float(r["val_loss"])) for r in records if _is_eval(r)],
        events=events,
        checkpoints=_checkpoint_steps(path, steps, events),
        summary=summary,
        diagnosis=diagnosis,
        notes=notes,
    )


def read_records(path: Path) -> tuple[list[dict[str, Any]], list[int]]:
    """metrics.jsonl's records, and the numbers of its damaged lines (not JSON, bad bytes, not
    an object with a whole-number step), which are left out. A last line cut short (the
    process was killed mid-write, or is writing it now) is dropped without a word."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise ThriftyError(f"cannot read {path}: {exc.strerror}") from exc
    numbered = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
    records, damaged = [], []
    for position, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            if position < len(numbered) - 1:
                damaged.append(number)
            continue
        if isinstance(record, dict) and type(record.get("step")) is int:
            records.append(record)
        elif not (isinstance(record, dict) and "step" not in record):
            damaged.append(number)
    return records, damaged


def _damage_note(path: Path, numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:5]) + (", ..." if len(numbers) > 5 else "")
    lines = "line" if len(numbers) == 1 else "lines"
    return (
        f"{path}: {len(numbers)} damaged {lines} left out ({lines} {shown}: cut short, bad "
        "bytes, or not a record)"
    )


# The fields the page reads, and the type each must have; null counts as absent.
SUMMARY_FIELDS = {
    **dict.fromkeys(("steps", "samples", "tokens", "wall_seconds", "mfu", "world_size"), NUMBER),
    **dict.fromkeys(("tokens_per_second", "samples_per_second"), NUMBER),
    **dict.fromkeys(("micro_batch", "accumulation_steps", "effective_batch"), WHOLE),
    **dict.fromkeys(("stop_reason", "precision", "strategy"), TEXT),
    **dict.fromkeys(("cost", "breakdown", "guard"), TABLE),
}
DIAGNOSIS_FIELDS = {
    "bottleneck": TEXT,
    "recommendations": LIST,
    "evidence": LIST,
    **dict.fromkeys(("guard", "measured", "breakdown", "straggler"), TABLE),
}
GUARD_FIELDS = {"skipped_steps": NUMBER, "rollbacks": LIST}


def _checked(
    data: dict[str, Any], fields: Mapping[str, str], where: str, notes: list[str]
) -> dict[str, Any]:
    """`data` without the fields of the wrong type (one note each, naming `where` and the
    field) and without nulls (absent)."""
    kept = {}
    for key, value in data.items():
        kind = fields.get(key)
        if value is None:
            continue
        if kind is not None and not fits(value, kind):
            notes.append(f"{where}{key} is {kind_of(value)}, not {kind}: left out of the report")
            continue
        kept[key] = value
    return kept


def _read_checked(path: Path, fields: Mapping[str, str], notes: list[str]) -> dict[str, Any] | None:
    """A JSON file the run writes when it ends (None before), its fields checked."""
    data = _read_optional(path)
    return None if data is None else _checked(data, fields, f"{path}: ", notes)


def _is_step(record: Mapping[str, Any]) -> bool:
    return "loss" in record and "event" not in record


def _is_eval(record: Mapping[str, Any]) -> bool:
    value = record.get("val_loss")
    return "loss" not in record and isinstance(value, int | float) and not isinstance(value, bool)


def _read_optional(path: Path) -> dict[str, Any] | None:
    """A JSON file the run writes when it ends; None before."""
    return _read_json(path) if path.is_file() else None


def _read_json(path: Path, fix: str = "move it away to report the rest") -> dict[str, Any]:
    """A JSON file the run wrote atomically; `fix` says what to do when it is damaged."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ThriftyError(f"cannot read {path}: {exc.strerror}") from exc
    except (ValueError, RecursionError) as exc:
        raise ThriftyError(
            f"{path} is not valid JSON ({exc}): the file was damaged; {fix}"
        ) from None
    if not isinstance(data, dict):
        raise ThriftyError(f"{path} does not hold a JSON object: it is not one thrifty wrote")
    return data


def _read_config(path: Path) -> dict[str, Any]:
    """config.toml's tables (its other keys left out); {} when it is missing or unreadable
    (the report can do without)."""
    from thrifty.config import toml_loads

    try:  # a FIFO or a device by that name is never opened
        tables = toml_loads(read_text(path))
    except (OSError, ValueError, RecursionError):
        return {}
    return {name: table for name, table in tables.items() if isinstance(table, dict)}


def _checkpoint_steps(
    path: Path, steps: list[dict[str, Any]], events: list[dict[str, Any]]
) -> list[int]:
    """The steps of the saves seen: a step whose breakdown spent time saving, a save under
    checkpoints/, and the save a resume or a rollback went back to (pruned since, maybe)."""
    seen = {
        int(r["step"])
        for r in steps
        if isinstance(r.get("breakdown"), dict) and _positive(r["breakdown"].get("checkpoint"))
    }
    for event in events:
        went_to = event["step"] if event["event"] == "resumed" else event.get("to_step")
        if event["event"] in ("resumed", "rollback") and isinstance(went_to, int):
            seen.add(went_to)
    folder = path / "checkpoints"
    if folder.is_dir():
        for manifest in folder.glob("*/manifest.json"):
            step = (_read_manifest(manifest) or {}).get("step")
            if isinstance(step, int):
                seen.add(step)
    return sorted(seen)


def _positive(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and value > 0


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:  # a FIFO or a device by that name is never opened
        data = json.loads(read_text(path))
    except (OSError, ValueError, RecursionError):
        return None  # a save being written, or a damaged one: not a save to mark
    return data if isinstance(data, dict) else None
