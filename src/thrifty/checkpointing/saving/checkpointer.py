"""The run checkpointer: everything about saving and restoring one run, in one place.

It is handed the stateful parts of a run and answers the loop's questions: is a save due, save
now (on an interval, in an emergency, at the end), roll the weights back. It opens the run
directory, chooses the checkpoint to resume from, checks that it fits this run (model, batch,
layout, config) and loads it. It writes through the checkpoint store (`CheckpointManager`,
rank 0's) and listens to the preemption watcher (every rank's) itself.

The parts: the model and optimizer are laid out by the strategy (whole, or in each rank's
shards); the scheduler follows the resume's config changes (`restore_scheduler`); the random
streams and the data's state are each rank's own. Every other part sits in `states`, a
`dict[str, Stateful]` saved and loaded by name: a new piece of state joins it by having
`state_dict`/`load_state_dict`. The state carries its layout's number (`state_format`).

Under several processes rank 0 decides and writes; every rank loads the same checkpoint
folder, which must be visible to all of them (`thrifty.checkpointing.saving.shared_folders`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from thrifty.checkpointing.saving.opening import Claimed, claim_run_dir, record_opening
from thrifty.checkpointing.saving.preemption import PreemptionWatcher
from thrifty.checkpointing.saving.rng import rng_state, seed_everything, set_rng_state
from thrifty.checkpointing.saving.saves import SaveInterval, finish_uploads, make_watcher
from thrifty.checkpointing.saving.schedule_state import restore_scheduler, scheduler_kind
from thrifty.checkpointing.saving.shared_folders import (
    check_visible,
    local_checkpoint_folder,
    read_checkpoint_folder,
)
from thrifty.checkpointing.saving.state_format import (
    STATE_VERSION,
    Stateful,
    check_compatible,
    check_thrifty_state,
    state_is_finite,
    upgrade_state,
)
from thrifty.checkpointing.store import CheckpointManager
from thrifty.config import TrainConfig
from thrifty.data.geometry import BatchGeometry
from thrifty.data.sampling import SHUFFLE
from thrifty.errors import ThriftyError
from thrifty.levers.early_stopping import EarlyStopping
from thrifty.levers.precision import LossScaler
from thrifty.measure.cost import LostWork
from thrifty.measure.guard import RunGuard
from thrifty.records.state import TrainState
from thrifty.rundir.config_changes import (
    ResumeChanges,
    check_resume_changes,
    optimizer_settings,
    resume_horizon,
)
from thrifty.rundir.files import MetricsLog
from thrifty.rundir.lock import RunLock
from thrifty.strategies.base import Strategy, shapes
from thrifty.strategies.elastic import check_effective_kept
from thrifty.strategies.process_group import Distributed

log = logging.getLogger("thrifty")


@dataclass
class RunParts:
    """The parts of a run a checkpoint holds besides its counters, by name for the loop."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    # An LRScheduler, rebuilt when a resume changes the schedule's horizon; or a UserScheduler
    scheduler: Any
    scaler: LossScaler
    early_stopping: EarlyStopping
    guard: RunGuard
    data: Any = None  # the training data's state beyond its position (a TrainBatches)


@dataclass(frozen=True)
class Layout:
    """How the run's batch is laid out: what a checkpoint must match to continue it."""

    geometry: BatchGeometry
    steps_per_epoch: int | None  # None: data of unknown length (a stream)
    horizon: int | None  # the schedule's steps


