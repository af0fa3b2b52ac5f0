"""Spot safety for the Trainer: when to checkpoint, what to resume from, and what to do when
the machine is about to be taken back.

`SpotGuard` composes the checkpoint store (`thrifty.checkpoint.CheckpointManager`), the
preemption watcher (`thrifty.run.preemption.PreemptionWatcher`) and the checkpoint interval; the
Trainer asks it one question per step boundary (`due`), which costs a clock read.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.checkpoint import CheckpointInfo, CheckpointManager
from thrifty.checkpoint.storage import is_remote, redact
from thrifty.config import CheckpointConfig, SpotConfig, parse_duration
from thrifty.errors import ThriftyError
from thrifty.run.preemption import PreemptionWatcher

log = logging.getLogger("thrifty")


@dataclass(frozen=True)
class Interval:
    """Checkpoint every `steps` optimizer steps or every `seconds` of training (or neither)."""

    steps: int | None = None
    seconds: float | None = None


def auto_interval(
    stall_seconds: float,
    save_seconds: float,
    interruption_rate: float | str,
    instances: int | None = None,
) -> tuple[float, str]:
    """The Young/Daly interval (seconds) for the measured stall, and a line explaining it.

    With asynchronous saves the work lost to a checkpoint is the stall, not the full write, so
    the stall is Daly's δ; the interval is never shorter than one full write (one save in flight).
    `interruption_rate` is one instance's; the job is interrupted whenever any of its
    `instances` (default: the nodes torchrun started, `job_instances()`) is, so its rate is that
    many times larger.
    """
    from thrifty.plan.spot import checkpoint_interval
    from thrifty.plan.spot import interruption_rate as rate_of

    delta = max(stall_seconds, 1e-3)
    nodes = job_instances() if instances is None else instances
    if isinstance(interruption_rate, str):
        one = rate_of(advisor_bucket=interruption_rate.replace(" ", ""))
        rate_text = f"AWS advisor bucket {interruption_rate} ≈ {one:.2e}/h"
    else:
        one = rate_of(rate_per_hour=interruption_rate)
        rate_text = f"{interruption_rate:g} interruptions/h"
    if nodes > 1:
        rate_text += f" per instance x {nodes} instances"
    plan = checkpoint_interval(delta, rate_per_hour=one * nodes)
    tau = max(plan.daly_seconds, save_seconds)
    rate = plan.rate_per_hour / 3600.0
    overhead = delta / tau + rate * tau / 2  # saving, plus half an interval lost per interruption
    text = (
        f"checkpoint every {_human(tau)} (Daly; measured stall {delta * 1e3:.0f} ms, full save "
        f"{save_seconds:.2f} s, {rate_text}); expected overhead {overhead * 100:.2g}%"
    )
    return tau, text


def job_instances() -> int:
    """The machines the job runs on: torchrun's WORLD_SIZE over LOCAL_WORLD_SIZE (1 alone)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    except ValueError:
        return 1
    return max(1, world // max(1, local))


def _human(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.1f} s"


class SpotGuard:
    """Checkpoints on an interval and on preemption; finds the checkpoint to resume from.

    In a job of several processes every rank has a guard (each watches for its own preemption
    notice), and only rank 0's writes: the others have `writes = False` and no manager.
    """

    def __init__(
        self, checkpoint: CheckpointConfig, spot: SpotConfig, run_dir: Path, *, writes: bool = True
    ) -> None:
        self.config = checkpoint
        default = str(run_dir / "checkpoints")
        location = checkpoint.location or default
        self._manager: CheckpointManager | None = None
        if writes:
            self._manager = CheckpointManager(
                location,
                local_dir=checkpoint.local_dir or (default if is_remote(location) else None),
                keep_last=checkpoint.keep_last,
                keep_best=checkpoint.keep_best,
                storage_options=checkpoint.storage_options,
                upload_retries=checkpoint.upload_retries,
                upload_deadline=checkpoint.upload_deadline_seconds,
            )
        self.watcher = PreemptionWatcher(
            spot.provider,
            base_url=spot.metadata_url,
            poll_interval=spot.poll_seconds,
            signals=spot.signals,
        )
        self.interval = self._fixed_interval()
        self._last_save_step = 0
        self._last_save_time = time.perf_counter()

    @property
    def manager(self) -> CheckpointManager:
        if self._manager is None:
            raise ThriftyError("only rank 0 writes and reads checkpoints through its manager")
        return self._manager

    def _fixed_interval(self) -> Interval:
        every = self.config.every
        if isinstance(every, int):
            return Interval(steps=every)
        if every in ("auto", "off"):
            return Interval()  # auto: set after the first save has been measured
        return Interval(seconds=parse_duration(every, "checkpoint.every"))

    def describe(self) -> str:
        where = redact(self.manager.location)
        if self.interval.steps:
            return f"checkpoints: every {self.interval.steps} steps to {where}"
        if self.interval.seconds:
            return f"checkpoints: every {_human(self.interval.seconds)} to {where}"
        if self.config.every == "auto":
            return (
                f"checkpoints: to {where}; interval auto (Young/Daly after a first measured save)"
            )
        return f"checkpoints: off (emergency and final saves only) to {where}"

    def probe(self) -> None:
        """Write and delete a small file at the checkpoint location (and its local staging
        directory), so that a read-only directory, a path that is a file or a missing bucket
        fails before step 1 with one line naming it and the fix. Only the rank that writes."""
        if self._manager is not None:
            self._manager.probe()

    # --- resume -------------------------------------------------------------------------------

    def resume_point(self) -> tuple[CheckpointInfo | str | None, str]:
        """What `checkpoint.resume` points at: a checkpoint (or its path) to load, or None.

        With resume = auto, None means there is no checkpoint at all; when checkpoints exist but
        none verifies, NoValidCheckpointError (a ThriftyError) says so, naming the location,
        what failed and the choices, and nothing is deleted.
        """
        mode = self.config.resume
        if mode == "never":
            return None, "resume = never"
        if mode == "auto":
            info = self.manager.latest()
            where = redact(self.manager.location)
            return (
                info,
                f"newest valid checkpoint at {where}" if info else f"no checkpoint at {where}",
            )
        return mode, f"checkpoint {redact(mode)}"

    def has_checkpoints(self) -> bool:
        """True when the location holds checkpoints, valid or not (damaged ones count: a fresh
        start must not write over them)."""
        return self.manager.has_checkpoints()

    def load(self, ref: CheckpointInfo | str) -> dict[str, Any]:
        return self.manager.load(ref)

    # --- the step boundary -----------------------------------------------------------------------

    def start(self, step: int) -> None:
        self._last_save_step = step
        self._last_save_time = time.perf_counter()
        self.watcher.step = self.watcher.saved_step = step  # a resumed step is saved
        self.watcher.start()

    @property
    def preempted(self) -> bool:
        return self.watcher.requested

    def due(self, step: int) -> bool:
        """Whether the interval asks for a checkpoint after optimizer step `step`."""
        self.watcher.step = step  # what a forced stop would lose counts it
        if self.config.every == "auto" and self.interval == Interval():
            return step == 1  # the first save measures the stall the auto interval needs
        if self.interval.steps is not None:
            return step - self._last_save_step >= self.interval.steps
        if self.interval.seconds is not None:
            return time.perf_counter() - self._last_save_time >= self.interval.seconds
        return False

    def saved(self, step: int) -> None:
        """Note a checkpoint of step `step` (on a rank that does not write it)."""
        self._last_save_step = self.watcher.saved_step = step
        self._last_save_time = time.perf_counter()

    def save(
        self,
        step: int,
        state: dict[str, Any],
        metric: float | None,
        extra_files: tuple[str, ...] = (),
        extra_stall: float = 0.0,
    ) -> None:
        """An interval checkpoint. `extra_files` were written into `manager.begin(step)`'s
        folder already, taking `extra_stall` seconds of training time (sharded saves)."""
        self.manager.save(step, state, metric=metric, extra_files=extra_files)
        self.saved(step)
        if self.config.every == "auto" and self.interval == Interval():
            self.manager.wait(uploads=False)  # once: the interval needs the full save time
            tau, text = auto_interval(
                self.manager.last_stall_seconds + extra_stall,
                self.manager.last_save_seconds + extra_stall,
                self.config.interruption_rate,
            )
            self.interval = Interval(seconds=tau)
            log.info(text)

    def emergency_begins(self, step: int) -> None:
        """The emergency checkpoint of step `step` is being made (its state gathered, then
        written): a Ctrl-C now is told how many steps stopping at once would lose."""
        self.watcher.step = self.watcher.saving = step

    def emergency_save(
        self,
        step: int,
        state: dict[str, Any],
        metric: float | None,
        extra_files: tuple[str, ...] = (),
        reason: str | None = None,
    ) -> bool:
        """Save now and wait for it (and its upload) up to the configured deadline."""
        log.warning(
            "%s: saving an emergency checkpoint at step %d", reason or self.watcher.reason, step
        )
        self.emergency_begins(step)
        self.manager.save(step, state, metric=metric, extra_files=extra_files)
        done = self.manager.wait(self.config.upload_deadline_seconds)
        self.watcher.saving, self.watcher.saved_step = None, step
        pending = self.manager.pending_uploads if done else [step]
        if pending:
            log.warning(
                "upload of step(s) %s not confirmed within %s; the local copy in %s is kept",
                pending,
                self.config.upload_deadline,
                self.manager.local_dir,
            )
        return done and not pending

    def save_final(
        self,
        step: int,
        state: dict[str, Any],
        metric: float | None,
        extra_files: tuple[str, ...] = (),
    ) -> None:
        """The checkpoint of a finished run (written in the background; `finish` waits)."""
        self.manager.save(step, state, metric=metric, extra_files=extra_files)

    def finish(self) -> None:
        """Wait for the checkpoint in flight to reach local disk, then up to
        checkpoint.upload_deadline for its upload, and stop watching.

        A checkpoint still not uploaded then is kept locally, and a warning says where: see
        `upload_status()` for the same in the run's summary.
        """
        try:
            if self._manager is not None:
                self._manager.close(self.config.upload_deadline_seconds)
                status = self._manager.upload_status()
                if not status["uploaded"]:
                    log.warning(local_only_message(status))
        finally:
            self.watcher.stop()

    def upload_status(self) -> dict[str, Any] | None:
        """Where the newest checkpoint is, for the run's summary; None on a rank that does not
        write. Keys: newest_step, uploaded, local_path, location, error (see
        `CheckpointManager.upload_status`). No I/O."""
        return None if self._manager is None else self._manager.upload_status()

    def abandon(self) -> None:
        """Stop watching after an error; a save in flight finishes on its own thread, unless
        Ctrl-C forced the stop: then nothing is waited for (an unfinished checkpoint has no
        manifest, and is never resumed from)."""
        self.watcher.stop()
        if self._manager is None or self.watcher.forced:
            return
        try:
            self._manager.close(timeout=30)
        except ThriftyError as exc:
            log.warning("checkpoint error while stopping: %s", exc)


def local_only_message(status: Mapping[str, Any]) -> str:
    """One line saying that the newest checkpoint exists only on this machine, and where."""
    return (
        f"the newest checkpoint (step {status['newest_step']}) exists only on this machine, in "
        f"{status['local_path']}, not at {redact(str(status['location']))}: "
        f"{status['error'] or 'its upload did not finish within checkpoint.upload_deadline'}; "
        "copy it there before this machine goes away, or resume on this machine"
    )
