"""A run writes over or deletes only what thrifty wrote.

Before a run touches its directory, everything it would replace or delete is checked: the files
it writes at the top (config.toml, metrics.jsonl, summary.json, diagnosis.json, report.html),
the folders named like a save (`step-00000120`) in its checkpoint folder, into which it writes
and which it deletes, and with --overwrite everything in the run's own checkpoints/ folder,
which starting over empties. One thing thrifty did not write stops the run before anything is
written, in one line naming it; --overwrite never goes past it. Files thrifty never touches (a
train.log, notes) stay where they are, overwrite or not.

How a file is known to be thrifty's: see thrifty.rundir.own_files. A config.toml counts only beside
the rest of a run (a metrics.jsonl, a summary.json or a save): one alone is someone's config.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from thrifty.checkpointing.store.manifest import MANIFEST
from thrifty.checkpointing.store.probe import PROBE
from thrifty.checkpointing.store.retention import holds_only_a_save
from thrifty.checkpointing.store.storage import is_remote
from thrifty.config import CheckpointConfig
from thrifty.errors import ThriftyError, fix
from thrifty.rundir.holder import LEASE_FILE, LOCK_FILE
from thrifty.rundir.own_files import (
    DIAGNOSIS_KEY,
    SUMMARY_KEY,
    is_own_config,
    is_own_json,
    is_own_metrics,
    is_own_report,
)

_SAVE = re.compile(r"^step-\d+$")  # thrifty.checkpointing.store.manifest.step_dir's names
# What else thrifty leaves in a checkpoint folder: its write test, its lock and lease.
_CHECKPOINT_FILES = frozenset({PROBE, f"{PROBE}.tmp", LOCK_FILE, LEASE_FILE})
MAX_NAMED = 5


def checkpoint_folder(run_dir: Path, checkpoint: CheckpointConfig) -> Path:
    """The local folder saves are written to (as the run checkpointer builds its manager): the location,
    or for a URL its staging folder; run_dir/checkpoints by default."""
    default = run_dir / "checkpoints"
    location = checkpoint.location
    if location and is_remote(location):
        return Path(checkpoint.local_dir) if checkpoint.local_dir else default
    return Path(location) if location else default


def foreign_files(
    run_dir: Path, checkpoints: Path, *, emptied: bool, tensorboard: bool = False
) -> list[str]:
    """What thrifty did not write among what it would replace or delete in `run_dir`: its
    files, the save folders in `checkpoints`, with `emptied` (--overwrite on the run's own
    checkpoints/ folder) everything in that folder, and with `tensorboard` (a run that starts
    its TensorBoard folder over) a `tensorboard` folder that is not beside a thrifty run. Paths
    relative to `run_dir` where they are inside it; a folder ends in "/"."""
    saves = has_saves(checkpoints)
    summary = is_own_json(run_dir / "summary.json", SUMMARY_KEY)
    metrics = run_dir / "metrics.jsonl"
    beside_a_run = metrics.is_file() or summary or saves
    own: dict[str, Callable[[Path], bool]] = {
        "config.toml": lambda p: beside_a_run and is_own_config(p),
        "metrics.jsonl": lambda p: saves or summary or is_own_metrics(p),
        "summary.json": lambda p: summary,
        "diagnosis.json": lambda p: is_own_json(p, DIAGNOSIS_KEY),
        "report.html": is_own_report,
    }
    found = []
    for name, is_own in own.items():
        path = run_dir / name
        if path.is_dir() or (path.exists() and not is_own(path)):
            found.append(_shown(path, run_dir))
    board = run_dir / "tensorboard"
    if tensorboard and board.is_dir() and not beside_a_run:  # a file there it never deletes
        found.append(_shown(board, run_dir))
    found += [_shown(p, run_dir) for p in _foreign_in_checkpoints(checkpoints, every=emptied)]
    return found


# What `thrifty train` writes in a run directory besides the files `foreign_files` checks: a
# command's log of it (tune's and a sweep's trials), the damaged lines of metrics.jsonl set
# aside, TensorBoard's folder, the run lock.
_RUN_EXTRAS = frozenset({"train.log", "metrics.jsonl.damaged", "tensorboard", LOCK_FILE})
_RUN_FILES = frozenset(
    {"config.toml", "metrics.jsonl", "summary.json", "diagnosis.json", "report.html"}
)


def foreign_in_run(run_dir: Path) -> list[str]:
    """What a run directory a command made for a run of its own (a tune's trial) holds that
    `thrifty train` did not write, relative to it: the command deletes the folder whole only
    when this is empty."""
    known = _RUN_FILES | _RUN_EXTRAS | {"checkpoints"}
    found = [n + ("/" if (run_dir / n).is_dir() else "") for n in _names(run_dir) if n not in known]
    return found + foreign_files(run_dir, run_dir / "checkpoints", emptied=True)


def check_run_dir(
    run_dir: Path,
    checkpoint: CheckpointConfig,
    *,
    overwrite: bool,
    tensorboard: bool = False,
) -> None:
    """Refuse, in one line naming what was found, a run directory where thrifty would replace
    or delete something it did not write (`tensorboard`: log.tensorboard is on). Reads only."""
    if not run_dir.is_dir():
        return
    emptied = overwrite and checkpoint.location is None
    found = foreign_files(
        run_dir, checkpoint_folder(run_dir, checkpoint), emptied=emptied, tensorboard=tensorboard
    )
    if not found:
        return
    named = ", ".join(found[:MAX_NAMED]) + (
        f" and {len(found) - MAX_NAMED} more" if len(found) > MAX_NAMED else ""
    )
    if overwrite:
        why = (
            f": {fix('run.overwrite', True)} replaces a thrifty run but never files thrifty "
            "did not write;"
        )
    else:
        why = " and would write over:"
    them = "them" if len(found) > 1 else "it"
    raise ThriftyError(
        f"run directory {run_dir} holds {named}, which thrifty did not write{why} "
        f"move {them} away, or {fix('run.out', phrase='choose another')}"
    )


def remove_checkpoints(checkpoints: Path) -> None:
    """--overwrite starts over: delete the saves in the run's own checkpoints/ folder (each
    save's manifest first, so that a half-deleted one is never trusted), then the folder if
    nothing else is left. `check_run_dir` has refused anything thrifty did not write."""
    if not checkpoints.is_dir():
        return
    for entry in sorted(checkpoints.iterdir()):
        if entry.is_dir() and _SAVE.match(entry.name):
            (entry / MANIFEST).unlink(missing_ok=True)
            shutil.rmtree(entry)
        elif entry.name in _CHECKPOINT_FILES and entry.name != LOCK_FILE:
            entry.unlink(missing_ok=True)
    if not any(checkpoints.iterdir()):
        checkpoints.rmdir()


def has_saves(checkpoints: Path) -> bool:
    """A folder named like a save holds a manifest: the run saved at least once."""
    return any(
        _SAVE.match(name) and (checkpoints / name / MANIFEST).is_file()
        for name in _names(checkpoints)
    )


def _foreign_in_checkpoints(checkpoints: Path, *, every: bool) -> list[Path]:
    found = []
    for name in _names(checkpoints):
        path = checkpoints / name
        if _SAVE.match(name):
            if not path.is_dir() or not holds_only_a_save(_names(path)):
                found.append(path)
        elif every and name not in _CHECKPOINT_FILES:
            found.append(path)
    return found


def _names(folder: Path) -> list[str]:
    try:
        return sorted(os.listdir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _shown(path: Path, run_dir: Path) -> str:
    try:
        text = str(path.relative_to(run_dir))
    except ValueError:
        text = str(path)
    return text + ("/" if path.is_dir() else "")
