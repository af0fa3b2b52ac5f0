"""Selective activation checkpointing: recompute chosen blocks in backward instead of storing
their activations.

The model's repeated blocks are found by structure (the children of the ModuleLists and
Sequentials of same-class layers, of the class that holds the most parameters: `transformer.h.*`,
a ResNet's blocks in all four stages). Which of them a policy recomputes is chosen by the
activation memory each holds, measured on a real micro-batch when the run counts its FLOPs:
a ResNet's first stages hold the most of it, its last the most parameters. Each chosen block's
`forward` is replaced by one
that runs it under non-reentrant `torch.utils.checkpoint` with the RNG state preserved, so a
recomputed dropout mask equals the original. The module tree and the state_dict keys are left
unchanged, so checkpoints load with or without the lever.
"""

from __future__ import annotations

import fnmatch
import functools
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from thrifty.config.sections import parse_policy

_MARK = "_thrifty_checkpointed_forward"


def find_repeated_blocks(model: nn.Module) -> list[str]:
    """Qualified names of the model's repeated blocks, in the model's order.

    A repeated block is a child of a ModuleList or Sequential of at least two children of one
    class with parameters (the transformer's layers, a ResNet stage...); of the classes found,
    the one whose blocks hold the most parameters in all. A block inside another is left out
    (it is recomputed with it). Returns [] when the model has no such container.
    """
    blocks: dict[type, list[str]] = defaultdict(list)
    params: dict[type, int] = defaultdict(int)
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)) or len(module) < 2:
            continue
        children = list(module.named_children())
        kinds = {type(child) for _, child in children}
        if len(kinds) != 1 or not any(True for _ in children[0][1].parameters()):
            continue
        prefix = f"{name}." if name else ""
        kind = kinds.pop()
        if any(name.startswith(b + ".") for b in blocks[kind]):
            continue  # a container inside a block of the same class: that block holds it
        blocks[kind] += [prefix + child_name for child_name, _ in children]
        params[kind] += sum(p.numel() for p in module.parameters())
    if not params:
        return []
    return blocks[max(params, key=params.__getitem__)]


def every_nth(blocks: Sequence[str], nth: int, held: Mapping[str, int] | None) -> list[str]:
    """One block in `nth` of `blocks`, in the model's order: those that hold the most activation
    memory when `held` (bytes by block, measured) tells them apart, else every nth from the
    first. Blocks that hold the same keep their positions: a transformer's stay alternate."""
    if not held or not all(name in held for name in blocks):
        return list(blocks[::nth])
    rank = sorted(range(len(blocks)), key=lambda i: (-held[blocks[i]], i % nth != 0, i))
    chosen = set(rank[: math.ceil(len(blocks) / nth)])
    return [name for i, name in enumerate(blocks) if i in chosen]


def policy_blocks(blocks: Sequence[str], held: Mapping[str, int]) -> dict[str, list[str]]:
    """The blocks each nth-policy (all, every_other, every_nth:3, every_nth:4) recomputes."""
    chosen = {}
    for nth, policy in ((1, "all"), (2, "every_other"), (3, "every_nth:3"), (4, "every_nth:4")):
        if nth <= len(blocks):
            chosen[policy] = every_nth(blocks, nth, held)
    return chosen


def policy_savings(
    blocks: Sequence[str], held: Mapping[str, int], inputs: Mapping[str, int] | None = None
) -> dict[str, int]:
    """The activation bytes each nth-policy frees, as measured: what the blocks it recomputes
    hold, less (given `inputs`, the bytes each block is called with) the input each of them
    keeps to recompute from."""
    kept = inputs or {}
    return {
        policy: sum(max(0, held.get(n, 0) - kept.get(n, 0)) for n in chosen)
        for policy, chosen in policy_blocks(blocks, held).items()
    }


def held_again(
    blocks: Sequence[str],
    chosen: Sequence[str],
    held: Mapping[str, int],
    inputs: Mapping[str, int],
    head: int,
) -> int:
    """What recomputing `chosen` (of `blocks`) adds back to the step's peak: backward's first
    recomputation holds its block's activations again. When the last block is recomputed,
    backward does that first, once it has run the head (what comes after the last block,
    which saved `head` bytes and frees them). Otherwise the blocks backward ran first freed
    at least as much. Bytes."""
    if not chosen or chosen[-1] != blocks[-1]:
        return 0
    return max(0, held.get(blocks[-1], 0) - inputs.get(blocks[-1], 0) - head)


def micro_that_fits(
    tried: Sequence[Mapping[str, Any]],
    limit_bytes: float,
    held: Mapping[str, int],
    inputs: Mapping[str, int],
    micro: int,
    policy: str,
    head: int = 0,
) -> dict[str, int]:
    """The largest micro-batch each policy that recomputes more than `policy` (the run's own)
    would fit under `limit_bytes`, predicted from the run's measurements.

    A step's peak grows by a fixed amount a sample: the slope between the two largest sizes
    the micro-batch search found to fit (`tried`, as `MicroSearch.to_dict` writes it, with
    their CUDA peaks). A policy takes from each sample what its blocks hold beyond what
    `policy` already frees (`held`: the bytes each repeated block saves at `micro` samples,
    less `inputs`, those it is called with, which a recomputed block keeps), and gives back
    what its first recomputation holds again (`held_again`, with `head` the bytes saved after
    the last block). A policy left out has no prediction: not measured, nothing more freed,
    or no bound on the size.
    """
    peaks = sorted(
        (t["micro"], t["peak_bytes"]) for t in tried if t.get("fits") and t.get("peak_bytes")
    )
    blocks = list(held)
    savings = policy_savings(blocks, held, inputs)
    own = 0 if policy == "off" else savings.get(policy)
    if len(peaks) < 2 or micro < 1 or own is None:
        return {}
    (m1, p1), (m2, p2) = peaks[-2:]
    per_sample = (p2 - p1) / (m2 - m1)
    fixed = p2 - per_sample * m2
    chosen = policy_blocks(blocks, held)
    own_again = held_again(blocks, chosen.get(policy, []), held, inputs, head)
    fits = {}
    for name, freed in savings.items():
        again = held_again(blocks, chosen[name], held, inputs, head) - own_again
        kept = per_sample - (freed - own - again) / micro
        if freed > own and kept > 0:
            fits[name] = max(0, math.floor((limit_bytes - fixed) / kept))
    return fits


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
    model: nn.Module,
    policy: str | Sequence[str] = "every_other",
    held: Mapping[str, int] | None = None,
) -> list[str]:
    """Checkpoint the blocks of `model` that `policy` selects; returns their qualified names.

    `policy` is `off`, `every_other`, `all`, `every_nth:N` (over the repeated blocks found by
    `find_repeated_blocks`, those holding the most activation memory by `held`, bytes by
    block as `count_flops` measures them, when given) or a list of fnmatch patterns over
    module names (`["layers.*"]`).
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
        names = every_nth(blocks, parsed.nth, held)
    else:
        return []
    modules = dict(model.named_modules())
    for name in names:
        checkpoint_module(modules[name])
    return names