class RunCheckpointer:
    """Saves and restores one run; see the module's docstring."""

    def __init__(
        self,
        config: TrainConfig,
        dist: Distributed,
        strategy: Strategy,
        parts: RunParts,
        progress: TrainState,
        layout: Layout,
        make_scheduler: Callable[[int | None], Any] | None,
    ) -> None:
        self.config = config
        self.dist = dist
        self.strategy = strategy
        self.parts = parts
        self.progress = progress
        self.layout = layout
        self.horizon = layout.horizon
        self._make_scheduler = make_scheduler
        # The parts saved and loaded by name, each whole on rank 0 (see the module's docstring).
        self.states: dict[str, Stateful] = {
            "scaler": parts.scaler,
            "early_stopping": parts.early_stopping,
            "guard": parts.guard,
            "progress": progress,
        }
        self.interval = SaveInterval(config.checkpoint, spot=config.cost.pricing == "spot")
        self.manager: CheckpointManager | None = None  # rank 0's, once the run is open
        self.watcher: PreemptionWatcher | None = None  # every rank's, once the run is open
        self.run_dir: Path | None = None
        self.metrics: MetricsLog | None = None  # rank 0's, once the run is open
        self.lost = LostWork()  # steps a preemption threw away before this attempt
        self.cost: Any = None  # the run's CostMeter once its monitor is built: each manifest
        # carries what the run had paid (CostMeter.record), for `thrifty runs` on a bucket
        self.resume_changes = ResumeChanges()  # set on resume: what differs from the checkpoint
        # The step of the newest checkpoint this run has (resumed from, or saved): what a rank
        # that lost another can tell its launcher to resume from. None: none yet.
        self.newest_step: int | None = None
        self._lock: RunLock | None = None

    # --- opening the run -----------------------------------------------------------------------

    def open(self) -> Path:
        """Claim the run directory (rank 0), load the checkpoint to resume from on every rank,
        and record the run's config. Returns the run directory."""
        d = self.dist
        claimed: Claimed | None = None

        def on_rank0() -> tuple[str, str, str | None, str]:
            nonlocal claimed
            claimed = claim_run_dir(self.config)
            self._lock = claimed.lock
            ref = claimed.resume
            folder = None if ref is None else local_checkpoint_folder(ref)
            return str(claimed.run_dir), claimed.manager.local_dir, folder, claimed.why

        if not d.enabled:
            claimed = claim_run_dir(self.config)
            self._lock = claimed.lock
            if claimed.resume is not None:
                self.load_state_dict(claimed.manager.load(claimed.resume))
            folder, why, run_dir = claimed.resume, claimed.why, str(claimed.run_dir)
        else:
            run_dir, checkpoint_dir, folder, why = d.on_main(on_rank0)
            check_visible(d, checkpoint_dir)
            if folder is not None:
                self.load_state_dict(read_checkpoint_folder(d, folder), shards=folder)
        self.run_dir = Path(run_dir)
        self.manager = claimed.manager if claimed is not None else None
        self.watcher = make_watcher(self.config.spot)
        if folder is not None:
            log.info("resumed from step %d (%s)", self.progress.step, why)
        if claimed is not None:
            kept = self.horizon if self.config.schedule.total_steps is None else None
            self.metrics = record_opening(
                claimed,
                self.config,
                step=self.progress.step,
                seconds=self.progress.seconds,
                changes=self.resume_changes,
                kept_horizon=kept,
            )
            self.lost = claimed.lost
        return self.run_dir

    def release(self) -> None:
        """Let go of the run directory (the end of fit, however it ended)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # --- the loop's questions ------------------------------------------------------------------

    @property
    def _watch(self) -> PreemptionWatcher:
        if self.watcher is None:
            raise ThriftyError("the run is not open: fit() opens it")
        return self.watcher

    @property
    def _store(self) -> CheckpointManager:
        if self.manager is None:
            raise ThriftyError("only rank 0 writes and reads checkpoints through its manager")
        return self.manager

    @property
    def preempted(self) -> bool:
        return self._watch.requested

    def start(self) -> None:
        """The loop starts: the save interval counts from here, the preemption watch begins."""
        watcher, step = self._watch, self.progress.step
        self.interval.saved(step)
        watcher.step = watcher.saved_step = step  # a resumed step is saved
        if self.manager is not None:
            watcher.written = lambda: self._store.newest_written
        watcher.start()

    def due(self, step: int) -> bool:
        """Whether the interval asks for a save after optimizer step `step` (a clock read)."""
        self._watch.step = step  # what a forced stop would lose counts it
        return self.interval.due(step)

    def emergency_begins(self, step: int) -> None:
        """The emergency checkpoint of step `step` is being made (its state gathered, then
        written): a Ctrl-C now is told how many steps stopping at once would lose."""
        watcher = self._watch
        watcher.step = watcher.saving = step

    def save(self, *, emergency: bool = False, final: bool = False) -> float:
        """Checkpoint this step; returns the seconds training stood still for it.

        Rank 0 writes the state with every rank's RNG; under FSDP every rank first writes its
        shard into the step's folder, and rank 0's manifest, written last, publishes the
        checkpoint once all shards are on disk. No state that is not finite is written: the
        newest checkpoint stays the last good one."""
        start = time.perf_counter()
        self._save(emergency, final)
        d = self.dist
        d.timeouts.wait_for_main(d.rank, d.barrier)  # the others wait while rank 0 writes
        return time.perf_counter() - start

    def _save(self, emergency: bool, final: bool) -> None:
        d, p, watcher = self.dist, self.parts, self._watch
        step, metric = self.progress.step, self.progress.val_loss
        if self.config.guard.enabled and d.any_of(not state_is_finite(p.model, p.optimizer))[0]:
            log.error(
                "not checkpointing step %d: the weights or optimizer state are not finite; the "
                "newest checkpoint is the last good one",
                step,
            )
            return
        shard_start = time.perf_counter()
        files, sharded = self.strategy.write_shards(
            p.model, p.optimizer, lambda: self._store.begin(step)
        )
        shard_seconds = time.perf_counter() - shard_start if files else 0.0
        rngs = d.gather(rng_state()) if d.enabled else None
        datas = d.gather(self._data_state()) if d.enabled else None
        self.newest_step = step
        if not d.is_main:
            self._saved(step)
            return
        state = self.state_dict()
        if rngs is not None:
            state["rank_rng"] = rngs
        if datas is not None:
            state["rank_data"] = datas
        if sharded is not None:
            state["sharded"] = sharded
        if emergency:
            other = None if watcher.requested else "a preemption notice on another rank"
            self._emergency_save(step, state, metric, files, other or watcher.reason)
            return
        manager = self._store
        manager.save(step, state, metric=metric, extra_files=files, record=self._record())
        if final:  # written in the background: finish() waits
            return
        self._saved(step)
        if self.interval.measuring:
            manager.wait(uploads=False)  # once: the interval needs the full save time
            self.interval.measured(
                manager.last_stall_seconds + shard_seconds,
                manager.last_save_seconds + shard_seconds,
            )

    def _record(self) -> dict[str, Any] | None:
        return None if self.cost is None else self.cost.record(self.progress.seconds)

    def _saved(self, step: int) -> None:
        """Save `step` was handed over. The watcher's count of what a stop at once loses starts
        from it only once it is on disk: where the manager writes in the background, it asks."""
        self.interval.saved(step)
        if self.manager is None:
            self._watch.saved_step = step

    def _emergency_save(
        self, step: int, state: dict[str, Any], metric: float | None, files: Any, reason: str
    ) -> None:
        """Save now and wait for it (and its upload) up to checkpoint.upload_deadline."""
        manager, watcher, c = self._store, self._watch, self.config.checkpoint
        log.warning("%s: saving an emergency checkpoint at step %d", reason, step)
        self.emergency_begins(step)
        manager.save(step, state, metric=metric, extra_files=files, record=self._record())
        done = manager.wait(c.upload_deadline_seconds)
        watcher.saving, watcher.saved_step = None, step
        pending = manager.pending_uploads if done else [step]
        if pending:
            log.warning(
                "upload of step(s) %s not confirmed within %s; the local copy in %s is kept",
                pending,
                c.upload_deadline,
                manager.local_dir,
            )

    def finish(self) -> dict[str, Any] | None:
        """Wait for the saves in flight (and uploads, up to their deadline) and stop watching;
        where the newest checkpoint is (rank 0), for the run's summary."""
        watcher = self._watch
        status = None
        try:
            if self.manager is not None:
                status = finish_uploads(self.manager, self.config.checkpoint)
        finally:
            watcher.stop()
        return status if self.dist.is_main else None

    def abandon(self) -> None:
        """After an error: stop watching; a save in flight finishes on its own thread, unless
        Ctrl-C forced the stop: then nothing is waited for (an unfinished checkpoint has no
        manifest, and is never resumed from)."""
        if self.watcher is None:
            return
        self.watcher.stop()
        if self.manager is None or self.watcher.forced:
            return
        try:
            self.manager.close(timeout=30)
        except ThriftyError as exc:
            log.warning("checkpoint error while stopping: %s", exc)

    # --- rollback ------------------------------------------------------------------------------

    def roll_back(self, before: int) -> int | None:
        """Restore the model, optimizer moments and loss scale of the newest checkpoint from
        before step `before`; the counters, data position, schedule and random streams stay
        where the run is. Returns the checkpoint's step, or None when there is none."""

        def pick() -> tuple[int, str] | None:
            manager = self._store
            manager.wait()  # the save in flight
            try:
                info = manager.latest(before=before)
            except ThriftyError as exc:
                log.warning("no checkpoint to roll back to: %s", exc)
                return None
            return None if info is None else (info.step, local_checkpoint_folder(info))

        picked = self.dist.on_main(pick)
        if picked is None:
            return None
        to_step, folder = picked
        state = read_checkpoint_folder(self.dist, folder)
        p = self.parts
        lrs = p.scheduler.get_last_lr()
        self._check_model(state, folder)
        self.strategy.load(p.model, p.optimizer, state, folder)
        for group, lr in zip(p.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        if state["scaler"]:
            p.scaler.load_state_dict(state["scaler"])
        return int(to_step)

    # --- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, schedule, the `states` (loss scaler, early stopping, the guard,
        counters), data position, every RNG, and the config: tensors and plain values only
        (loadable weights_only). Under FSDP the model and optimizer are in each rank's shards."""
        p, layout = self.parts, self.layout
        state = self.strategy.full_state(p.model, p.optimizer)
        state.update({name: part.state_dict() for name, part in self.states.items()})
        state.update(
            state_version=STATE_VERSION,
            scheduler=p.scheduler.state_dict(),
            scheduler_kind=scheduler_kind(p.scheduler),
            schedule_horizon=self.horizon,  # the one in use: a resume may have kept an older
            rng=rng_state(),
            data=self._data_state(),
            shuffle=SHUFFLE,
            effective_batch=layout.geometry.effective,
            accumulation=layout.geometry.accumulation,
            world_size=self.dist.world_size,
            strategy=self.strategy.name,
            config=self.config.to_dict(secrets=False),
        )
        return state

    def load_state_dict(self, state: dict[str, Any], *, shards: str | None = None) -> None:
        """Restore a `state_dict()` (of this version or an older one); refuses one written for
        another model, batch or layout. `shards`: the checkpoint folder whose shards hold the
        model and optimizer (FSDP)."""
        p, layout = self.parts, self.layout
        effective, accumulation = layout.geometry.effective, layout.geometry.accumulation
        check_thrifty_state(state, self.strategy.state_keys())
        state = upgrade_state(state, accumulation=accumulation)
        self.strategy.check_resumable(state)
        check_effective_kept(state, effective, self.dist.world_size, self.config.batch)
        # Refused even with run.allow_config_change: the data position cannot follow another
        # effective batch. Checked first, so its message is the one the user sees.
        check_compatible({}, {}, state["effective_batch"], effective)
        # The checkpoint's config against this run's: safe changes pass, optimization changes
        # need run.allow_config_change. A larger budget keeps the schedule's horizon; the new
        # scheduler is built before the optimizer's state is loaded, as building one resets lr.
        current = self.config.to_dict(secrets=False)
        allow = self.config.run.allow_config_change
        changes = check_resume_changes(state["config"], current, allow)
        self.resume_changes = changes
        horizon = resume_horizon(
            state["config"], current, layout.steps_per_epoch, state.get("schedule_horizon")
        )
        if self._make_scheduler is not None and horizon != self.horizon:  # None: a user's
            self.horizon = horizon
            p.scheduler = self._make_scheduler(horizon)
        settings = optimizer_settings(p.optimizer)
        self._check_model(state, shards)
        # Another optimizer starts with fresh moments.
        self.strategy.load(
            p.model, p.optimizer, state, shards, optimizer_state=changes.keeps_optimizer_state
        )
        # With changes, the checkpoint's lr, betas, ... would override this run's.
        restore_scheduler(p.scheduler, state, settings, changes, allow)
        for name, part in self.states.items():
            # An empty state leaves the part as built: a bf16 run's loss scaler, the guard
            # of a checkpoint from before it.
            if state[name]:
                part.load_state_dict(state[name])
        self.newest_step = self.progress.step
        if state["accumulation"] != accumulation:  # another world size: same windows
            windows = self.progress.batch_in_epoch // state["accumulation"]
            self.progress.batch_in_epoch = windows * accumulation
        self._load_data_state(state)
        shuffled = p.data is not None and p.data.thrifty_shuffles
        if shuffled and self.progress.batch_in_epoch and state["shuffle"] != SHUFFLE:
            log.warning(
                "the checkpoint was written with another epoch order (%s, now %s): the rest of "
                "epoch %d follows this one, so some of its samples may repeat and others be left "
                "out; the epochs after it are whole",
                state["shuffle"],
                SHUFFLE,
                self.progress.epoch,
            )
        self._load_rng_state(state)

    def _data_state(self) -> Any:
        data = self.parts.data
        return None if data is None else data.state_dict()

    def _load_data_state(self, state: dict[str, Any]) -> None:
        """This rank's data state, where the training data keeps one (a stream, a stateful
        loader, your sampler)."""
        data = self.parts.data
        datas = state.get("rank_data") or [state["data"]]
        if data is None or all(x is None for x in datas):
            return
        if self.dist.rank < len(datas) and len(datas) == self.dist.world_size:
            data.load_state_dict(datas[self.dist.rank])
        else:  # another world size: the streams' split is another one
            log.warning(
                "the checkpoint's data state is for %d process(es), and this run has %d: the "
                "data restarts its pass",
                len(datas),
                self.dist.world_size,
            )

    def _load_rng_state(self, state: dict[str, Any]) -> None:
        """This rank's random streams; a rank the saved job did not have (a larger world size)
        gets its own seed."""
        d = self.dist
        rngs = state.get("rank_rng") or [state["rng"]]
        if d.rank < len(rngs):
            set_rng_state(rngs[d.rank])
        else:
            seed_everything(self.config.run.seed + d.rank + 1_000_003 * self.progress.step)

    def _check_model(self, state: dict[str, Any], folder: str | None) -> None:
        check_compatible(
            self.strategy.saved_shapes(state, folder),
            shapes(self.parts.model.state_dict()),
            state["effective_batch"],
            self.layout.geometry.effective,
        )
