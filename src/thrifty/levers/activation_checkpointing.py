"""Selective activation checkpointing: recompute chosen blocks in backward instead of storing
their activations.

The model's repeated blocks are found by structure (the largest ModuleList/Sequential of
same-class children, e.g. `transformer.h`), and each chosen block's `forward` is replaced by one
that runs it under non-reentrant `torch.utils.checkpoint` with the RNG state preserved, so a
recomputed dropout mask equals the original. The module tree and the state_dict keys are left
unchanged, so checkpoints load with or without the lever.
"""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from thrifty.config.sections import parse_policy

_MARK = "_thrifty_checkpointed_forward"




def find_repeated_blocks(model: nn.Module) -> list[str]:
    """Qualified names of the model's repeated blocks.

    The candidate is the ModuleList or Sequential with at least two children of one class that
    holds the most parameters (the transformer's layers, a ResNet stage...). Returns [] when the
    model has no such container.
    """
    best: tuple[int, list[str]] = (0, [])
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 2:
            continue
        children = list(module.named_children())
        classes = {type(child) for _, child in children}
        if len(classes) != 1 or not any(True for _ in children[0][1].parameters()):
            continue
        params = sum(p.numel() for p in module.parameters())
        if params > best[0]:
            prefix = f"{name}." if name else ""
            best = (params, [prefix + child_name for child_name, _ in children])
    return best[1]


def _checkpointed_forward(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
        return original(*args, **kwargs)
    return checkpoint(original, *args, use_reentrant=False, preserve_rng_state=True, **kwargs)


def checkpoint_module(module: nn.Module) -> None:
    """Make `module` recompute its activations in backward. Idempotent."""
    if _MARK in module.__dict__:
        return
    original = module.forward
    module.forward = functools.partial(_checkpointed_forward, original)
    module.__dict__[_MARK] = original


def remove_activation_checkpointing(model: nn.Module) -> None:
    """Undo `apply_activation_checkpointing` on every module of `model`."""
    for module in model.modules():
        if _MARK in module.__dict__:
            del module.__dict__["forward"]
            del module.__dict__[_MARK]


def apply_activation_checkpointing(
    model: nn.Module, policy: str | Sequence[str] = "every_other"
) -> list[str]:
    """Checkpoint the blocks of `model` that `policy` selects; returns their qualified names.

    `policy` is `off`, `every_other`, `all`, `every_nth:N` (over the repeated blocks found by
    `find_repeated_blocks`) or a list of fnmatch patterns over module names (`["layers.*"]`).
    """
    parsed = parse_policy(policy)
    if parsed.patterns:
        names = [
            name
            for name, _ in model.named_modules()
            if name and any(fnmatch.fnmatchcase(name, p) for p in parsed.patterns)
        ]
        # A block inside a selected block is already recomputed with it.
        names = [n for n in names if not any(n.startswith(o + ".") for o in names)]
        if not names:
            raise ValueError(
                f"activation_checkpointing.policy = {list(parsed.patterns)!r} matches no module "
                "of the model: use names as printed by model.named_modules()"
            )
    elif parsed.nth:
        blocks = find_repeated_blocks(model)
        if not blocks:
            raise ValueError(
                "activation_checkpointing found no repeated blocks in the model (no ModuleList or "
                "Sequential of same-class layers): give module-name patterns instead"
            )
        names = blocks[:: parsed.nth]
    else:
        return []
    modules = dict(model.named_modules())
    for name in names:
        checkpoint_module(modules[name])
    return names
