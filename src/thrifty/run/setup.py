"""A run's set-up from its config: the device, precision and strategy, the FLOP count, the batch
geometry (the micro-batch measured with batch.micro = "auto"), activation checkpointing, the
wrapped model and its optimizer; each lever applied once, in the order they depend on one
another (`set_up_levers`); then the data, the schedule, the checkpointer and the train step
built on them (`assemble_run`). The Trainer (`thrifty.run.trainer`) keeps what both return."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import default_collate

from thrifty.checkpointing.saving.checkpointer import Layout, RunCheckpointer, RunParts
from thrifty.checkpointing.saving.rng import seed_everything
from thrifty.config import TrainConfig
from thrifty.data.batching import TrainBatches
from thrifty.data.geometry import BatchGeometry
from thrifty.data.sources import is_stream
from thrifty.errors import ConfigError
from thrifty.levers.accumulation import LossFn, call_model
from thrifty.levers.activation_checkpointing import apply_activation_checkpointing
from thrifty.levers.compile import compile_model
from thrifty.levers.early_stopping import EarlyStopping
from thrifty.levers.fp8 import apply_fp8
from thrifty.levers.micro_batch import Halving, MicroSearch, measure_micro, scaled_count
from thrifty.levers.optimizer import OptimizerArg, make_optimizer
from thrifty.levers.precision import Precision, resolve_precision
from thrifty.levers.user_scheduler import SchedulerArg, run_scheduler
from thrifty.measure import instruments
from thrifty.measure.guard import RunGuard
from thrifty.records.budget import Budget
from thrifty.records.state import TrainState
from thrifty.records.stop_signals import parse_signals
from thrifty.run.step import TrainStep
from thrifty.strategies.base import Strategy
from thrifty.strategies.choice import make_strategy
from thrifty.strategies.device import resolve_device
from thrifty.strategies.process_group import Distributed


@dataclass(kw_only=True, slots=True)
class Levers:
    """The model's levers as set up: what the rest of the run is built on."""

    device: torch.device
    precision: Precision
    strategy: Strategy
    geometry: BatchGeometry  # resolved once: measured with batch.micro = "auto"
    micro_search: MicroSearch | None  # how batch.micro = "auto" chose (None: given)
    flops: Any  # one micro-batch's FLOP count at geometry.micro (None: not counted)
    held: dict[str, int]  # activation bytes per repeated block, over the ranks
    checkpointed_blocks: list[str]
    wrapped: nn.Module  # the model as the strategy wraps it (before compile)
    optimizer: torch.optim.Optimizer
    set_up: instruments.SetUp  # the levers as the diagnosis names them


def set_up_levers(
    model: nn.Module,
    train_data: Any,
    config: TrainConfig,
    dist: Distributed,
    device: str,
    *,
    optimizer: OptimizerArg,
    loss_fn: LossFn | None,
    collate_fn: Callable[[list[Any]], Any] | None,
) -> Levers:
    """Each lever applied to `model` once, in the order they depend on one another (see the
    module's docstring); `device` is the one the process group gave this rank."""
    cfg = config
    where = resolve_device(device)
    precision = resolve_precision(cfg.precision.mode, where)
    # The micro-batch until measured (with "auto": one sample, for the FLOP count).
    geometry = BatchGeometry.of(cfg.batch, dist.world_size)
    strategy = make_strategy(dist)
    given = isinstance(optimizer, torch.optim.Optimizer)
    strategy.check(precision, optimizer_given=given, auto_micro=geometry.auto)
    # The same seed everywhere built the same initial weights; from here on each rank
    # draws its own random numbers (dropout), and rank 0 those of a single process.
    seed_everything(cfg.run.seed + dist.rank)
    if cfg.run.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
    if where.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = cfg.precision.allow_tf32
        torch.backends.cudnn.allow_tf32 = cfg.precision.allow_tf32
    model.to(where)
    # Counted before activation checkpointing: model FLOPs only, not the recomputation.
    flops = instruments.count_step_flops(
        model,
        train_data,
        geometry,
        where,
        precision,
        loss_fn,
        collate_fn,
        breakdown=cfg.measure.breakdown,
    )
    if precision.name == "fp8":  # after the FLOP count, before anything wraps it
        apply_fp8(model)
    policy = cfg.activation_checkpointing.policy
    held = instruments.held_on_every_rank(dist, flops, policy)
    try:
        blocks = apply_activation_checkpointing(model, policy, held)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    # Wrapped after activation checkpointing (FSDP shards the checkpointed blocks) and
    # before the optimizer is built (FSDP replaces the parameters with their shards).
    wrapped = strategy.wrap(model, precision)
    built = make_optimizer(optimizer, model, cfg.optimizer, where, geometry.effective)
    search = None
    if geometry.auto:

        def call(batch: Any) -> torch.Tensor:
            with strategy.grad_sync(False), precision.autocast():
                return call_model(wrapped, batch, loss_fn)

        search = measure_micro(
            model,
            built,
            train_data,
            collate_fn or default_collate,
            call,
            device=where,
            per_rank=geometry.effective // dist.world_size,  # at most the data's: see there
            margin=cfg.batch.memory_margin,
            agree=lambda fits: not dist.any_of(not fits)[0],
            stream=is_stream(train_data),
        )
        # Then the accumulation makes up the effective batch.
        geometry = BatchGeometry.of(cfg.batch, dist.world_size, measured=search.chosen)
        if flops is not None:  # counted on one sample: FLOPs and activations scale with it
            flops = scaled_count(flops, geometry.micro)
    return Levers(
        device=where,
        precision=precision,
        strategy=strategy,
        geometry=geometry,
        micro_search=search,
        flops=flops,
        held=held,
        checkpointed_blocks=blocks,
        wrapped=wrapped,
        optimizer=built,
        set_up=instruments.SetUp(
            allow_tf32=cfg.precision.allow_tf32,
            compiled=cfg.compile.mode != "off",
            checkpointing=str(policy),
        ),
    )


