"""Opening a run directory (rank 0): one writer, nothing thrifty did not write written over, a
finished run kept, the checkpoint to resume from chosen, and the run's config and metrics log
written once the state is loaded.

A directory with summary.json holds a finished run: with the same config there is nothing to
do (RunAlreadyFinished, exit code 0); with a larger budget it is trained further; with another
config it is refused unless run.overwrite. One with checkpoints is resumed (checkpoint.resume =
auto), never silently started over. Damaged lines of its metrics.jsonl are set aside.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thrifty.checkpointing.saving.saves import describe, in_own_location, make_manager, resume_point
from thrifty.checkpointing.store import CheckpointInfo, CheckpointManager
from thrifty.checkpointing.store.storage import is_remote, redact
from thrifty.config import CheckpointConfig, TrainConfig, read_config_file
from thrifty.errors import RunAlreadyFinished, ThriftyError, fix
from thrifty.measure.cost import LostWork, finished_cost, lost_work
from thrifty.measure.loggers import make_loggers, require_packages
from thrifty.records.stop import StopReason
from thrifty.rundir.config_changes import (
    Change,
    ResumeChanges,
    budget_grew,
    format_applied,
    same_config,
    write_run_config,
)
from thrifty.rundir.files import MetricsLog, default_run_dir, prepare_run_dir, truncate_metrics
from thrifty.rundir.lock import RunLock
from thrifty.rundir.ownership import (
    check_run_dir,
    checkpoint_folder,
    has_saves,
    remove_checkpoints,
)

log = logging.getLogger("thrifty")


@dataclass
class Claimed:
    """A run directory this process now holds: where, its lock and checkpoint store, what to
    resume."""

    run_dir: Path
    lock: RunLock
    manager: CheckpointManager
    resume: CheckpointInfo | str | None  # the checkpoint to load, or None: step 0
    why: str  # how `resume` was chosen, for the log
    extending: bool = False  # a finished run trained further with a larger budget
    lost: LostWork = field(default_factory=LostWork)


def choices(fresh: str) -> str:
    """The way out of a run directory already in use: another run.out, or `fresh` (start
    over) with run.overwrite."""
    return (
        f"{fix('run.out', phrase='choose another')}, or {fresh} with "
        f"{fix('run.overwrite', True, phrase='with its key')}"
    )


def run_dir_of(config: TrainConfig) -> Path:
    """The run directory: run.out, else runs/<run.name>."""
    return Path(config.run.out) if config.run.out else default_run_dir(config.run.name)


def claim_run_dir(config: TrainConfig) -> Claimed:
    """Lock the run directory, refuse what must not be written over, and choose the checkpoint
    to resume from. The lock is released if anything after it fails."""
    require_packages(config.log)  # a missing logger package: one line, nothing touched yet
    c = config.checkpoint
    run_dir = run_dir_of(config)
    # Before anything is read or written there: one writer per run directory and location.
    other = fix("run.out", phrase="use another")
    saves = checkpoint_folder(run_dir, c)  # named by no other run while this one writes there
    lock = RunLock(run_dir, c.location, c.storage_options, saves=saves, run_dir_fix=other).acquire()
    try:
        return _claim(config, run_dir, lock)
    except BaseException:
        lock.release()
        raise


def _claim(config: TrainConfig, run_dir: Path, lock: RunLock) -> Claimed:
    r, c = config.run, config.checkpoint
    # Before anything is written: nothing thrifty did not write is in the way.
    check_run_dir(run_dir, c, overwrite=r.overwrite, tensorboard=config.log.tensorboard)
    extending = (run_dir / "summary.json").exists() and not r.overwrite
    if extending:
        grew = _finished_run(config, run_dir)
        log.info("extending the finished run: %s", ", ".join(g.describe() for g in grew))
    manager = make_manager(c, run_dir)
    manager.probe()  # a read-only dir, a file, a missing bucket: fail before step 1
    restart = False
    if r.overwrite:
        ref, why = overwrite_start(run_dir, c, manager)
    else:
        refuse_changed_resume(run_dir, c, manager)
        ref, why = resume_point(c, manager)
    if ref is None and not r.overwrite:
        if manager.has_checkpoints():
            raise ThriftyError(
                f"{manager.location} holds checkpoints and checkpoint.resume = never: "
                + choices("start over")
            )
        if c.resume == "auto" and (run_dir / "metrics.jsonl").exists():
            # An attempt that died before its first checkpoint: nothing to resume, nothing
            # lost but those steps. Start over, and say so; not when it saved somewhere else.
            refuse_saves_elsewhere(run_dir, c)
            log.warning(
                "%s holds an unfinished run with no checkpoint (it ended before its first "
                "save): starting it over from step 0",
                run_dir,
            )
            restart = True
    # Started over from a named checkpoint: what the run wrote before goes, as with step 0.
    resuming = ref is not None and not r.overwrite
    run_dir = prepare_run_dir(run_dir, r.overwrite or restart, resuming=resuming)
    return Claimed(run_dir, lock, manager, ref, why, extending)


def _finished_run(config: TrainConfig, run_dir: Path) -> list[Change]:
    """A finished run: the budgets that grew, to train it further. With the same config there
    is nothing to do (RunAlreadyFinished); with another it is refused, as it is when its
    config.toml is missing or it diverged (a failure, not a result to hand back)."""
    path = run_dir / "config.toml"
    saved = read_config_file(path) if path.exists() else None
    current = config.to_dict(secrets=False)
    grew = budget_grew(saved, current) if saved is not None else []
    if grew:
        return grew
    summary = _read_summary(run_dir)
    if (
        saved is not None
        and summary.get("stop_reason") != StopReason.DIVERGED
        and same_config(saved, current)
    ):
        raise RunAlreadyFinished(_done_message(run_dir, summary), run_dir, summary)
    raise ThriftyError(
        f"run directory {run_dir} holds a finished run (summary.json): "
        + choices("start it over")
        + ", or give a larger budget to train it further"
    )


def _read_summary(run_dir: Path) -> dict[str, Any]:
    try:
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _done_message(run_dir: Path, summary: dict[str, Any]) -> str:
    steps, reason = summary.get("steps"), summary.get("stop_reason")
    how = f" ({steps} steps, stopped by {reason})" if isinstance(steps, int) and reason else ""
    again = (
        f"{fix('run.overwrite', True)} starts it over, "
        f"{fix('run.max_steps', phrase='a larger budget')} trains it further"
    )
    return (
        f"run directory {run_dir} is done: it holds a finished run of this config{how}, so "
        f"there is nothing to train; {again}"
    )


def overwrite_start(
    run_dir: Path, checkpoint: CheckpointConfig, manager: CheckpointManager
) -> tuple[CheckpointInfo | str | None, str]:
    """--overwrite: the run starts over (`start_over`), from step 0, or from the checkpoint
    checkpoint.resume names elsewhere than the run's own saves, which are deleted first (one
    of them is refused before anything is deleted)."""
    named = checkpoint.resume not in ("auto", "never")
    if named and in_own_location(checkpoint.resume, manager):
        raise ThriftyError(
            f"checkpoint.resume = {redact(checkpoint.resume)} is one of this run's own "
            f"checkpoints, which {fix('run.overwrite', True)} deletes: resume from it without "
            f"{fix('run.overwrite', True)}, or copy it elsewhere first"
        )
    start_over(run_dir, checkpoint, manager)
    if named:
        return checkpoint.resume, f"checkpoint {redact(checkpoint.resume)} (overwrite)"
    return None, "overwrite"


def refuse_changed_resume(
    run_dir: Path, checkpoint: CheckpointConfig, manager: CheckpointManager
) -> None:
    """A run with saves of its own, started again with a checkpoint.resume that names another
    checkpoint than the one it began with (or than auto/never), is refused in one line.

    The same command relaunched resumes the run's own newest save (`resume_point`); a new
    checkpoint is a new instruction, and taking either silently would drop the other: the
    run's own training, or the checkpoint the user just named (perhaps another model's). A
    checkpoint among the run's own saves is a rollback, loaded as named."""
    now = checkpoint.resume
    if now in ("auto", "never") or in_own_location(now, manager):
        return
    before = _began_with(run_dir)
    if before is None or same_place(before, now) or not manager.has_checkpoints():
        return
    raise ThriftyError(
        f"checkpoint.resume changed from {before!r} to {redact(now)!r}, and run directory "
        f"{run_dir} holds the run's own checkpoints at {redact(manager.location)}: to start "
        f"from {redact(now)}, "
        + choices("start this run over from it")
        + f"; to continue this run, {fix('checkpoint.resume', 'auto')}"
    )


