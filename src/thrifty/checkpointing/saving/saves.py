"""When a run checkpoints, where, and what it resumes from: the save interval (a step count,
a duration, or Young/Daly's measured on the first save), the checkpoint store and preemption
watcher a run uses (`make_manager`, `make_watcher`), and the end of a run's uploads.

The run checkpointer (`thrifty.checkpointing.saving.checkpointer`) drives them; the interval answers its one
question per step boundary (`SaveInterval.due`), which costs a clock read.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thrifty.checkpointing.saving.preemption import PreemptionWatcher
from thrifty.checkpointing.store import CheckpointInfo, CheckpointManager, NoValidCheckpointError
from thrifty.checkpointing.store.manifest import step_of
from thrifty.checkpointing.store.storage import is_remote, redact
from thrifty.config import CheckpointConfig, SpotConfig, parse_duration

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
    max_seconds: float | None = None,
    spot: bool = True,
) -> tuple[float, str]:
    """The Young/Daly interval (seconds) for the measured stall, at most `max_seconds`
    (checkpoint.max_interval: the work a machine that dies without notice takes with it), and
    a line explaining it.

    With asynchronous saves the work lost to a checkpoint is the stall, not the full write, so
    the stall is Daly's δ; the interval is never shorter than one full write (one save in flight).
    `interruption_rate` is one instance's; the job is interrupted whenever any of its
    `instances` (default: the nodes torchrun started, `job_instances()`) is, so its rate is that
    many times larger. `spot`: the run is priced for spot (cost.pricing); off spot, an advisor
    bucket is named as the rate it stands for, not as AWS's spot figure.
    """
    from thrifty.plan.spot import checkpoint_interval
    from thrifty.plan.spot import interruption_rate as rate_of

    delta = max(stall_seconds, 1e-3)
    nodes = job_instances() if instances is None else instances
    if isinstance(interruption_rate, str):
        one = rate_of(advisor_bucket=interruption_rate.replace(" ", ""))
        rate_text = (
            f"AWS advisor bucket {interruption_rate} ≈ {one:.2e}/h"
            if spot
            else f"an assumed {one:.2e} interruptions/h (checkpoint.interruption_rate)"
        )
    else:
        one = rate_of(rate_per_hour=interruption_rate)
        rate_text = f"{interruption_rate:g} interruptions/h"
    if nodes > 1:
        rate_text += f" per instance x {nodes} instances"
    plan = checkpoint_interval(delta, rate_per_hour=one * nodes)
    daly = plan.daly_seconds
    capped = max_seconds is not None and daly > max_seconds
    tau = max(max_seconds if capped and max_seconds is not None else daly, save_seconds)
    rate = plan.rate_per_hour / 3600.0
    overhead = delta / tau + rate * tau / 2  # saving, plus half an interval lost per interruption
    why = f"checkpoint.max_interval; Daly's optimum {_human(daly)}" if capped else "Daly"
    text = (
        f"checkpoint every {_human(tau)} ({why}; measured stall {delta * 1e3:.0f} ms, full "
        f"save {save_seconds:.2f} s, {rate_text}); expected overhead {overhead * 100:.2g}%"
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


class SaveInterval:
    """When the next interval checkpoint is due: every `checkpoint.every` steps or seconds,
    never ("off": emergency and final saves only), or ("auto") after the Young/Daly interval
    measured on the first save."""

    def __init__(self, config: CheckpointConfig, spot: bool = True) -> None:
        self.config = config
        self.spot = spot  # priced for spot: the interval's line names the advisor's figures
        self.interval = fixed_interval(config)
        self.last_step = 0
        self.last_time = time.perf_counter()

    @property
    def measuring(self) -> bool:
        """every = "auto" before its first save: that save is measured to set the interval."""
        return self.config.every == "auto" and self.interval == Interval()

    def due(self, step: int) -> bool:
        """Whether the interval asks for a checkpoint after optimizer step `step`."""
        if self.measuring:
            return step == 1  # the first save measures the stall the auto interval needs
        if self.interval.steps is not None:
            return step - self.last_step >= self.interval.steps
        if self.interval.seconds is not None:
            return time.perf_counter() - self.last_time >= self.interval.seconds
        return False

    def saved(self, step: int) -> None:
        """An interval checkpoint of step `step` (or the step the loop starts from)."""
        self.last_step = step
        self.last_time = time.perf_counter()

    def measured(self, stall_seconds: float, save_seconds: float) -> None:
        """every = "auto": the first save took `stall_seconds` of training and `save_seconds`
        in all; the interval follows from them."""
        tau, text = auto_interval(
            stall_seconds,
            save_seconds,
            self.config.interruption_rate,
            max_seconds=self.config.max_interval_seconds,
            spot=self.spot,
        )
        self.interval = Interval(seconds=tau)
        log.info(text)


def fixed_interval(config: CheckpointConfig) -> Interval:
    """checkpoint.every as an interval; empty for "off" and, until measured, "auto"."""
    every = config.every
    if isinstance(every, int):
        return Interval(steps=every)
    if every in ("auto", "off"):
        return Interval()
    return Interval(seconds=parse_duration(every, "checkpoint.every"))


def make_manager(config: CheckpointConfig, run_dir: Path) -> CheckpointManager:
    """The checkpoint store of a run (rank 0's): checkpoint.location, by default the run
    directory's checkpoints/, which also stages the saves to a URL without a local_dir."""
    default = str(run_dir / "checkpoints")
    location = config.location or default
    return CheckpointManager(
        location,
        local_dir=config.local_dir or (default if is_remote(location) else None),
        keep_last=config.keep_last,
        keep_best=config.keep_best,
        storage_options=config.storage_options,
        upload_retries=config.upload_retries,
        upload_deadline=config.upload_deadline_seconds,
    )


def make_watcher(spot: SpotConfig) -> PreemptionWatcher:
    """Every rank's preemption watcher (each watches for its own notice); started by the loop."""
    return PreemptionWatcher(
        spot.provider,
        base_url=spot.metadata_url,
        poll_interval=spot.poll_seconds,
        signals=spot.signals,
    )


def describe(config: CheckpointConfig, location: str) -> str:
    """The run's checkpoint line for the log: how often, and where (credentials redacted)."""
    where, interval = redact(location), fixed_interval(config)
    if interval.steps:
        return f"checkpoints: every {interval.steps} steps to {where}"
    if interval.seconds:
        return f"checkpoints: every {_human(interval.seconds)} to {where}"
    if config.every == "auto":
        return f"checkpoints: to {where}; interval auto (Young/Daly after a first measured save)"
    return f"checkpoints: off (emergency and final saves only) to {where}"


def resume_point(
    config: CheckpointConfig, manager: CheckpointManager
) -> tuple[CheckpointInfo | str | None, str]:
    """What `checkpoint.resume` points at: a checkpoint (or its path) to load, or None; and how
    it was chosen, for the log.

    With resume = auto, None means there is no checkpoint at all; when checkpoints exist but
    none verifies, NoValidCheckpointError (a ThriftyError) says so, naming the location, what
    failed and the choices, and nothing is deleted.

    A checkpoint named elsewhere than the run's own location is where the run starts from
    (a warm start): once the run has saved past it, the same command resumes the run's own
    newest save. A relaunch after a preemption repeats the command, and would otherwise go
    back to the named checkpoint every time. One in the run's own location (a rollback) is
    loaded as named.
    """
    mode = config.resume
    if mode == "never":
        return None, "resume = never"
    where = redact(manager.location)
    if mode == "auto":
        info = manager.latest()
        return info, f"newest valid checkpoint at {where}" if info else f"no checkpoint at {where}"
    named = step_of(mode.rstrip("/").rpartition("/")[2])
    if named is not None and not in_own_location(mode, manager):
        try:
            own = manager.latest()
        except NoValidCheckpointError as exc:
            log.warning("%s; starting from %s, which checkpoint.resume names", exc, redact(mode))
            own = None
        if own is not None and own.step > named:
            return own, (
                f"its own newest checkpoint at {where}, past step {named} of {redact(mode)}, "
                "which checkpoint.resume names: the run started from that one"
            )
    return mode, f"checkpoint {redact(mode)}"


def in_own_location(ref: str, manager: CheckpointManager) -> bool:
    """Whether the checkpoint `ref` names is one of the run's own: in its location (or the
    local folder that stages it)."""
    parent = ref.rstrip("/").rpartition("/")[0]
    if is_remote(ref):
        return redact(parent) == manager.location
    own = {os.path.realpath(manager.local_dir), os.path.realpath(manager.location)}
    return os.path.realpath(parent or ".") in own


def finish_uploads(manager: CheckpointManager, config: CheckpointConfig) -> dict[str, Any]:
    """The end of a run: wait for the checkpoint in flight to reach local disk, then up to
    checkpoint.upload_deadline for its upload. A checkpoint still not uploaded then is kept
    locally, and a warning says where. Returns `manager.upload_status()`, for the summary."""
    manager.close(config.upload_deadline_seconds)
    status = manager.upload_status()
    if not status["uploaded"]:
        log.warning(local_only_message(status))
    return status


def local_only_message(status: Mapping[str, Any]) -> str:
    """One line saying that the newest checkpoint exists only on this machine, and where."""
    return (
        f"the newest checkpoint (step {status['newest_step']}) exists only on this machine, in "
        f"{status['local_path']}, not at {redact(str(status['location']))}: "
        f"{status['error'] or 'its upload did not finish within checkpoint.upload_deadline'}; "
        "copy it there before this machine goes away, or resume on this machine"
    )