@dataclass(kw_only=True, slots=True)
class Assembled:
    """The run built on its levers: what the loop steps, counts and saves."""

    batches: TrainBatches
    forward_model: nn.Module  # the wrapped model, compiled per compile.mode
    state: TrainState
    budget: Budget
    parts: RunParts
    checkpointer: RunCheckpointer
    halving: Halving  # the micro-batch the steps use now: out-of-memory errors halve it
    train_step: TrainStep


def assemble_run(
    model: nn.Module,
    train_data: Any,
    config: TrainConfig,
    dist: Distributed,
    levers: Levers,
    *,
    collate_fn: Callable[[list[Any]], Any] | None,
    order: dict[str, Any],
    scheduler: SchedulerArg,
    loss_fn: LossFn | None,
    log_event: Callable[..., None],
) -> Assembled:
    """The data laid out by the batch geometry, the compiled model, the schedule, the run's
    stateful parts and their checkpointer, and the train step, each handed the config sections
    it reads. `order` holds the user's sampler or batch_sampler; `log_event(**fields)` writes
    an event of the current step. Ten parameters: the Trainer's arguments, passed through."""
    cfg, geometry, device = config, levers.geometry, levers.device
    batches = TrainBatches(
        train_data,
        geometry,
        device,
        collate_fn,
        loading=cfg.data,
        run=cfg.run,
        stop_signals=parse_signals(cfg.spot.signals),
        rank=dist.rank,
        **order,
    )
    forward_model = compile_model(levers.wrapped, cfg.compile.mode)
    state = TrainState()
    budget = Budget.of(cfg.run, batches.steps_per_epoch)
    stepped, horizon, make_scheduler = run_scheduler(
        scheduler,
        levers.optimizer,
        cfg.schedule,
        cfg.run,
        epoch_steps=budget.epoch_steps,
        effective_batch=geometry.effective,
        steps_per_epoch=batches.steps_per_epoch,
        reference_batch=cfg.optimizer.reference_batch,
        guarded=cfg.guard.enabled,
    )
    parts = RunParts(
        model,
        levers.optimizer,
        stepped,
        levers.precision.make_scaler(),
        EarlyStopping(cfg.early_stopping.patience, cfg.early_stopping.min_delta),
        RunGuard(cfg.guard),
        batches,
    )
    layout = Layout(geometry, batches.steps_per_epoch, horizon)
    checkpointer = RunCheckpointer(cfg, dist, levers.strategy, parts, state, layout, make_scheduler)
    halving = Halving(geometry.micro, device)  # out-of-memory errors survived
    train_step = TrainStep(
        dist,
        levers.strategy,
        levers.precision,
        device,
        parts,
        forward_model=forward_model,
        loss_fn=loss_fn,
        halving=halving,
        log_event=log_event,
        normalize=cfg.batch.normalize,
        grad_clip=cfg.optimizer.grad_clip,
        guarded=cfg.guard.enabled,
    )
    return Assembled(
        batches=batches,
        forward_model=forward_model,
        state=state,
        budget=budget,
        parts=parts,
        checkpointer=checkpointer,
        halving=halving,
        train_step=train_step,
    )