def _began_with(run_dir: Path) -> str | None:
    """The checkpoint.resume the run in `run_dir` was started with (credentials removed), as
    its config.toml says; None when it says nothing (no config.toml of a run's)."""
    try:
        before = read_config_file(run_dir / "config.toml").get("checkpoint", {}).get("resume")
    except (OSError, ValueError, ThriftyError):
        return None
    return before if isinstance(before, str) else None


def start_over(run_dir: Path, checkpoint: CheckpointConfig, manager: CheckpointManager) -> None:
    """--overwrite: the saves in the run's own checkpoints/ folder (where it saves, or stages
    a URL's saves) are deleted, thrifty's only (`check_run_dir` refused anything else). Saves
    at a place the user chose (checkpoint.location, checkpoint.local_dir) are never deleted:
    the newest of them would outrank the new run's, so the run is refused while any are there.
    Checked before anything is deleted."""
    own = run_dir / "checkpoints"
    # Where this run writes its saves (a URL's staging folder): its own folder, or yours.
    staged_here = checkpoint_folder(run_dir, checkpoint).resolve() == own.resolve()
    if checkpoint.location is not None and manager.has_checkpoints(local=not staged_here):
        staged = is_remote(checkpoint.location) and not staged_here
        where = manager.location + (f" (or its local_dir {manager.local_dir})" if staged else "")
        raise ThriftyError(
            f"checkpoint.location {where} holds checkpoints of an earlier run, which "
            f"{fix('run.overwrite', True)} does not delete and the new run would resume in "
            "place of its own: delete them, or choose another checkpoint.location"
        )
    if staged_here:
        remove_checkpoints(own)


