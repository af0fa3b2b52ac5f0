"""The Trainer: one training loop that applies every cost lever from one config.

The train step (`Trainer._train_step`) reads top to bottom: each lever is a small piece it
calls — the precision's autocast and loss scaler, the accumulation weights, clipping, the
schedule — not a branch inside it.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from thrifty.activation_checkpointing import apply_activation_checkpointing
from thrifty.batches import (
    LossFn,
    call_model,
    count_samples,
    count_tokens,
    loss_weights,
    to_device,
    uses_tokens,
    window_counts,
)
from thrifty.config import RunConfig, TrainConfig
from thrifty.config_changes import (
    ResumeChanges,
    budget_grew,
    check_resume_changes,
    format_applied,
    optimizer_settings,
    read_saved_config,
    reapply_optimizer_settings,
    resume_horizon,
    write_run_config,
)
from thrifty.distributed import Distributed, check_same_config, init_distributed
from thrifty.early_stopping import Budget, EarlyStopping
from thrifty.errors import ConfigError, ThriftyError
from thrifty.forecast import cannot_reach, require_validation
from thrifty.guard import (
    RunGuard,
    rewind_schedule,
    scale_learning_rate,
    step_unless_skipped,
)
from thrifty.inputs import check_dataset, check_model
from thrifty.instrument import NullTimer, make_timer, maybe_trace, measure_flops
from thrifty.loading import (
    EpochSampler,
    LoaderSettings,
    UntilStop,
    available_cpus,
    build_loader,
    choose_num_workers,
    resolve_pin_memory,
)
from thrifty.lock import RunLock
from thrifty.measure.cost import LostWork, lost_work_before_resume
from thrifty.monitor import RunMonitor
from thrifty.parallel import (
    GradSync,
    check_resumable,
    check_strategy,
    check_visible,
    fsdp_state,
    load_sharded,
    local_checkpoint_folder,
    read_checkpoint_folder,
    wrap,
)
from thrifty.precision import Precision, native_bf16, resolve_precision
from thrifty.preemption import parse_signals
from thrifty.progress import ProgressBar
from thrifty.report import console_for_api, show_result
from thrifty.rng import rng_state, set_rng_state
from thrifty.rundir import (
    MetricsLog,
    default_run_dir,
    prepare_run_dir,
    truncate_metrics,
    write_json,
)
from thrifty.schedule import build_scheduler, scaled_lr
from thrifty.spot import SpotGuard, check_compatible, remove_local_checkpoints, shapes

log = logging.getLogger("thrifty")


@dataclass
class FitResult:
    """What `Trainer.fit()` achieved. Rates are per second of training (compile warm-up excluded)."""

    steps: int
    samples: int
    tokens: int
    train_loss: float
    val_loss: float | None
    initial_val_loss: float | None
    best_val_loss: float | None
    tokens_per_second: float
    samples_per_second: float
    stop_reason: str
    wall_seconds: float
    precision: str
    num_workers: int
    checkpointed_blocks: list[str] = field(default_factory=list)
    run_dir: str | None = None
    mfu: float | None = None  # model FLOP/s ÷ the device's peak for the dtype used
    breakdown: dict[str, float] | None = None  # mean seconds per step of each phase
    cost: dict[str, Any] | None = None  # GPU-hours, dollars, the on-demand equivalent
    world_size: int = 1  # processes (each with its own device) that trained together
    strategy: str = "single"  # single | ddp | fsdp
    parameters: int = 0  # trainable parameters of the model
    step_seconds: float | None = None  # mean seconds per optimizer step (warm-up excluded)
    # The newest checkpoint: step, location, whether its upload finished, the local copy.
    checkpoint: dict[str, Any] | None = None
    # What the guard did and saved: skipped steps, rollbacks (steps and dollars lost), the
    # forecast, and the steps and dollars a stop before the budget did not spend.
    guard: dict[str, Any] | None = None


@dataclass
class TrainState:
    """Counters of the run so far: everything a checkpoint needs besides the tensors."""

    step: int = 0  # optimizer steps done
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of this epoch already consumed
    samples: int = 0
    tokens: int = 0
    seconds: float = 0.0  # training wall time, across restarts (run.max_time counts it)
    initial_val_loss: float | None = None
    val_loss: float | None = None
    eval_pending: bool = False  # an evaluation put off by a preemption, done on resume
    val_steps: list[int] = field(default_factory=list)  # where the forecast's points were taken
    val_losses: list[float] = field(default_factory=list)


def resolve_device(name: str) -> torch.device:
    """`run.device` as a torch.device; a CUDA device becomes the current one, so streams,
    events, memory figures and NVML sampling all follow it (not cuda:0)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"run.device = {name!r} is invalid: not a device name; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"run.device = {name!r} is invalid: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"run.device = {name!r} is invalid: no CUDA device is available; use cpu or auto"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"run.device = {name!r} is invalid: this process sees {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1} (CUDA_VISIBLE_DEVICES renumbers them)"
            )
        device = torch.device(
            "cuda", torch.cuda.current_device() if device.index is None else device.index
        )
        torch.cuda.set_device(device)
    return device


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The 2-norm of all gradients together, on their device (no host sync)."""
    if hasattr(torch.nn.utils, "get_total_norm"):
        return torch.nn.utils.get_total_norm(grads)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Trainer:
    """Train `model` on `train_data` with the levers `config` turns on.

    `model` returns the loss itself, an output with `.loss`, or logits for `loss_fn(output,
    batch)`. `train_data` and `val_data` are map-style Datasets (thrifty builds the loaders).
    `optimizer` is an Optimizer or a factory `model -> Optimizer`, called once the model is
    wrapped (the form FSDP needs: it replaces the parameters with their shards). It defaults to
    the one `config.optimizer` describes; with either, its lr is scaled
    by the linear scaling rule when `optimizer.reference_batch` is set, and scheduled.
    """

    def __init__(
        self,
        model: nn.Module,
        train_data: Dataset,
        config: TrainConfig | None = None,
        *,
        optimizer: torch.optim.Optimizer
        | Callable[[nn.Module], torch.optim.Optimizer]
        | None = None,
        val_data: Dataset | None = None,
        loss_fn: LossFn | None = None,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        self.config = config or TrainConfig(run=RunConfig(max_epochs=1))
        micro = self.config.batch.micro
        check_model(model)
        check_dataset(train_data, "train_data", micro, "batch.micro")
        require_validation(self.config.early_stopping.target, val_data is not None)
        if val_data is not None:
            eval_micro = self.config.eval.micro
            check_dataset(
                val_data,
                "val_data",
                eval_micro or micro,
                "eval.micro" if eval_micro else "batch.micro",
            )
        self.model = model
        self.train_data = train_data
        self.val_data = val_data
        self.loss_fn = loss_fn
        self.collate_fn = collate_fn
        self.state = TrainState()
        # Under torchrun: join the process group; this rank's device is cuda:LOCAL_RANK.
        self.dist: Distributed
        self.dist, device = init_distributed(self.config.distributed, self.config.run.device)
        try:
            check_same_config(self.dist, self.config.to_dict(secrets=False))
            self.device = resolve_device(device)
            self.precision: Precision = resolve_precision(self.config.precision.mode, self.device)
            self.accumulation = self.config.batch.accumulation_steps(self.dist.world_size)
            check_strategy(self.dist, self.precision, isinstance(optimizer, torch.optim.Optimizer))
        except BaseException:
            self.dist.close()  # the caller gets no Trainer to close it with
            raise
        self.early_stopping = EarlyStopping(
            self.config.early_stopping.patience, self.config.early_stopping.min_delta
        )
        self._optimizer_given = optimizer
        self.optimizer: torch.optim.Optimizer | None = None
        self.forward_model: nn.Module = model
        self.grad_sync: GradSync | None = None
        self.run_dir: Path | None = None
        self._run_lock: RunLock | None = None  # rank 0 holds it while fit() runs
        self.metrics: MetricsLog | None = None
        self.resume_changes = ResumeChanges()  # set on resume: what differs from the checkpoint
        self._extending = False  # resuming a finished run with a larger budget
        self.diagnosis: Any = None  # set by fit(): what limited the steps, what to change
        self._fitted = False
        self.run_guard = RunGuard(self.config.guard)
        self.checkpoint_status: dict[str, Any] | None = None  # the newest save, once fit() ends
        # Who drives this Trainer: messages name CLI flags ("cli") or Python arguments ("api").
        self.interface = "api"

    # ------------------------------------------------------------------------------------
    # Set-up: each lever applied once, before the loop

    def _setup(self) -> None:
        cfg = self.config
        # The same seed everywhere built the same initial weights; from here on each rank
        # draws its own random numbers (dropout), and rank 0 those of a single process.
        _seed_everything(cfg.run.seed + self.dist.rank)
        if cfg.run.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        if self.device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = cfg.precision.allow_tf32
            torch.backends.cudnn.allow_tf32 = cfg.precision.allow_tf32
        self.model.to(self.device)
        self.flops = self._measure_flops()  # before activation checkpointing: model FLOPs only
        self.checkpointed_blocks = self._apply_activation_checkpointing()
        # Wrapped after activation checkpointing (FSDP shards the checkpointed blocks) and
        # before the optimizer is built (FSDP replaces the parameters with their shards).
        wrapped, self.grad_sync = wrap(self.model, self.dist, self.precision)
        self.scaler = self.precision.make_scaler()
        self.optimizer = self._make_optimizer()
        self._scale_learning_rate(self.optimizer)
        self.steps_per_epoch, self.train_loader, self.worker_choice = self._build_train_loader()
        self.horizon = self._schedule_horizon()
        self.scheduler = self._build_scheduler()
        self.forward_model = self._compile(wrapped)
        self._params = [p for p in self.model.parameters() if p.requires_grad]
        if self.dist.enabled:
            log.info(self.dist.describe())
        log.info("precision: %s (%s)", self.precision.name, self.precision.reason)
        if self.checkpointed_blocks:
            log.info(
                "activation checkpointing: %d blocks (%s)",
                len(self.checkpointed_blocks),
                ", ".join(self.checkpointed_blocks),
            )
        if self.dist.enabled:
            log.info(
                "batch: micro %d × %d accumulation steps × %d processes = effective %d",
                cfg.batch.micro,
                self.accumulation,
                self.dist.world_size,
                self.effective_batch,
            )
        else:
            log.info(
                "batch: micro %d × %d accumulation steps = effective %d",
                cfg.batch.micro,
                self.accumulation,
                self.effective_batch,
            )

    @property
    def effective_batch(self) -> int:
        """Samples per optimizer step over all processes."""
        return self.config.batch.micro * self.accumulation * self.dist.world_size

    def _measure_flops(self) -> Any:
        """FLOPs and aten ops of one optimizer step, measured once on a real micro-batch."""
        if not self.config.measure.breakdown:
            return None
        from torch.utils.data import default_collate

        micro = self.config.batch.micro
        collate = self.collate_fn or default_collate
        batch = to_device(collate([self.train_data[i] for i in range(micro)]), self.device)

        def call(model: nn.Module, b: Any) -> torch.Tensor:
            with self.precision.autocast():
                return call_model(model, b, self.loss_fn)

        try:
            count = measure_flops(self.model, batch, call, device=self.device)
        except ThriftyError:
            raise
        except Exception as exc:  # a model the FLOP counter cannot trace: MFU is then unknown
            log.warning("could not count the model's FLOPs (%s): MFU will not be reported", exc)
            return None
        return count

    def _peak(self) -> Any:
        from thrifty.measure.peak import peak_flops

        tf32 = self.device.type == "cuda" and self.config.precision.allow_tf32
        try:
            with torch.random.fork_rng(devices=[]):  # the CPU benchmark must not shift the RNG
                peak = peak_flops(
                    self.device,
                    self.precision.name,
                    given_tflops=self.config.measure.peak_tflops,
                    tf32=tf32,
                )
        except ThriftyError as exc:
            log.warning("%s; MFU will not be reported", exc)
            return None
        return peak

    def _monitor(self, budget: Budget) -> RunMonitor:
        cfg = self.config
        flops = cfg.measure.flops_per_step or (
            self.flops.flops * self.accumulation if self.flops is not None else None
        )
        peak = self._peak() if flops else None
        if peak is not None:
            log.info("MFU against %.1f TFLOP/s (%s)", peak.flops_per_second / 1e12, peak.source)
        sampler = None
        if cfg.measure.system and self.dist.is_main:
            from thrifty.measure.system import SystemSampler

            # GPU sensors only when training on one: on a CPU run their absence is no news.
            sampler = SystemSampler(
                cfg.measure.sample_seconds, gpu=self.device.type == "cuda", device=self.device
            ).start()
        cost = None
        if cfg.cost.enabled and self.dist.is_main:
            from thrifty.measure.cost import CostMeter

            cost = CostMeter.from_config(cfg.cost, world_size=self.dist.world_size)
            cost.add_wasted(self._lost_work)
        horizon = cfg.run.max_epochs * self.steps_per_epoch if cfg.run.max_epochs else None

        def fraction_done() -> float | None:
            s = self.state
            parts = [
                s.step / budget.max_steps if budget.max_steps else 0.0,
                s.tokens / budget.max_tokens if budget.max_tokens else 0.0,
                s.seconds / budget.max_seconds if budget.max_seconds else 0.0,
                s.step / horizon if horizon else 0.0,
            ]
            return min(1.0, max(parts)) or None

        main = self.dist.is_main
        return RunMonitor(
            self.metrics if self.metrics is not None else MetricsLog(os.devnull),
            ProgressBar(cfg.run.max_steps, cfg.run.progress if main else "off"),
            make_timer(cfg.measure.breakdown, self.device),
            exclude_steps=3 if cfg.compile.mode != "off" else 1,
            flops_per_step=flops,
            peak=peak,
            sampler=sampler,
            cost=cost,
            budget_fraction=fraction_done,
            reduce=self.dist.mean_ if self.dist.enabled else None,
        )

    def _diagnose(self, monitor: RunMonitor) -> Any:
        """The bottleneck and what to do about it, from what this run measured."""
        cuda = self.device.type == "cuda"
        flops = self.flops
        diagnosis = monitor.diagnose(
            accumulation_steps=self.accumulation,
            micro_batch=self.config.batch.micro,
            num_workers=self.train_loader.num_workers,
            fetch_seconds_per_batch=self.worker_choice.seconds_per_batch
            if self.worker_choice
            else None,
            cpus=available_cpus(),
            device_type=self.device.type,
            device_name=torch.cuda.get_device_name(self.device) if cuda else None,
            precision=self.precision.name,
            tf32=cuda and self.config.precision.allow_tf32,
            native_bf16=native_bf16(self.device),
            compiled=self.config.compile.mode != "off",
            activation_checkpointing=str(self.config.activation_checkpointing.policy),
            aten_ops_per_step=flops.ops * self.accumulation if flops else None,
            activation_bytes=float(flops.activation_bytes) if flops else None,
            peak_memory_bytes=float(torch.cuda.max_memory_allocated(self.device)) if cuda else None,
            device_memory_bytes=(
                float(torch.cuda.get_device_properties(self.device).total_memory) if cuda else None
            ),
        )
        if diagnosis is not None and self.run_dir is not None:
            saved = {"guard": self.run_guard.summary()}  # beside the bottleneck: what was saved
            write_json(self.run_dir / "diagnosis.json", {**diagnosis.to_dict(), **saved})
        return diagnosis

    def _apply_activation_checkpointing(self) -> list[str]:
        try:
            return apply_activation_checkpointing(
                self.model, self.config.activation_checkpointing.policy
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def _make_optimizer(self) -> torch.optim.Optimizer:
        given = self._optimizer_given
        if given is None:
            return self._build_optimizer()
        if isinstance(given, torch.optim.Optimizer):
            return given
        optimizer = given(self.model)  # a factory, called on the wrapped (sharded) model
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ThriftyError(
                f"the optimizer factory returned a {type(optimizer).__name__}, not a "
                "torch.optim.Optimizer: return the optimizer built from model.parameters()"
            )
        return optimizer

    def _build_optimizer(self) -> torch.optim.Optimizer:
        o = self.config.optimizer
        params = [p for p in self.model.parameters() if p.requires_grad]
        if o.name == "sgd":
            return torch.optim.SGD(
                params, lr=o.lr, momentum=o.momentum, weight_decay=o.weight_decay
            )
        # Weight decay on matrices only: decaying biases and norm gains hurts and saves nothing.
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        groups = [
            {"params": decay, "weight_decay": o.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        # The fused kernel is one launch for all parameters; feature-detect, don't version-check.
        fused = self.device.type == "cuda"
        return torch.optim.AdamW(groups, lr=o.lr, betas=tuple(o.betas), fused=fused or None)

    def _scale_learning_rate(self, optimizer: torch.optim.Optimizer) -> None:
        effective = self.effective_batch
        for group in optimizer.param_groups:
            group["lr"] = scaled_lr(group["lr"], effective, self.config.optimizer.reference_batch)
            group["initial_lr"] = group["lr"]  # the schedule multiplies the scaled rate

    def _build_scheduler(self) -> Any:
        s = self.config.schedule
        return build_scheduler(
            self.optimizer,
            warmup_steps=s.warmup_steps,
            decay=s.decay,
            total_steps=self.horizon,
            min_lr_ratio=s.min_lr_ratio,
        )

    def _schedule_horizon(self) -> int | None:
        cfg = self.config
        horizon = cfg.schedule.total_steps or cfg.run.max_steps
        if horizon is None and cfg.run.max_epochs is not None:
            horizon = cfg.run.max_epochs * self.steps_per_epoch
        if horizon is None and cfg.schedule.decay == "cosine":
            raise ConfigError(
                "schedule.decay = 'cosine' needs a horizon: set run.max_steps, run.max_epochs or "
                "schedule.total_steps, or use schedule.decay = 'constant'"
            )
        return horizon

    def _loader_settings(self, batch_size: int, num_workers: int) -> LoaderSettings:
        d = self.config.data
        pin = resolve_pin_memory(d.pin_memory, self.device.type, num_workers)
        return LoaderSettings(batch_size, num_workers, pin, d.prefetch_factor, d.persistent_workers)

    def _build_train_loader(self) -> tuple[int, Any, Any]:
        d = self.config.data
        micro = self.config.batch.micro
        choice = None
        workers = d.num_workers
        if workers == "auto":
            choice = choose_num_workers(
                self.train_data, self._loader_settings(micro, 0), self.collate_fn
            )
            workers = choice.num_workers
            log.info("data: %s", choice.describe())
        self.sampler = EpochSampler(
            len(self.train_data),
            shuffle=d.shuffle,
            seed=self.config.run.seed,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
        )
        loader = build_loader(
            self.train_data,
            self.sampler,
            self._loader_settings(micro, int(workers)),
            self.collate_fn,
            seed=self.config.run.seed,
            stop_signals=parse_signals(self.config.spot.signals),  # workers leave them to us
        )
        steps_per_epoch = len(self.train_data) // self.effective_batch
        if steps_per_epoch == 0:
            raise ConfigError(
                f"batch.effective = {self.effective_batch} is invalid: the training set has "
                f"only {len(self.train_data)} samples; use a smaller batch"
            )
        return steps_per_epoch, loader, choice

    def _compile(self, model: nn.Module) -> nn.Module:
        mode = self.config.compile.mode
        if mode == "off":
            return model
        return torch.compile(model, mode=None if mode == "default" else mode)  # type: ignore[return-value]

    # ------------------------------------------------------------------------------------
    # The loop

    def _windows(self) -> Iterator[list[Any]]:
        """Accumulation windows of micro-batches, epoch after epoch, from the saved position."""
        max_epochs = self.config.run.max_epochs
        while max_epochs is None or self.state.epoch < max_epochs:
            start = self.state.batch_in_epoch * self.config.batch.micro
            self.sampler.set_epoch(self.state.epoch, start)
            batches = iter(self.train_loader)
            windows_left = self.steps_per_epoch - self.state.batch_in_epoch // self.accumulation
            for _ in range(windows_left):
                yield [next(batches) for _ in range(self.accumulation)]
            self.state.epoch += 1
            self.state.batch_in_epoch = 0

    def _train_step(
        self,
        window: list[Any],
        counts: tuple[list[int], list[int]],
        timer: NullTimer,
        totals: tuple[int, int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """One optimizer step over an accumulation window; returns (loss, grad norm, skipped) as
        tensors on the device — reading them would force a host sync, so the caller batches
        that. `skipped` (None with the guard off) is True where a non-finite loss or gradient
        left the step out.
        `counts` are the window's samples and tokens per micro-batch, counted on the host;
        `totals` the samples and tokens of the window over all ranks (None: one process)."""
        weights = loss_weights(
            window, self.config.batch.normalize, counts, totals, self.dist.world_size
        )
        non_blocking = self.device.type == "cuda"
        window_loss = torch.zeros((), device=self.device)
        grad_sync = self.grad_sync
        last = len(window) - 1
        for i, (batch, weight) in enumerate(zip(window, weights, strict=True)):
            batch = to_device(batch, self.device, non_blocking)
            timer.mark("host_to_device")
            with grad_sync(i == last):  # gradients cross ranks once per window, not per batch
                with self.precision.autocast():
                    loss = call_model(self.forward_model, batch, self.loss_fn)
                timer.mark("forward")
                self.scaler.scale(loss * weight).backward()
            window_loss += loss.detach().float() * weight
            timer.mark("backward")
        # The true gradients' norm, recorded at every step (clipping or not): it is the first
        # sign of a run going wrong. Unscaled first, so neither clipping nor the record sees
        # the loss scale.
        self.scaler.unscale_(self.optimizer)
        clip = self.config.optimizer.grad_clip
        if clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(self._params, clip)
        else:
            grad_norm = total_norm([p.grad for p in self._params if p.grad is not None])
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a replicated DTensor
            grad_norm = grad_norm.full_tensor()
        skipped = None
        if self.config.guard.enabled and self.scaler.is_enabled():
            # fp16: the scaler skips steps with non-finite gradients itself (an overflow is its
            # business, not divergence); the guard counts a non-finite loss, read at the flush
            # (averaged over the ranks there, so that every rank agrees).
            step_unless_skipped(self.optimizer, self.scaler, grad_norm)
            if not self.dist.enabled:
                skipped = ~torch.isfinite(window_loss)
        elif self.config.guard.enabled:
            # The same verdict on every rank: the norm of the synchronized gradients is.
            ok = torch.isfinite(grad_norm)
            if not self.dist.enabled:
                ok &= torch.isfinite(window_loss)
            step_unless_skipped(self.optimizer, self.scaler, ok, warn=_warn_once)
            skipped = ~ok
        else:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.scheduler.step()  # set back at the next flush for a skipped step
        self.optimizer.zero_grad(set_to_none=True)
        timer.mark("optimizer")
        return window_loss, grad_norm, skipped  # this rank's; averaged over ranks when logged

    def fit(self) -> FitResult:
        """Train until a budget, the data (run.max_epochs), early stopping or a preemption
        ends the run. Resumes from the newest valid checkpoint when `checkpoint.resume = auto`.

        Used from Python with no logging configured, it shows the same lines and summary as
        `thrifty train`; configure logging (or pass `rich`-free handlers) to take them over."""
        if self._fitted:
            raise ThriftyError(
                "fit() already ran on this Trainer: build a new Trainer to train again (with a "
                "larger run.max_steps it continues from the run's checkpoint)"
            )
        self._fitted = True
        with console_for_api() as speak:
            try:
                result = self._fit()
            finally:
                self._release_run_lock()
            if speak and self.dist.is_main:
                show_result(result, self.diagnosis)
        return result

    def _fit(self) -> FitResult:
        cfg = self.config
        wall_start = time.perf_counter()
        self._setup()
        guard = self._open_run_dir()
        budget = Budget(cfg.run.max_steps, cfg.run.max_tokens, cfg.run.max_seconds)
        monitor = self._monitor(budget)
        if self.state.step == 0:
            self.state.initial_val_loss = self.state.val_loss = self.evaluate()
        stop_reason = "data_exhausted"
        # A run preempted at its last step resumes with its budget spent: no step more. An
        # evaluation the preemption put off comes first, as it would have.
        finished = budget.exceeded(self.state.step, self.state.tokens, self.state.seconds)
        if self.state.eval_pending:
            stop = self._evaluate_and_record()  # always evaluated: `or` would skip it
            finished = finished or stop
        stop_reason = finished or stop_reason
        seconds_before = self.state.seconds
        started = time.perf_counter()
        timer = monitor.timer
        guard.start(self.state.step)
        try:
            with maybe_trace(cfg.measure.trace, cfg.measure.trace_steps) as trace_step:
                step_start = time.perf_counter()
                monitor.start()  # the first sync point: intervals are measured sync to sync
                timer.start()
                # A loader that fails while a stop is pending (a worker lost to the group's
                # SIGTERM) ends the loop, not the run: every finished step is saved below.
                windows = UntilStop(
                    self._windows() if finished is None else iter(()),
                    lambda: guard.preempted and not self.dist.enabled,
                )
                for window in windows:
                    timer.mark("data_wait")
                    lr = self.optimizer.param_groups[0]["lr"]
                    counts = window_counts(window)
                    samples, tokens = sum(counts[0]), sum(counts[1])
                    totals = None
                    if self.dist.enabled and uses_tokens(window, cfg.batch.normalize):
                        # Token weights need the window's tokens over all ranks before backward.
                        totals = tuple(self.dist.sum_ints([samples, tokens]))
                    loss, grad_norm, skipped = self._train_step(window, counts, timer, totals)
                    seconds = seconds_before + time.perf_counter() - started
                    preempted, due = guard.preempted, guard.due(self.state.step + 1)
                    time_up = False
                    if self.dist.enabled:  # one agreement per step: counts, and any rank's say
                        agreed = self.dist.sum_ints(
                            [samples, tokens, preempted, budget.out_of_time(seconds), due]
                        )
                        samples, tokens = totals or agreed[:2]
                        preempted, time_up, due = (n > 0 for n in agreed[2:])
                    self._advance(samples, tokens, seconds)
                    reason = budget.exceeded(self.state.step, self.state.tokens, self.state.seconds)
                    if time_up and reason is None:  # another rank's clock ran out first
                        reason = "max_time"
                    # A preemption notice leaves 30 s (GCP, Azure) to 2 min (AWS): the emergency
                    # checkpoint comes first, before any evaluation due at this step.
                    eval_due = self.val_data is not None and (
                        self.state.step % cfg.eval.every == 0 or reason is not None
                    )
                    if preempted:
                        reason = "preempted"
                        self.state.eval_pending = eval_due  # done first thing on resume
                    elif eval_due:
                        monitor.pause()  # evaluation is not training: left out of the interval
                        eval_start = time.perf_counter()
                        stop = self._evaluate_and_record()  # always evaluated
                        reason = reason or stop
                        monitor.resume()
                        step_start += (
                            time.perf_counter() - eval_start
                        )  # evaluation is not step time
                    if preempted or (due and reason is None):
                        # The guard sees every step before a save: none is written while a
                        # loss spike builds, or from a run that diverged.
                        reason = self._flush(monitor, guard, self._current(loss, skipped)) or reason
                        if preempted or not (self.run_guard.suspect or reason == "diverged"):
                            save_start = time.perf_counter()
                            self._checkpoint(guard, emergency=preempted)
                            timer.add("checkpoint", time.perf_counter() - save_start)
                    now = time.perf_counter()
                    monitor.add(
                        {
                            "step": self.state.step,
                            "loss": loss,
                            "grad_norm": grad_norm,
                            "skipped": skipped,
                            "lr": lr,
                            "samples": self.state.samples,
                            "tokens": self.state.tokens,
                            "step_seconds": now - step_start,
                            "samples_in_step": samples,
                            "tokens_in_step": tokens,
                        },
                        timer.finish(),
                    )
                    if len(monitor.pending) >= cfg.run.log_every or reason is not None:
                        reason = self._flush(monitor, guard) or reason
                    trace_step()
                    if reason is not None:
                        stop_reason = reason
                        break
                    step_start = time.perf_counter()
                    timer.start()
            stop_reason = self._flush(monitor, guard) or stop_reason
            if windows.error is not None:
                self._checkpoint(guard, emergency=True)
                stop_reason = "preempted"
            if stop_reason not in ("preempted", "diverged"):  # a diverged run keeps its last
                self._checkpoint(guard, final=True)  # good checkpoint as the newest
            guard.finish()
            self.checkpoint_status = guard.upload_status() if self.dist.is_main else None
            self.dist.barrier()  # no rank leaves while rank 0 still writes the checkpoint
        except BaseException:
            guard.abandon()
            raise
        finally:
            monitor.close()
            # The workers ignore SIGTERM (the main process handles it), so they are stopped
            # here rather than left to the interpreter's exit.
            close = getattr(self.train_loader, "close", None)
            if close is not None:
                close()
        result = FitResult(
            steps=self.state.step,
            samples=self.state.samples,
            tokens=self.state.tokens,
            train_loss=monitor.train_loss,
            val_loss=self.state.val_loss,
            initial_val_loss=self.state.initial_val_loss,
            best_val_loss=None if not self.early_stopping.history else self.early_stopping.best,
            tokens_per_second=monitor.meter.tokens_per_second,
            samples_per_second=monitor.meter.samples_per_second,
            stop_reason=stop_reason,
            wall_seconds=time.perf_counter() - wall_start,
            precision=self.precision.name,
            num_workers=self.train_loader.num_workers,
            checkpointed_blocks=self.checkpointed_blocks,
            run_dir=str(self.run_dir) if self.run_dir else None,
            mfu=monitor.mfu,
            breakdown=monitor.mean_phases(),
            cost=monitor.cost.summary().to_dict() if monitor.cost is not None else None,
            world_size=self.dist.world_size,
            strategy=self.dist.strategy,
            parameters=sum(p.numel() for p in self._params),
            step_seconds=monitor.meter.step_seconds,
            checkpoint=self.checkpoint_status,
            guard={**self.run_guard.summary(), "saved": self._saved(stop_reason, monitor)},
        )
        if self.dist.is_main:
            self.diagnosis = self._diagnose(monitor)
            if stop_reason != "preempted":  # summary.json marks a finished run
                self._write_summary(result)
        return result

    def _evaluate_and_record(self) -> str | None:
        """Evaluate, log it, feed early stopping and the forecast; returns "early_stopping" or
        "forecast" when the run should end here."""
        self.state.eval_pending = False
        self.state.val_loss = self.evaluate()
        self._log_event(val_loss=self.state.val_loss)
        if self.state.val_loss is not None and self.state.step > 0:
            self.state.val_steps.append(self.state.step)
            self.state.val_losses.append(self.state.val_loss)
        if self.early_stopping.update(self.state.val_loss):
            return "early_stopping"
        return self._forecast()

    def _forecast(self) -> str | None:
        """With early_stopping.target: "forecast" once the validation curve, fitted and
        extended to the end of the budget with its band, cannot reach the target."""
        g, target = self.config.guard, self.config.early_stopping.target
        end = self._end_step()
        if not g.enabled or target is None or end is None or self.state.step >= end:
            return None
        # The curve's early part (warm-up, the first quarter of the steps so far) is a transient
        # no saturating power law describes: the fit starts after it.
        start = max(self.config.schedule.warmup_steps, self.state.step // 4)
        points = [
            (t, v)
            for t, v in zip(self.state.val_steps, self.state.val_losses, strict=True)
            if t > start
        ]
        decision = cannot_reach(
            [t for t, _ in points],
            [v for _, v in points],
            target,
            end,
            min_evals=g.forecast_min_evals,
            confidence=g.forecast_confidence,
            margin=g.forecast_margin,
        )
        if decision.forecast is not None:
            self.run_guard.forecast = {
                **decision.forecast.to_dict(),
                "target": target,
                "stopped": bool(decision),
                "reason": decision.reason,
            }
        if not decision:
            return None
        log.warning("forecast: %s: stopping", decision.reason)
        return "forecast"

    def _end_step(self) -> int | None:
        """The step the budget ends at: max_steps, else the epochs' steps, else a projection
        from the share of a token or time budget used so far."""
        r = self.config.run
        if r.max_steps is not None:
            return r.max_steps
        if r.max_epochs is not None:
            return r.max_epochs * self.steps_per_epoch
        fractions = [
            self.state.tokens / r.max_tokens if r.max_tokens else 0.0,
            self.state.seconds / r.max_seconds if r.max_seconds else 0.0,
        ]
        done = max(fractions)
        return int(self.state.step / done) if done > 0 else None

    # ------------------------------------------------------------------------------------
    # The guard: skipped steps, loss spikes rolled back

    def _current(self, loss: torch.Tensor, skipped: torch.Tensor | None) -> dict[str, Any]:
        """This step's record for the guard before a save, so the checkpoint holds a guard that
        has seen every step up to it (one read of the loss: at a save only). The loss is the
        mean over the ranks, as at a flush, so that every rank decides alike."""
        mean = loss.detach().float().clone()
        if self.dist.enabled:
            self.dist.mean_(mean)
        flag = bool(skipped) if skipped is not None else None
        return {"step": self.state.step, "loss": float(mean), "skipped": flag}

    def _flush(
        self, monitor: RunMonitor, guard: SpotGuard, current: dict[str, Any] | None = None
    ) -> str | None:
        """Write the buffered steps and let the run guard judge them (and `current`, this
        step's record when a save follows): the schedule is set back for skipped steps, a
        confirmed loss spike rolled back. Returns "diverged" or None."""
        records = monitor.flush(self.state.seconds, self.state.samples, self.state.tokens)
        verdict = self.run_guard.observe(records + ([current] if current else []))
        rewind_schedule(self.scheduler, verdict.skipped)
        if verdict.diverged is not None:
            return self._diverged(verdict.diverged)
        if verdict.spike_start is not None:
            return self._roll_back(guard, monitor, verdict.spike_start)
        return None

    def _saved(self, stop_reason: str, monitor: RunMonitor) -> dict[str, Any] | None:
        """Steps and dollars a stop before the budget did not spend (early stopping, the
        forecast, divergence): the steps left times the measured step time and price."""
        end = self._end_step()
        if stop_reason not in ("early_stopping", "forecast", "diverged") or end is None:
            return None
        steps = max(0, end - self.state.step)
        seconds = steps * (monitor.meter.step_seconds or 0.0)
        usd = None if monitor.cost is None else seconds * monitor.cost.usd_per_hour / 3600
        return {"by": stop_reason, "steps_not_run": steps, "seconds": seconds, "usd": usd}

    def _diverged(self, why: str) -> str:
        self.run_guard.stopped = why
        log.error("diverged: %s; the newest checkpoint is the last good state", why)
        self._log_event(event="diverged", why=why)
        return "diverged"

    def _roll_back(self, guard: SpotGuard, monitor: RunMonitor, spike_start: int) -> str | None:
        """Restore the weights, optimizer and loss scale of the newest checkpoint from before
        `spike_start`, keep the data position (the windows seen since are skipped) and the
        schedule's, and go on. Past guard.max_rollbacks the run stops as diverged."""
        g = self.config.guard
        done = len(self.run_guard.rollbacks)
        if done >= g.max_rollbacks:
            return self._diverged(
                f"a loss spike from step {spike_start} after {done} rollback(s) "
                f"(guard.max_rollbacks = {g.max_rollbacks})"
            )

        def pick() -> tuple[int, str] | None:
            guard.manager.wait()  # the save in flight
            try:
                info = guard.manager.latest(before=spike_start)
            except ThriftyError as exc:
                log.warning("no checkpoint to roll back to: %s", exc)
                return None
            return None if info is None else (info.step, local_checkpoint_folder(guard, info))

        picked = self.dist.on_main(pick)
        if picked is None:
            return self._diverged(
                f"a loss spike from step {spike_start} and no checkpoint before it to roll back to"
            )
        to_step, folder = picked
        self._restore_weights(read_checkpoint_folder(self.dist, folder), folder)
        scale_learning_rate(self.scheduler, g.rollback_lr_factor)
        lost = self.state.step - to_step
        seconds = lost * (monitor.meter.step_seconds or 0.0)
        event = {
            "from_step": self.state.step,
            "to_step": to_step,
            "spike_start": spike_start,
            "steps_lost": lost,
            "seconds_lost": seconds,
            "usd_lost": None
            if monitor.cost is None
            else seconds * monitor.cost.usd_per_hour / 3600,
            "lr_factor": g.rollback_lr_factor,
        }
        self.run_guard.rollbacks.append(event)
        self._log_event(event="rollback", **event)
        log.warning(
            "loss spike from step %d: rolled back to the weights of step %d (%d steps lost), "
            "skipping the data seen since",
            spike_start,
            to_step,
            lost,
        )
        return None

    def _restore_weights(self, state: dict[str, Any], folder: str) -> None:
        """Model, optimizer moments and loss scale from a checkpoint; the counters, data
        position, schedule and random streams stay where the run is."""
        lrs = self.scheduler.get_last_lr()
        if self.dist.strategy == "fsdp":
            load_sharded(self.model, self.optimizer, state, folder, self.effective_batch, self.dist)
        else:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        if state["scaler"]:
            self.scaler.load_state_dict(state["scaler"])

    def _advance(self, samples: int, tokens: int, seconds: float) -> None:
        self.state.seconds = seconds
        self.state.step += 1
        self.state.batch_in_epoch += self.accumulation
        self.state.samples += samples
        self.state.tokens += tokens

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean validation loss (weighted by samples, or tokens with a loss_mask), or None."""
        if self.val_data is None:
            return None
        if self.optimizer is None:  # called before fit()
            self.model.to(self.device)
        e = self.config.eval
        loader = build_loader(
            self.val_data,
            EpochSampler(
                len(self.val_data),
                shuffle=False,
                rank=self.dist.rank,
                world_size=self.dist.world_size,
            ),
            self._loader_settings(e.micro or self.config.batch.micro, 0),
            self.collate_fn,
        )
        was_training = self.model.training
        self.model.eval()
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        weight_sum = 0
        for i, batch in enumerate(loader):
            if e.batches and i >= e.batches:
                break
            weight = (
                count_tokens(batch)
                if isinstance(batch, dict) and "loss_mask" in batch
                else count_samples(batch)
            )
            batch = to_device(batch, self.device, self.device.type == "cuda")
            with self.precision.autocast():
                loss = call_model(self.forward_model, batch, self.loss_fn)
            total += loss.double() * weight
            weight_sum += weight
        self.model.train(was_training)
        if self.dist.enabled:  # every rank evaluated its share: the mean over all of them
            both = torch.stack(
                [total, torch.tensor(float(weight_sum), device=self.device).double()]
            )
            total, weight_sum = self.dist.sum_(both).unbind()
            weight_sum = int(weight_sum.item())
        if weight_sum == 0:
            raise ThriftyError(
                f"the validation set yields no full batch of {e.micro or self.config.batch.micro}: "
                "set eval.micro smaller or give more validation data"
            )
        return float(total) / weight_sum

    # ------------------------------------------------------------------------------------
    # Output: metrics, summary, run directory

    def _open_run_dir(self) -> SpotGuard:
        """Create the run directory and its checkpoint guard; resume if there is a checkpoint.

        A directory with summary.json holds a finished run and is refused (unless
        run.overwrite); one with checkpoints is resumed (checkpoint.resume = auto), never
        silently started over. With several processes rank 0 decides and writes; every rank
        then loads the same checkpoint folder, which must be visible to all of them.
        """
        d = self.dist
        if not d.enabled:
            guard, ref, why = self._prepare_run_dir()
            if ref is not None:
                self.load_state_dict(guard.load(ref))
            return self._opened(guard, resumed=ref is not None, why=why)
        main_guard: list[SpotGuard] = []

        def on_rank0() -> tuple[str, str, str | None, str]:
            guard, ref, why = self._prepare_run_dir()
            main_guard.append(guard)
            folder = local_checkpoint_folder(guard, ref) if ref is not None else None
            return str(self.run_dir), guard.manager.local_dir, folder, why

        run_dir, checkpoint_dir, folder, why = d.on_main(on_rank0)
        check_visible(d, checkpoint_dir)
        if not d.is_main:
            self.run_dir = Path(run_dir)
        guard = (
            main_guard[0]
            if d.is_main
            else SpotGuard(self.config.checkpoint, self.config.spot, Path(run_dir), writes=False)
        )
        if folder is not None:
            self.load_state_dict(read_checkpoint_folder(d, folder), shards=folder)
        return self._opened(guard, resumed=folder is not None, why=why)

    def _prepare_run_dir(self) -> tuple[SpotGuard, Any, str]:
        r, c = self.config.run, self.config.checkpoint
        run_dir = Path(r.out) if r.out else default_run_dir(r.name)
        # Before anything is read or written there: one writer per run directory and location.
        fix = "use another --out" if self.interface == "cli" else "give another RunConfig(out=...)"
        self._run_lock = RunLock(run_dir, c.location, c.storage_options, run_dir_fix=fix).acquire()
        finished = (run_dir / "summary.json").exists()
        self._extending = finished and not r.overwrite
        if self._extending:
            saved = run_dir / "config.toml"
            current = self.config.to_dict(secrets=False)
            grew = budget_grew(read_saved_config(saved), current) if saved.exists() else []
            if not grew:
                raise ThriftyError(
                    f"run directory {run_dir} holds a finished run (summary.json): "
                    + self._choices("another", "start it over")
                    + ", or give a larger budget to train it further"
                )
            log.info("extending the finished run: %s", ", ".join(g.describe() for g in grew))
        guard = SpotGuard(c, self.config.spot, run_dir)
        guard.probe()  # a read-only dir, a file, a missing bucket: fail before step 1
        ref, why = (None, "overwrite") if r.overwrite else guard.resume_point()
        if ref is None and not r.overwrite and guard.has_checkpoints():
            raise ThriftyError(
                f"{guard.manager.location} holds checkpoints and checkpoint.resume = never: "
                + self._choices("another", "start over")
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
        self.run_dir = prepare_run_dir(run_dir, r.overwrite or restart, resuming=ref is not None)
        return guard, ref, why

    def _release_run_lock(self) -> None:
        if self._run_lock is not None:
            self._run_lock.release()
            self._run_lock = None

    def _choices(self, other: str, fresh: str) -> str:
        """The way out of a run directory already in use, in the words of who drives us."""
        if self.interface == "cli":
            return f"choose {other} --out, or {fresh} with --overwrite (run.overwrite = true)"
        return (
            f"give {other} run directory (RunConfig(out=...)), or {fresh} with "
            "RunConfig(overwrite=True)"
        )

    def _opened(self, guard: SpotGuard, *, resumed: bool, why: str) -> SpotGuard:
        """Rank 0 records the run's config and opens its metrics log."""
        self._lost_work = LostWork()
        if resumed:
            log.info("resumed from step %d (%s)", self.state.step, why)
        if not self.dist.is_main:
            return guard
        assert self.run_dir is not None
        changes = self.resume_changes if resumed else ResumeChanges()
        if resumed:
            # Steps past the checkpoint were paid for and are done again: bill them.
            metrics = self.run_dir / "metrics.jsonl"
            self._lost_work = lost_work_before_resume(metrics, self.state.step, self.state.seconds)
            truncate_metrics(metrics, self.state.step)
            if self._extending:  # unfinished again: an interruption now resumes as usual
                (self.run_dir / "summary.json").unlink(missing_ok=True)
        write_run_config(
            self.run_dir / "config.toml",
            self.config.to_dict(secrets=False),
            step=self.state.step,
            changes=changes.changes,
            resumed=resumed,
        )
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        if resumed:
            self._log_event(event="resumed", **self._lost_work.to_record())
        kept = self.horizon if self.config.schedule.total_steps is None else None
        applied = format_applied(changes, kept_horizon=kept)
        if applied is not None:
            log.info(applied)
            self._log_event(**changes.event())
        log.info(guard.describe())
        return guard

    # ------------------------------------------------------------------------------------
    # Checkpoint state: everything needed to continue bit for bit

    def state_dict(self) -> dict[str, Any]:
        """Model, optimizer, schedule, loss scaler, counters, data position, early stopping,
        every RNG, and the config — tensors and plain values only (loadable weights_only).

        Under FSDP the model and optimizer are sharded over the ranks and are left out: each
        rank writes its shard when the Trainer checkpoints (see `thrifty.checkpoint.sharded`).
        """
        if self.optimizer is None:
            raise ThriftyError("the Trainer has no training state before fit() sets it up")
        state: dict[str, Any] = {}
        if self.dist.strategy != "fsdp":
            state["model"] = self.model.state_dict()
            state["optimizer"] = self.optimizer.state_dict()
        state.update(
            scheduler=self.scheduler.state_dict(),
            scaler=self.scaler.state_dict(),
            early_stopping=self.early_stopping.state_dict(),
            guard=self.run_guard.state_dict(),
            progress=asdict(self.state),
            rng=rng_state(),
            effective_batch=self.effective_batch,
            accumulation=self.accumulation,
            world_size=self.dist.world_size,
            strategy=self.dist.strategy,
            config=self.config.to_dict(secrets=False),
        )
        return state

    def load_state_dict(self, state: dict[str, Any], *, shards: str | None = None) -> None:
        """Restore a `state_dict()`; refuses one written for another model, batch or layout.

        `shards` is the checkpoint folder whose shards hold the model and optimizer (FSDP).
        """
        d = self.dist
        needed = ["scheduler", "scaler", "early_stopping", "progress", "rng", "effective_batch"]
        if d.strategy != "fsdp":
            needed = ["model", "optimizer", *needed]
        missing = [key for key in needed if key not in state]
        if missing:
            raise ThriftyError(
                f"the checkpoint holds no {', '.join(missing)} (it has: "
                f"{', '.join(sorted(map(str, state))) or 'nothing'}): it is not a thrifty "
                "training checkpoint; resume from a folder a Trainer wrote, or load the weights "
                "yourself with model.load_state_dict"
            )
        check_resumable(d, state)
        # Refused even with run.allow_config_change: the data position cannot follow another
        # effective batch. Checked first, so its message is the one the user sees.
        check_compatible({}, {}, state["effective_batch"], self.effective_batch)
        # The checkpoint's config against this run's: safe changes pass, optimization changes
        # need run.allow_config_change. A larger budget keeps the schedule's horizon; the new
        # scheduler is built before the optimizer's state is loaded, as building one resets lr.
        current = self.config.to_dict(secrets=False)
        changes = check_resume_changes(
            state.get("config"), current, self.config.run.allow_config_change
        )
        self.resume_changes = changes
        horizon = resume_horizon(state.get("config"), current, self.steps_per_epoch)
        if horizon != self.horizon:
            self.horizon = horizon
            self.scheduler = self._build_scheduler()
        settings = optimizer_settings(self.optimizer)
        if d.strategy == "fsdp":
            if shards is None:
                raise ThriftyError("an FSDP state needs its checkpoint folder to read shards from")
            load_sharded(self.model, self.optimizer, state, shards, self.effective_batch, d)
        else:
            check_compatible(
                shapes(state["model"]),
                shapes(self.model.state_dict()),
                state["effective_batch"],
                self.effective_batch,
            )
            self.model.load_state_dict(state["model"])
            if changes.keeps_optimizer_state:  # another optimizer starts with fresh moments
                self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if changes.optimization:  # the checkpoint's lr, betas, ... would override this run's
            reapply_optimizer_settings(self.optimizer, self.scheduler, settings)
        if state["scaler"]:  # a bf16/fp32 checkpoint has no loss scale for an fp16 resume
            self.scaler.load_state_dict(state["scaler"])
        self.early_stopping.load_state_dict(state["early_stopping"])
        if "guard" in state:  # checkpoints before the guard have none
            self.run_guard.load_state_dict(state["guard"])
        self.state = TrainState(**state["progress"])
        saved_accumulation = state.get("accumulation", self.accumulation)
        if saved_accumulation != self.accumulation:  # FSDP resharded: same windows, new split
            windows = self.state.batch_in_epoch // saved_accumulation
            self.state.batch_in_epoch = windows * self.accumulation
        rngs = state.get("rank_rng") or [state["rng"]]
        if d.rank < len(rngs):
            set_rng_state(rngs[d.rank])
        else:  # a rank the saved job did not have (FSDP at a larger world size)
            _seed_everything(self.config.run.seed + d.rank + 1_000_003 * self.state.step)

    def _checkpoint(
        self, guard: SpotGuard, *, emergency: bool = False, final: bool = False
    ) -> None:
        """Checkpoint this step. Rank 0 writes the state with every rank's RNG; under FSDP
        every rank first writes its shard into the step's folder, and rank 0's manifest,
        written last, publishes the checkpoint once all shards are on disk."""
        d = self.dist
        step, metric = self.state.step, self.state.val_loss
        if self.config.guard.enabled and d.any_of(not self._state_is_finite())[0]:
            # No NaN on disk: the newest checkpoint stays the last good state.
            log.error(
                "not checkpointing step %d: the weights or optimizer state are not finite; the "
                "newest checkpoint is the last good one",
                step,
            )
            return
        extra: tuple[str, ...] = ()
        stall = 0.0
        sharded_plain = None
        if d.strategy == "fsdp":
            from thrifty.checkpoint.sharded import split_tensors, write_shards

            start = time.perf_counter()
            folder = d.on_main(lambda: guard.manager.begin(step))
            tensors, sharded_plain = split_tensors(fsdp_state(self.model, self.optimizer))
            extra = tuple(write_shards(tensors, folder, d.control))
            stall = time.perf_counter() - start
        rngs = d.gather(rng_state()) if d.enabled else None
        if not d.is_main:
            guard.saved(step)
            return
        state = self.state_dict()
        if rngs is not None:
            state["rank_rng"] = rngs
        if sharded_plain is not None:
            state["sharded"] = sharded_plain
        if emergency:
            reason = None if guard.preempted else "a preemption notice on another rank"
            guard.emergency_save(step, state, metric, extra, reason=reason)
        elif final:
            guard.save_final(step, state, metric, extra)
        else:
            guard.save(step, state, metric, extra, stall)

    def _state_is_finite(self) -> bool:
        """Whether this rank's weights and optimizer state are all finite: one host sync, at a
        save only."""
        tensors = [p.detach() for p in self.model.parameters()]
        tensors += [
            v
            for per_param in self.optimizer.state.values()
            for v in per_param.values()
            if isinstance(v, torch.Tensor) and v.is_floating_point()
        ]
        local = [getattr(t, "to_local", lambda t=t: t)() for t in tensors]  # FSDP: the shard
        local = [t for t in local if t.numel()]
        if not local:
            return True
        # The largest magnitude of each tensor, in one multi-tensor pass: NaN or inf exactly
        # when the tensor holds one (a 2-norm could overflow on large finite values).
        peaks = torch._foreach_norm(local, ord=float("inf"))
        return bool(torch.isfinite(torch.stack([p.float() for p in peaks])).all())

    def _log_event(self, **fields: Any) -> None:
        if self.metrics is not None:  # rank 0's
            self.metrics.write([{"step": self.state.step, **fields}])

    def _write_summary(self, result: FitResult) -> None:
        if self.run_dir is None:
            return
        summary = asdict(result)
        summary["final_val_loss"] = summary.pop("val_loss")
        summary["precision_reason"] = self.precision.reason
        summary["accumulation_steps"] = self.accumulation
        summary["effective_batch"] = self.effective_batch
        if self.worker_choice is not None:
            summary["num_workers_measured_seconds_per_batch"] = {
                str(k): v for k, v in self.worker_choice.seconds_per_batch.items()
            }
        write_json(self.run_dir / "summary.json", summary)
