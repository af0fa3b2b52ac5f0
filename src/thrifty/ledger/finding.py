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
from thrifty.rundir.files import RUN_FILES

WHAT_TO_GIVE = (
    "give folders that hold thrifty runs (default runs/), or a bucket prefix s3://BUCKET/PREFIX"
)


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
    """Every run under `paths` (folders, or bucket URLs kept for `bucket`), each read once
    however many links or given paths lead to it. A path that does not exist is a
    ThriftyError naming it."""
    found = Found()
    read: set[str] = set()  # each run folder's resolved path, once read
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
            real = os.path.realpath(folder)
            if real not in read:
                read.add(real)
                _read_into(found, folder, group)
    found.tunes = find_tunes(paths)
    return found


def is_run(folder: Path) -> bool:
    """Whether `folder` holds a run: metrics.jsonl or summary.json is there (whatever it is:
    a FIFO by that name makes the run one to skip with a line, not a folder to search)."""
    return any(os.path.lexists(folder / name) for name in RUN_FILES)


def run_folders(root: Path, group: str | None = None) -> Iterator[tuple[Path, str | None]]:
    """Each run directory under `root` (itself included) with the sweep or tune it belongs
    to, each once: by its resolved path. Folders are walked before links; a link is followed
    once, and never to a folder already walked or to one holding `root` (`latest -> demo-1`,
    `self -> .`, `a -> ..`), so every walk ends and no run is counted twice."""
    top = os.path.realpath(root)
    seen = {top}
    links: list[tuple[Path, str | None]] = []
    yield from _walk(root, group, seen, links)
    while links:  # what links lead to, once every folder reached without one is walked
        link, under = links.pop(0)
        real = os.path.realpath(link)
        if real in seen or _holds(real, top) or not os.path.isdir(real):
            continue
        seen.add(real)
        yield from _walk(link, under, seen, links)


def _walk(
    start: Path, group: str | None, seen: set[str], links: list[tuple[Path, str | None]]
) -> Iterator[tuple[Path, str | None]]:
    """The run directories at or under `start` reached without following a link (depth
    first, by name); the links met are added to `links` with their group."""
    stack = [(start, group)]
    while stack:
        folder, under = stack.pop()
        if is_run(folder):
            yield folder, under
            continue
        for marker, kind in (("sweep.json", "sweep"), ("tune.json", "tune")):
            if (folder / marker).is_file():
                under = f"{kind} {folder.resolve().name}"
        children = []
        for child in _children(folder):
            if child.is_symlink():
                links.append((child, under))
            elif os.path.realpath(child) not in seen:
                seen.add(os.path.realpath(child))
                children.append((child, under))
        stack.extend(reversed(children))


def _children(folder: Path) -> list[Path]:
    """The folders in `folder` (links to folders included), by name; hidden ones left out."""
    try:
        return sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.is_dir())
    except OSError:
        return []


def _holds(real: str, top: str) -> bool:
    """Whether the folder `real` is `top` or holds it (a link up the tree)."""
    return top == real or top.startswith(real.rstrip(os.sep) + os.sep)


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
