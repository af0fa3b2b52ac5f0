"""The run checkpointer: everything about saving and restoring one run, in one place.

It is built with the stateful parts of a run (model, optimizer, scheduler, loss scaler, early
stopping, the guard, the counters) and answers the loop's questions: is a save due, save now
(on an interval, in an emergency, at the end), roll the weights back. It opens the run
directory, chooses the checkpoint to resume from, checks that it fits this run (model, batch,
layout, config) and loads it. The strategy says what each rank writes and reads.

Under several processes rank 0 decides and writes; every rank loads the same checkpoint
folder, which must be visible to all of them.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from thrifty.config import TrainConfig
from thrifty.data.sampling import SHUFFLE
from thrifty.errors import ConfigError, ThriftyError
from thrifty.levers.early_stopping import EarlyStopping
from thrifty.levers.precision import LossScaler
from thrifty.measure.cost import LostWork
from thrifty.records.directory import MetricsLog
from thrifty.records.state import TrainState
from thrifty.run.config_changes import (
    ResumeChanges,
    check_resume_changes,
    optimizer_settings,
    resume_horizon,
)
from thrifty.run.guard import RunGuard
from thrifty.run.lock import RunLock
from thrifty.run.opening import Claimed, claim_run_dir, record_opening
from thrifty.run.rng import rng_state, seed_everything, set_rng_state
from thrifty.run.saves import SpotGuard
from thrifty.run.schedule_state import restore_scheduler, scheduler_kind
from thrifty.strategies.base import Strategy, shapes
from thrifty.strategies.elastic import check_effective_kept
from thrifty.strategies.process_group import Distributed

log = logging.getLogger("thrifty")


@dataclass
class Stateful:
    """The parts of a run a checkpoint holds besides its counters."""

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

    effective_batch: int
    accumulation: int
    steps_per_epoch: int | None  # None: data of unknown length (a stream)
    horizon: int | None  # the schedule's steps


class RunCheckpointer:
    """Saves and restores one run; see the module's docstring."""

    def __init__(
        self,
        config: TrainConfig,
        dist: Distributed,
        strategy: Strategy,
        parts: Stateful,
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
        self.saves: SpotGuard | None = None
        self.run_dir: Path | None = None
        self.metrics: MetricsLog | None = None  # rank 0's, once the run is open
        self.lost = LostWork()  # steps a preemption threw away before this attempt
        self.resume_changes = ResumeChanges()  # set on resume: what differs from the checkpoint
        # The step of the newest checkpoint this run has (resumed from, or saved): what a rank
        # that lost another can tell its launcher to resume from. None: none yet.
        self.newest_step: int | None = None
        self._lock: RunLock | None = None

    # --- opening the run -----------------------------------------------------------------------

    def open(self, interface: str = "api") -> Path:
        """Claim the run directory (rank 0), load the checkpoint to resume from on every rank,
        and record the run's config. Returns the run directory."""
        d = self.dist
        claimed: Claimed | None = None

        def on_rank0() -> tuple[str, str, str | None, str]:
            nonlocal claimed
            claimed = claim_run_dir(self.config, interface)
            self._lock = claimed.lock
            ref = claimed.resume
            folder = None if ref is None else local_checkpoint_folder(claimed.saves, ref)
            return str(claimed.run_dir), claimed.saves.manager.local_dir, folder, claimed.why

        if not d.enabled:
            claimed = claim_run_dir(self.config, interface)
            self._lock = claimed.lock
            if claimed.resume is not None:
                self.load_state_dict(claimed.saves.load(claimed.resume))
            folder, why, run_dir = claimed.resume, claimed.why, str(claimed.run_dir)
        else:
            run_dir, checkpoint_dir, folder, why = d.on_main(on_rank0)
            check_visible(d, checkpoint_dir)
            if folder is not None:
                self.load_state_dict(read_checkpoint_folder(d, folder), shards=folder)
        self.run_dir = Path(run_dir)
        self.saves = (
            claimed.saves
            if claimed is not None
            else SpotGuard(self.config.checkpoint, self.config.spot, self.run_dir, writes=False)
        )
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
    def _saves(self) -> SpotGuard:
        if self.saves is None:
            raise ThriftyError("the run is not open: fit() opens it")
        return self.saves

    @property
    def preempted(self) -> bool:
        return self._saves.preempted

    def start(self) -> None:
        """The loop starts: the save interval counts from here, the preemption watch begins."""
        self._saves.start(self.progress.step)

    def due(self, step: int) -> bool:
        """Whether the interval asks for a save after optimizer step `step` (a clock read)."""
        return self._saves.due(step)

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
        saves, d, p = self._saves, self.dist, self.parts
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
            p.model, p.optimizer, lambda: saves.manager.begin(step)
        )
        shard_seconds = time.perf_counter() - shard_start if files else 0.0
        rngs = d.gather(rng_state()) if d.enabled else None
        datas = d.gather(self._data_state()) if d.enabled else None
        self.newest_step = step
        if not d.is_main:
            saves.saved(step)
            return
        state = self.state_dict()
        if rngs is not None:
            state["rank_rng"] = rngs
        if datas is not None:
            state["rank_data"] = datas
        if sharded is not None:
            state["sharded"] = sharded
        if emergency:
            reason = None if saves.preempted else "a preemption notice on another rank"
            saves.emergency_save(step, state, metric, files, reason=reason)
        elif final:
            saves.save_final(step, state, metric, files)
        else:
            saves.save(step, state, metric, files, shard_seconds)

    def finish(self) -> dict[str, Any] | None:
        """Wait for the saves in flight (and uploads, up to their deadline); where the newest
        checkpoint is (rank 0), for the run's summary."""
        self._saves.finish()
        return self._saves.upload_status() if self.dist.is_main else None

    def abandon(self) -> None:
        """After an error: stop watching; a save in flight finishes on its own thread."""
        if self.saves is not None:
            self.saves.abandon()

    # --- rollback ------------------------------------------------------------------------------

    def roll_back(self, before: int) -> int | None:
        """Restore the model, optimizer moments and loss scale of the newest checkpoint from
        before step `before`; the counters, data position, schedule and random streams stay
        where the run is. Returns the checkpoint's step, or None when there is none."""
        saves = self._saves

        def pick() -> tuple[int, str] | None:
            saves.manager.wait()  # the save in flight
            try:
                info = saves.manager.latest(before=before)
            except ThriftyError as exc:
                log.warning("no checkpoint to roll back to: %s", exc)
                return None
            return None if info is None else (info.step, local_checkpoint_folder(saves, info))

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
        """Model, optimizer, schedule, loss scaler, counters, data position, early stopping,
        the guard, every RNG, and the config: tensors and plain values only (loadable
        weights_only). Under FSDP the model and optimizer are in each rank's shards."""
        p, layout = self.parts, self.layout
        state = self.strategy.full_state(p.model, p.optimizer)
        state.update(
            scheduler=p.scheduler.state_dict(),
            scheduler_kind=scheduler_kind(p.scheduler),
            scaler=p.scaler.state_dict(),
            early_stopping=p.early_stopping.state_dict(),
            guard=p.guard.state_dict(),
            progress=self.progress.state_dict(),
            rng=rng_state(),
            data=self._data_state(),
            shuffle=SHUFFLE,
            effective_batch=layout.effective_batch,
            accumulation=layout.accumulation,
            world_size=self.dist.world_size,
            strategy=self.strategy.name,
            config=self.config.to_dict(secrets=False),
        )
        return state

    def load_state_dict(self, state: dict[str, Any], *, shards: str | None = None) -> None:
        """Restore a `state_dict()`; refuses one written for another model, batch or layout.
        `shards`: the checkpoint folder whose shards hold the model and optimizer (FSDP)."""
        p, layout, d = self.parts, self.layout, self.dist
        needed = self.strategy.state_keys()
        needed += ["scheduler", "scaler", "early_stopping", "progress", "rng", "effective_batch"]
        missing = [key for key in needed if key not in state]
        if missing:
            raise ThriftyError(
                f"the checkpoint holds no {', '.join(missing)} (it has: "
                f"{', '.join(sorted(map(str, state))) or 'nothing'}): it is not a thrifty "
                "training checkpoint; resume from a folder a Trainer wrote, or load the weights "
                "yourself with model.load_state_dict"
            )
        self.strategy.check_resumable(state)
        check_effective_kept(state, layout.effective_batch, d.world_size, self.config.batch)
        # Refused even with run.allow_config_change: the data position cannot follow another
        # effective batch. Checked first, so its message is the one the user sees.
        check_compatible({}, {}, state["effective_batch"], layout.effective_batch)
        # The checkpoint's config against this run's: safe changes pass, optimization changes
        # need run.allow_config_change. A larger budget keeps the schedule's horizon; the new
        # scheduler is built before the optimizer's state is loaded, as building one resets lr.
        current = self.config.to_dict(secrets=False)
        saved_config = state.get("config")
        changes = check_resume_changes(saved_config, current, self.config.run.allow_config_change)
        self.resume_changes = changes
        horizon = resume_horizon(saved_config, current, layout.steps_per_epoch)
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
        allow = self.config.run.allow_config_change
        restore_scheduler(p.scheduler, state, settings, changes, allow)
        if state["scaler"]:  # a bf16/fp32 checkpoint has no loss scale for an fp16 resume
            p.scaler.load_state_dict(state["scaler"])
        p.early_stopping.load_state_dict(state["early_stopping"])
        if "guard" in state:  # checkpoints before the guard have none
            p.guard.load_state_dict(state["guard"])
        self.progress.load_state_dict(state["progress"])
        self.newest_step = self.progress.step
        saved_accumulation = state.get("accumulation", layout.accumulation)
        if saved_accumulation != layout.accumulation:  # another world size: same windows
            windows = self.progress.batch_in_epoch // saved_accumulation
            self.progress.batch_in_epoch = windows * layout.accumulation
        self._load_data_state(state)
        shuffled = self.parts.data is not None and self.parts.data.thrifty_shuffles
        if shuffled and self.progress.batch_in_epoch and state.get("shuffle") != SHUFFLE:
            log.warning(
                "the checkpoint was written with another epoch order (%s, now %s): the rest of "
                "epoch %d follows this one, so some of its samples may repeat and others be left "
                "out; the epochs after it are whole",
                state.get("shuffle", "randperm"),
                SHUFFLE,
                self.progress.epoch,
            )
        rngs = state.get("rank_rng") or [state["rng"]]
        if d.rank < len(rngs):
            set_rng_state(rngs[d.rank])
        else:  # a rank the saved job did not have (a larger world size)
            seed_everything(self.config.run.seed + d.rank + 1_000_003 * self.progress.step)

    def _data_state(self) -> Any:
        data = self.parts.data
        return None if data is None else data.state_dict()

    def _load_data_state(self, state: dict[str, Any]) -> None:
        """This rank's data state, where the training data keeps one (a stream, a stateful
        loader, your sampler)."""
        data = self.parts.data
        datas = state.get("rank_data") or [state.get("data")]
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

    def _check_model(self, state: dict[str, Any], folder: str | None) -> None:
        check_compatible(
            self.strategy.saved_shapes(state, folder),
            shapes(self.parts.model.state_dict()),
            state["effective_batch"],
            self.layout.effective_batch,
        )


