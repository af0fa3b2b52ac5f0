"""What a run's checkpoint state is: the parts that join it (anything `Stateful`), the number
of its layout (`STATE_VERSION`), the shims that read the older layouts, and the checks a state
must pass before it is loaded into a run.

Version 1 is every state written before the number was: some keys came later (the scheduler's
kind, the guard, the epoch order, the accumulation, the data's state, the config) and may be
missing. `upgrade_state` fills them in with what their absence meant, so the loader reads one
layout only. A new layout bumps the number and adds its shim here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import torch
from torch import nn

from thrifty.errors import ConfigError, ThriftyError
from thrifty.levers.user_scheduler import OWN_KIND

STATE_VERSION = 2  # the layout of the state (its files' format is the manifest's format_version)

# What every thrifty training state holds, whatever its version (besides the strategy's keys).
REQUIRED = ("scheduler", "scaler", "early_stopping", "progress", "rng", "effective_batch")


class Stateful(Protocol):
    """A part of a run the checkpoint holds: it says its state and takes it back."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


def check_thrifty_state(state: Mapping[str, Any], strategy_keys: list[str]) -> None:
    """Refuse what is not a thrifty training state, naming the keys it lacks and has."""
    missing = [key for key in [*strategy_keys, *REQUIRED] if key not in state]
    if missing:
        raise ThriftyError(
            f"the checkpoint holds no {', '.join(missing)} (it has: "
            f"{', '.join(sorted(map(str, state))) or 'nothing'}): it is not a thrifty "
            "training checkpoint; resume from a folder a Trainer wrote, or load the weights "
            "yourself with model.load_state_dict"
        )


def upgrade_state(state: dict[str, Any], *, accumulation: int) -> dict[str, Any]:
    """`state` in this version's layout. `accumulation` is this run's: a version-1 state that
    did not record its own was written with the same."""
    version = state.get("state_version", 1)
    if not isinstance(version, int) or not 1 <= version <= STATE_VERSION:
        raise ThriftyError(
            f"the checkpoint's state has layout version {version!r} and this thrifty reads "
            f"versions 1 to {STATE_VERSION}: resume it with the (newer) thrifty that wrote it"
        )
    if version == 1:
        state = {
            "scheduler_kind": OWN_KIND,  # before a user's scheduler could be: thrifty's own
            "guard": {},  # before the guard: it starts as built
            "shuffle": "randperm",  # the epoch order before it was recorded
            "accumulation": accumulation,
            "data": None,  # before the data kept a state
            "config": None,  # before the config was saved: no changes can be checked
            **state,
        }
    return {**state, "state_version": STATE_VERSION}


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
