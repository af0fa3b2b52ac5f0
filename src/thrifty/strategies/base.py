"""The interface every strategy implements: how the model is wrapped, when gradients cross
the ranks, how the clip norm is reduced, what a checkpoint holds and how it is loaded back.

The Trainer calls these and nothing else about the layout; it never asks which strategy runs.
`Strategy` itself is one process holding the whole model, the behaviour the others extend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from torch import nn

from thrifty.errors import ConfigError
from thrifty.levers.precision import Precision
from thrifty.strategies.elastic import warn_world_change
from thrifty.strategies.process_group import Distributed

_NO_SYNC_NEEDED = contextlib.nullcontext()


class Strategy:
    """One process, the whole model: nothing to wrap, nothing to synchronize."""

    name: ClassVar[str] = "single"
    sharded: ClassVar[bool] = False  # checkpoints hold per-rank shards, not the full state

    def __init__(self, dist: Distributed) -> None:
        self.dist = dist

    def check(self, precision: Precision, *, optimizer_given: bool, auto_micro: bool) -> None:
        """Refuse, on every rank alike, what this strategy cannot do."""

    def wrap(self, model: nn.Module, precision: Precision) -> nn.Module:
        """The module the loop calls. Called after activation checkpointing and before the
        optimizer is built."""
        return model

    def grad_sync(self, last: bool) -> AbstractContextManager[Any]:
        """Around each micro-batch's forward and backward: gradients cross the ranks only on
        the window's `last` micro-batch."""
        return _NO_SYNC_NEEDED

    def clip_norm(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        """The 2-norm of all gradients together, the same on every rank and on the device (no
        host sync), after clipping them to `max_norm` (0: no clipping)."""
        if max_norm > 0:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        grads = [p.grad for p in params if p.grad is not None]
        if hasattr(torch.nn.utils, "get_total_norm"):
            return torch.nn.utils.get_total_norm(grads)
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))

    def join_sync(self, one_sample: Callable[[], object]) -> None:
        """This rank ran out of memory in a window: take part in the gradient synchronization
        the other ranks are in, so that none waits in it; every rank then replays the window.
        `one_sample()` runs the synchronizing micro-batch's forward and backward on one
        sample. One process: nobody waits."""

    def before_eval(self) -> None:
        """Before every rank evaluates: make what evaluation reads the same on every rank."""

    # --- checkpoints -------------------------------------------------------------------------

    def full_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """What rank 0's checkpoint state holds of the model and optimizer."""
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}

    def write_shards(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, begin: Any
    ) -> tuple[tuple[str, ...], Any]:
        """Every rank's part of a checkpoint written beside rank 0's state: the files written
        (published by rank 0's manifest) and what rank 0's state must hold to read them back.
        `begin()` opens the step's folder on rank 0 and returns it to every rank."""
        return (), None

    def load(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        folder: str | None,
        *,
        optimizer_state: bool = True,
    ) -> None:
        """Model (and, with `optimizer_state`, the optimizer's moments) from a checkpoint."""
        model.load_state_dict(state["model"])
        if optimizer_state:
            optimizer.load_state_dict(state["optimizer"])

    def saved_shapes(self, state: dict[str, Any], folder: str | None) -> dict[str, tuple[int, ...]]:
        """The parameter shapes the checkpoint was written with."""
        return shapes(state["model"])

    def check_resumable(self, state: dict[str, Any]) -> None:
        """Refuse, with the same ConfigError on every rank, a checkpoint this job cannot
        continue (another layout); say what a resume at another world size does not keep."""
        saved = state.get("strategy", "single")
        if saved == "fsdp":
            raise ConfigError(
                f"the checkpoint holds a sharded (fsdp) model and this run uses "
                f"distributed.strategy = {self.name}: resume with distributed.strategy = fsdp"
            )
        saved_world = int(state.get("world_size", 1))
        if saved_world != self.dist.world_size:  # every rank holds the whole model
            warn_world_change(saved_world, self.dist.world_size, self.name)

    def state_keys(self) -> list[str]:
        """The keys rank 0's checkpoint state must hold for this strategy."""
        return ["model", "optimizer"]


def shapes(tensors: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Each tensor's shape by name (a DTensor's is the global, unsharded one)."""
    return {name: tuple(t.shape) for name, t in tensors.items()}
