"""Finding the runs under the folders given: run directories, a sweep's trials, a tune's.

A run directory holds metrics.jsonl or summary.json (nothing below it is searched: its
checkpoints are not runs). A sweep's --out holds sweep.json and its trials under
trials/NNNN; a tune's --out holds tune.json (its measured lever waterfall) and its trials
under trials/. Their trials are runs too, paid for like any other, and carry the folder's
name as their group. A URL (s3://, gs://) is a bucket prefix, read by `thrifty.ledger.bucket`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.errors import ThriftyError
from thrifty.ledger.attempt import Attempt, Skipped, read_attempt
from thrifty.records.directory import RUN_FILES

WHAT_TO_GIVE = "give folders that hold thrifty runs (default runs/), or a bucket prefix s3://BUCKET/PREFIX"


@dataclass(frozen=True, slots=True)
class Tune:
    """A `thrifty tune` --out: its tune.json and winner.toml's tables (None without a winner)."""

    path: Path
    data: dict[str, Any]
    winner: dict[str, Any] | None


@dataclass(slots=True)
class Found:
    """What the folders held: the run directories read, the tunes, the bucket URLs given, and
    one line for each folder skipped."""

    attempts: list[Attempt] = field(default_factory=list)
    tunes: list[Tune] = field(default_factory=list)
    buckets: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def find(paths: Sequence[str]) -> Found:
    """Every run under `paths` (folders, or bucket URLs kept for `bucket`). A path that does
    not exist is a ThriftyError naming it."""
    found = Found()
    for given in paths:
        if "://" in given:
            found.buckets.append(given)
            continue
        root = Path(given)
        if not root.exists():
            raise ThriftyError(f"{given} does not exist: {WHAT_TO_GIVE}")
        if not root.is_dir():
            raise ThriftyError(f"{given} is not a folder: {WHAT_TO_GIVE}")
        for folder, group in run_folders(root, None):
            _read_into(found, folder, group)
    found.tunes = find_tunes(paths)
    return found


def run_folders(root: Path, group: str | None = None) -> Iterator[tuple[Path, str | None]]:
    """Each run directory under `root` (itself included) with the sweep or tune it belongs to;
    tunes are reported through `_tune_folders`."""
    if any((root / name).is_file() for name in RUN_FILES):
        yield root, group
        return
    for marker, kind in (("sweep.json", "sweep"), ("tune.json", "tune")):
        if (root / marker).is_file():
            group = f"{kind} {root.resolve().name}"
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return
    for child in children:
        yield from run_folders(child, group)


def _read_into(found: Found, folder: Path, group: str | None) -> None:
    try:
        attempt = read_attempt(folder)
    except Skipped as exc:
        found.skipped.append(str(exc))
        return
    found.attempts.append(dataclasses.replace(attempt, sweep=group))


def find_tunes(paths: Sequence[str]) -> list[Tune]:
    """The tunes under `paths` (folders holding tune.json), with their winner's tables; a
    damaged tune.json is left out (its trials still count as runs)."""
    tunes = []
    for given in paths:
        if "://" in given or not Path(given).is_dir():
            continue
        for folder, _, files in os.walk(given):
            if "tune.json" in files:
                tune = _read_tune(Path(folder))
                if tune is not None:
                    tunes.append(tune)
    return sorted(tunes, key=lambda t: str(t.path))


def _read_tune(folder: Path) -> Tune | None:
    from thrifty.config import toml_loads

    try:
        data = json.loads((folder / "tune.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    try:
        winner = toml_loads((folder / "winner.toml").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        winner = None
    return Tune(folder, data, winner)