def refuse_saves_elsewhere(run_dir: Path, checkpoint: CheckpointConfig) -> None:
    """An unfinished run found no checkpoint where this one looks: refuse to start it over
    when it saved elsewhere, in the run's own checkpoints/ folder (this run names another
    location) or at the location its config.toml names. Nothing is lost silently; a URL there
    is not listed (its credentials may be another's), so it is refused on its name alone."""
    elsewhere = saves_elsewhere(run_dir, checkpoint)
    if elsewhere is None:
        return
    here = redact(checkpoint.location) if checkpoint.location else run_dir / "checkpoints"
    raise ThriftyError(
        f"run directory {run_dir} holds an unfinished run that saved its checkpoints to "
        f"{elsewhere}, not to {here}: give "
        f"checkpoint.location = {elsewhere!r} to resume it, or start it over with "
        f"{fix('run.overwrite', True)}"
    )


def saves_elsewhere(run_dir: Path, checkpoint: CheckpointConfig) -> str | None:
    """Where the run in `run_dir` saved, when it is not where `checkpoint` looks; None when
    nothing says it saved anywhere else."""
    own = run_dir / "checkpoints"
    if checkpoint_folder(run_dir, checkpoint).resolve() != own.resolve() and has_saves(own):
        return str(own)
    path = run_dir / "config.toml"
    try:
        before = read_config_file(path).get("checkpoint", {}).get("location")
    except (OSError, ValueError, ThriftyError):
        return None  # no config.toml of a run's: nothing says where it saved
    if not isinstance(before, str) or same_place(before, checkpoint.location):
        return None
    return before if is_remote(before) or has_saves(Path(before)) else None


def same_place(before: str, now: str | None) -> bool:
    """Whether a location recorded in a run's config.toml (credentials removed) is `now`."""
    if now is None:
        return False
    if is_remote(before) or is_remote(now):
        return before.rstrip("/") == redact(now).rstrip("/")
    return os.path.abspath(os.path.expanduser(before)) == os.path.abspath(os.path.expanduser(now))


def record_opening(
    claimed: Claimed,
    config: TrainConfig,
    *,
    step: int,
    seconds: float,
    changes: ResumeChanges,
    kept_horizon: int | None,
) -> MetricsLog:
    """Write the run's config.toml and open its metrics log, once the state is loaded: a
    resumed run's metrics past the checkpoint are cut (and the work they held billed). The
    log feeds the loggers `config.log` asks for (rank 0's, as the log is)."""
    run_dir, resumed = claimed.run_dir, claimed.resume is not None
    metrics = run_dir / "metrics.jsonl"
    if resumed:
        cut = truncate_metrics(metrics, step)
        if cut.damaged:
            log.warning(
                "%s held %d damaged line%s (cut short by a kill or a full disk, bad bytes, or "
                "not a record): set aside in %s; its %d whole records are kept",
                metrics,
                cut.damaged,
                "s" if cut.damaged > 1 else "",
                cut.aside,
                len(cut.records),
            )
        # Steps past the checkpoint were paid for and are done again: bill them.
        claimed.lost = lost_work(cut.records, step, seconds, finished_cost(run_dir))
        if claimed.extending:  # unfinished again: an interruption now resumes as usual
            (run_dir / "summary.json").unlink(missing_ok=True)
    # metrics.jsonl first: a config.toml with no run beside it is not taken for thrifty's.
    metrics.touch()
    write_run_config(
        run_dir / "config.toml",
        config.to_dict(secrets=False),
        step=step,
        changes=(changes if resumed else ResumeChanges()).changes,
        resumed=resumed,
    )
    loggers = make_loggers(
        config.log,
        run_dir,
        run_name=config.run.name,
        params=config.to_dict(secrets=False) if config.log.mlflow else {},
        step=step,
        resumed=resumed,
    )
    metrics_log = MetricsLog(metrics, sinks=loggers)
    if resumed:
        metrics_log.write([{"step": step, "event": "resumed", **claimed.lost.to_record()}])
    applied = format_applied(changes, kept_horizon=kept_horizon) if resumed else None
    if applied is not None:
        log.info(applied)
        metrics_log.write([{"step": step, **changes.event()}])
    log.info(describe(config.checkpoint, claimed.manager.location))
    return metrics_log
