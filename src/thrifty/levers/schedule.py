"""Learning rate: the linear scaling rule, linear warmup, then cosine decay or constant."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from thrifty.config import ScheduleConfig
from thrifty.errors import ConfigError


def scaled_lr(lr: float, effective_batch: int, reference_batch: int | None) -> float:
    """The linear scaling rule (Goyal et al. 2017): lr grows with the effective batch.

    `lr` is the rate tuned at `reference_batch` samples per step; None disables scaling.
    """
    if reference_batch is None:
        return lr
    return lr * effective_batch / reference_batch


def lr_multiplier(
    step: int,
    *,
    warmup_steps: int,
    decay: str,
    total_steps: int | None,
    min_lr_ratio: float,
) -> float:
    """Factor on the peak lr for optimizer step `step` (0-based).

    Warmup rises linearly to 1 at step `warmup_steps - 1`; cosine then falls to `min_lr_ratio`
    at `total_steps` and stays there.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError("cosine decay needs total_steps")
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    decay: str,
    total_steps: int | None,
    min_lr_ratio: float,
) -> LambdaLR:
    """A LambdaLR over `lr_multiplier` (its state saves and restores with the checkpoint)."""

    def factor(step: int) -> float:
        return lr_multiplier(
            step,
            warmup_steps=warmup_steps,
            decay=decay,
            total_steps=total_steps,
            min_lr_ratio=min_lr_ratio,
        )

    return LambdaLR(optimizer, factor)


def schedule_horizon(
    schedule: ScheduleConfig, max_steps: int | None, epoch_steps: int | None
) -> int | None:
    """The schedule's steps: schedule.total_steps, else the budget's steps or epochs."""
    horizon = schedule.total_steps or max_steps or epoch_steps
    if horizon is None and schedule.decay == "cosine":
        raise ConfigError(
            "schedule.decay = 'cosine' needs a horizon: set run.max_steps, run.max_epochs or "
            "schedule.total_steps, or use schedule.decay = 'constant'"
        )
    return horizon


def scheduler_for(
    optimizer: torch.optim.Optimizer, schedule: ScheduleConfig, horizon: int | None
) -> LambdaLR:
    """The scheduler `[schedule]` describes, over `horizon` steps."""
    return build_scheduler(
        optimizer,
        warmup_steps=schedule.warmup_steps,
        decay=schedule.decay,
        total_steps=horizon,
        min_lr_ratio=schedule.min_lr_ratio,
    )