# --- checks ----------------------------------------------------------------------------------


def check_compatible(
    saved: Mapping[str, tuple[int, ...]],
    current: Mapping[str, tuple[int, ...]],
    saved_effective_batch: int,
    effective_batch: int,
) -> None:
    """Raise a one-line error saying what differs between a checkpoint's model (parameter
    shapes by name) and effective batch and this run's."""
    fix = "resume with the config that wrote it, or start fresh with another --out"
    for key in sorted(set(saved) | set(current)):
        if key not in current or key not in saved:
            where = "only in the checkpoint" if key in saved else "only in this model"
            raise ConfigError(
                f"the checkpoint is for another model: parameter {key} is {where}: {fix}"
            )
        if saved[key] != current[key]:
            raise ConfigError(
                f"the checkpoint is for another model: {key} is {saved[key]} there and "
                f"{current[key]} here: {fix}"
            )
    if saved_effective_batch != effective_batch:
        raise ConfigError(
            f"the checkpoint was trained with an effective batch of {saved_effective_batch}, this "
            f"run has {effective_batch}: resuming would change the optimization; {fix}"
        )


def state_is_finite(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    """Whether this rank's weights and optimizer state are all finite: one host sync, at a
    save only."""
    tensors = [p.detach() for p in model.parameters()]
    tensors += [
        v
        for per_param in optimizer.state.values()
        for v in per_param.values()
        if isinstance(v, torch.Tensor) and v.is_floating_point()
    ]
    local = [getattr(t, "to_local", lambda t=t: t)() for t in tensors]  # FSDP: the shard
    local = [t for t in local if t.numel()]
    if not local:
        return True
    # The largest magnitude of each tensor, in one multi-tensor pass: NaN or inf exactly when
    # the tensor holds one (a 2-norm could overflow on large finite values).
    peaks = torch._foreach_norm(local, ord=float("inf"))
    return bool(torch.isfinite(torch.stack([p.float() for p in peaks])).all())


# --- a checkpoint folder every rank reads ------------------------------------------------------


def local_checkpoint_folder(saves: SpotGuard, ref: Any) -> str:
    """On rank 0: the verified local folder of the checkpoint `ref` points at, for every rank
    to read. A URL must be resumed through checkpoint.location (downloaded into local_dir)."""
    from thrifty.checkpoint import CheckpointInfo
    from thrifty.checkpoint.loading import verified_folder
    from thrifty.checkpoint.storage import is_remote, redact

    if isinstance(ref, CheckpointInfo):
        assert ref.path is not None
        return ref.path
    if is_remote(ref):
        raise ConfigError(
            f"checkpoint.resume = {redact(ref)} cannot be read by several processes: set "
            "checkpoint.location to the run's checkpoint URL and checkpoint.resume = auto"
        )
    return verified_folder(ref)[0]


def read_checkpoint_folder(d: Distributed, folder: str) -> dict[str, Any]:
    """Every rank loads the plain state of a checkpoint folder rank 0 has verified."""
    from thrifty.checkpoint.loading import load_state
    from thrifty.checkpoint.manifest import read_manifest

    manifest = read_manifest(folder, where=folder) if os.path.isdir(folder) else None
    if d.any_of(manifest is None)[0]:
        raise ConfigError(
            f"checkpoint {folder} is not visible from every rank: put checkpoint.location (or "
            "checkpoint.local_dir, for a URL) on storage that every node mounts"
        )
    assert manifest is not None
    return load_state(folder, manifest, where=folder)


def check_visible(d: Distributed, local_dir: str) -> None:
    """Collective: raise on every rank unless rank 0's checkpoint folder is visible to all.

    Rank 0 writes a probe file there and every rank looks for it; without a shared folder a
    resume would find shards or states on one node only.
    """
    import torch.distributed as dist

    probe: list[str | None] = [None]
    if d.is_main:
        os.makedirs(local_dir, exist_ok=True)
        mine = os.path.join(local_dir, f".thrifty-probe-{uuid.uuid4().hex}")
        with open(mine, "w"):
            pass
        probe[0] = mine
    dist.broadcast_object_list(probe, src=0, group=d.control)
    path = probe[0]
    assert path is not None
    unseen = d.sum_ints([int(not os.path.exists(path))])[0]
    if d.is_main:
        os.remove(path)
    if unseen:
        raise ConfigError(
            f"{unseen} rank(s) cannot see the checkpoint folder {os.path.dirname(path)}: put "
            "checkpoint.location (or checkpoint.local_dir, for a URL) on storage every node "
            "mounts"
        )
