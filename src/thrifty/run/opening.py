"""Opening a run directory (rank 0): one writer, a finished run kept, the checkpoint to resume
from chosen, and the run's config and metrics log written once the state is loaded.

A directory with summary.json holds a finished run and is refused unless the budget grew (it
is then trained further) or run.overwrite; one with checkpoints is resumed (checkpoint.resume
= auto), never silently started over.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from thrifty.checkpoint import CheckpointInfo
from thrifty.config import CheckpointConfig, TrainConfig
from thrifty.errors import ThriftyError
from thrifty.measure.cost import LostWork, lost_work_before_resume
from thrifty.run.config_changes import (
    ResumeChanges,
    budget_grew,
    format_applied,
    read_saved_config,
    write_run_config,
)
from thrifty.run.directory import MetricsLog, default_run_dir, prepare_run_dir, truncate_metrics
from thrifty.run.lock import RunLock
from thrifty.run.loggers import build_loggers, require_packages
from thrifty.run.saves import SpotGuard

log = logging.getLogger("thrifty")


@dataclass
class Claimed:
    """A run directory this process now holds: where, its lock and saves, what to resume."""

    run_dir: Path
    lock: RunLock
    saves: SpotGuard
    resume: CheckpointInfo | str | None  # the checkpoint to load, or None: step 0
    why: str  # how `resume` was chosen, for the log
    extending: bool = False  # a finished run trained further with a larger budget
    lost: LostWork = field(default_factory=LostWork)


def choices(interface: str, other: str, fresh: str) -> str:
    """The way out of a run directory already in use, in the words of who drives us."""
    if interface == "cli":
        return f"choose {other} --out, or {fresh} with --overwrite (run.overwrite = true)"
    return (
        f"give {other} run directory (RunConfig(out=...)), or {fresh} with "
        "RunConfig(overwrite=True)"
    )


def claim_run_dir(config: TrainConfig, interface: str) -> Claimed:
    """Lock the run directory, refuse what must not be written over, and choose the checkpoint
    to resume from. The lock is released if anything after it fails."""
    require_packages(config.log)  # a missing logger package: one line, nothing touched yet
    r, c = config.run, config.checkpoint
    run_dir = Path(r.out) if r.out else default_run_dir(r.name)
    # Before anything is read or written there: one writer per run directory and location.
    fix = "use another --out" if interface == "cli" else "give another RunConfig(out=...)"
    lock = RunLock(run_dir, c.location, c.storage_options, run_dir_fix=fix).acquire()
    try:
        return _claim(config, interface, run_dir, lock)
    except BaseException:
        lock.release()
        raise


def _claim(config: TrainConfig, interface: str, run_dir: Path, lock: RunLock) -> Claimed:
    r, c = config.run, config.checkpoint
    extending = (run_dir / "summary.json").exists() and not r.overwrite
    if extending:
        saved = run_dir / "config.toml"
        current = config.to_dict(secrets=False)
        grew = budget_grew(read_saved_config(saved), current) if saved.exists() else []
        if not grew:
            raise ThriftyError(
                f"run directory {run_dir} holds a finished run (summary.json): "
                + choices(interface, "another", "start it over")
                + ", or give a larger budget to train it further"
            )
        log.info("extending the finished run: %s", ", ".join(g.describe() for g in grew))
    saves = SpotGuard(c, config.spot, run_dir)
    saves.probe()  # a read-only dir, a file, a missing bucket: fail before step 1
    ref, why = (None, "overwrite") if r.overwrite else saves.resume_point()
    if ref is None and not r.overwrite and saves.has_checkpoints():
        raise ThriftyError(
            f"{saves.manager.location} holds checkpoints and checkpoint.resume = never: "
            + choices(interface, "another", "start over")
        )
    if ref is None and r.overwrite:
        remove_local_checkpoints(run_dir, c)
    restart = False
    if ref is None and c.resume == "auto" and (run_dir / "metrics.jsonl").exists():
        # An attempt that died before its first checkpoint: nothing to resume, nothing lost
        # but those steps. Start over, and say so.
        log.warning(
            "%s holds an unfinished run with no checkpoint (it ended before its first save): "
            "starting it over from step 0",
            run_dir,
        )
        restart = True
    run_dir = prepare_run_dir(run_dir, r.overwrite or restart, resuming=ref is not None)
    return Claimed(run_dir, lock, saves, ref, why, extending)


def remove_local_checkpoints(run_dir: Path, checkpoint: CheckpointConfig) -> None:
    """--overwrite starts over: old checkpoints in the run directory must not be resumed later."""
    if checkpoint.location is None and (run_dir / "checkpoints").is_dir():
        shutil.rmtree(run_dir / "checkpoints")


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
    if resumed:
        # Steps past the checkpoint were paid for and are done again: bill them.
        metrics = run_dir / "metrics.jsonl"
        claimed.lost = lost_work_before_resume(metrics, step, seconds)
        truncate_metrics(metrics, step)
        if claimed.extending:  # unfinished again: an interruption now resumes as usual
            (run_dir / "summary.json").unlink(missing_ok=True)
    write_run_config(
        run_dir / "config.toml",
        config.to_dict(secrets=False),
        step=step,
        changes=(changes if resumed else ResumeChanges()).changes,
        resumed=resumed,
    )
    loggers = build_loggers(config, run_dir, step=step, resumed=resumed)
    metrics_log = MetricsLog(run_dir / "metrics.jsonl", sinks=loggers)
    if resumed:
        metrics_log.write([{"step": step, "event": "resumed", **claimed.lost.to_record()}])
    applied = format_applied(changes, kept_horizon=kept_horizon) if resumed else None
    if applied is not None:
        log.info(applied)
        metrics_log.write([{"step": step, **changes.event()}])
    log.info(claimed.saves.describe())
    return metrics_log
