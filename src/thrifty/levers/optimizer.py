"""The optimizer: the user's, a factory's, or the one `[optimizer]` describes, with its
learning rate scaled by the linear scaling rule for the effective batch."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import nn

from thrifty.config import OPTIMIZER_BUILT_ONLY, OptimizerConfig
from thrifty.errors import ThriftyError
from thrifty.levers.schedule import scaled_lr

OptimizerArg = torch.optim.Optimizer | Callable[[nn.Module], torch.optim.Optimizer] | None


def make_optimizer(
    given: OptimizerArg,
    model: nn.Module,
    config: OptimizerConfig,
    device: torch.device,
    effective_batch: int,
) -> torch.optim.Optimizer:
    """The optimizer to train with, its lr scaled (and recorded as the schedule's base)."""
    optimizer = _optimizer(given, model, config, device)
    if given is not None:
        warn_unused(config, optimizer)
    for group in optimizer.param_groups:
        group["lr"] = scaled_lr(group["lr"], effective_batch, config.reference_batch)
        group["initial_lr"] = group["lr"]  # the schedule multiplies the scaled rate
    return optimizer


def warn_unused(config: OptimizerConfig, optimizer: torch.optim.Optimizer) -> None:
    """Say which of [optimizer]'s values, set to other than their defaults, an optimizer the
    user built leaves unused: `optimizer.lr = 0.01` beside a factory of its own is not 0.01."""
    defaults = OptimizerConfig()
    unused = [
        f"optimizer.{name} = {getattr(config, name)!r}"
        for name in OPTIMIZER_BUILT_ONLY
        if getattr(config, name) != getattr(defaults, name)
    ]
    if unused:
        lr = optimizer.param_groups[0].get("lr") if optimizer.param_groups else None
        logging.getLogger("thrifty").warning(
            "%s not used: the optimizer is yours (task.optimizer, or the one given), a %s with "
            "lr %s; set %s there, or leave the optimizer to thrifty",
            " and ".join(unused),
            type(optimizer).__name__,
            lr,
            "them" if len(unused) > 1 else "it",
        )


def _optimizer(
    given: OptimizerArg, model: nn.Module, config: OptimizerConfig, device: torch.device
) -> torch.optim.Optimizer:
    if given is None:
        return build_optimizer(model, config, device)
    if isinstance(given, torch.optim.Optimizer):
        return given
    optimizer = given(model)  # a factory, called on the wrapped (sharded) model
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise ThriftyError(
            f"the optimizer factory returned a {type(optimizer).__name__}, not a "
            "torch.optim.Optimizer: return the optimizer built from model.parameters()"
        )
    return optimizer


def build_optimizer(
    model: nn.Module, config: OptimizerConfig, device: torch.device
) -> torch.optim.Optimizer:
    """SGD, or AdamW with weight decay on matrices only (decaying biases and norm gains hurts
    and saves nothing), fused on CUDA (one launch for all parameters)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if config.name == "sgd":
        return torch.optim.SGD(
            params, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
        )
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": config.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        groups, lr=config.lr, betas=(config.betas[0], config.betas[1]), fused=fused or None
    )
