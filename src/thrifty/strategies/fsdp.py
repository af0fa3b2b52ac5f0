"""FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters, gradients and optimizer states
sharded over the ranks. Each repeated block is one unit (gathered just before its forward and
backward, freed after), the root holds the rest. Parameters are gathered in the precision's
compute dtype, gradients reduced in fp32. Checkpoints hold each rank's shards, written in
parallel and read back at any world size.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from thrifty.errors import ConfigError, ThriftyError
from thrifty.levers.activation_checkpointing import find_repeated_blocks
from thrifty.levers.precision import Precision
from thrifty.strategies.base import _NO_SYNC_NEEDED, Strategy

log = logging.getLogger("thrifty")


class FSDP(Strategy):
    name = "fsdp"
    sharded = True

    def check(self, precision: Precision, *, optimizer_given: bool, auto_micro: bool) -> None:
        if precision.name == "fp16":
            raise ConfigError(
                "precision.mode = fp16 is not supported with distributed.strategy = fsdp (the "
                "loss scaler would see only this rank's shard of the gradients): use bf16, fp32, "
                "or ddp"
            )
        if precision.name == "fp8":
            raise ConfigError(
                "precision.mode = fp8 is not supported with distributed.strategy = fsdp (its "
                "float8 linears would need float8 all-gathers): use bf16, or ddp"
            )
        if optimizer_given:
            raise ConfigError(
                "an optimizer built before the model is sharded cannot be used with "
                "distributed.strategy = fsdp: pass a factory (optimizer=lambda model: ...) or let "
                "thrifty build it from [optimizer]"
            )
        if auto_micro:  # its trial steps would run collectives a one-sided OOM could strand
            raise ConfigError(
                "batch.micro = 'auto' is not supported with distributed.strategy = fsdp: set "
                "batch.micro to a number (the largest that fits under ddp or one process is a "
                "safe start)"
            )

    def wrap(self, model: nn.Module, precision: Precision) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(
            param_dtype=precision.dtype,  # None (fp32) keeps the parameters' own dtype
            reduce_dtype=torch.float32,
        )
        for name in find_repeated_blocks(model):
            fully_shard(model.get_submodule(name), mp_policy=policy)
        self._root: FSDPModule = fully_shard(model, mp_policy=policy)
        return model

    def grad_sync(self, last: bool) -> AbstractContextManager[Any]:
        self._root.set_requires_gradient_sync(last)
        return _NO_SYNC_NEEDED

    def join_sync(self, one_sample: Callable[[], object]) -> None:
        if not self.dist.enabled:
            return
        # The parameters' all-gathers and the gradients' reduce-scatters run inside forward
        # and backward, one per block: a rank that failed part-way cannot rejoin the others'
        # sequence of collectives, and replaying out of step would mix unrelated tensors.
        raise ThriftyError(
            "out of memory under distributed.strategy = fsdp, which cannot replay the step on "
            "one rank: the run ends here (torchrun stops the other ranks); resume with "
            "batch.micro halved and --allow-config-change (the effective batch, and so the "
            "update, stay the same)"
        )

    def clip_norm(self, params: list[nn.Parameter], max_norm: float) -> torch.Tensor:
        # The norm of sharded gradients is a replicated DTensor: each rank's shard norms reduced.
        norm = super().clip_norm(params, max_norm)
        full = getattr(norm, "full_tensor", None)
        return full() if full is not None else norm

    # --- checkpoints: each rank's shards --------------------------------------------------------

    def full_state(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return {}  # the model and optimizer are in the shards

    def write_shards(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, begin: Any
    ) -> tuple[tuple[str, ...], Any]:
        from thrifty.checkpointing.store.sharded import split_tensors, write_shards

        folder = self.dist.on_main(begin)
        tensors, plain = split_tensors(_sharded_state(model, optimizer))
        return tuple(write_shards(tensors, folder, self.dist.control)), plain

    def load(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        folder: str | None,
        *,
        optimizer_state: bool = True,
    ) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        from thrifty.checkpointing.store.sharded import merge_tensors, read_shards, split_tensors

        if folder is None:
            raise ConfigError("an FSDP state needs its checkpoint folder to read shards from")
        # The state as it is now (the optimizer's initialized), read into from the shards: they
        # reshard to this world size. Another optimizer than the saved one starts its moments
        # anew: its keys are not in the shards, so only the model's are read.
        parts = _sharded_state(model, optimizer)
        if not optimizer_state:
            parts = {"model": parts["model"]}
        tensors, _ = split_tensors(parts)
        read_shards(tensors, folder, self.dist.control)
        loaded = merge_tensors(tensors, state.get("sharded"))
        if not optimizer_state:
            set_model_state_dict(model, loaded["model"])
            return
        set_state_dict(
            model,
            optimizer,
            model_state_dict=loaded["model"],
            optim_state_dict=loaded["optimizer"],
        )

    def saved_shapes(self, state: dict[str, Any], folder: str | None) -> dict[str, tuple[int, ...]]:
        from thrifty.checkpointing.store.sharded import shard_shapes

        if folder is None:
            raise ConfigError("an FSDP state needs its checkpoint folder to read shards from")
        prefix = "model."
        return {
            k[len(prefix) :]: v for k, v in shard_shapes(folder).items() if k.startswith(prefix)
        }

    def check_resumable(self, state: dict[str, Any]) -> None:
        saved = state.get("strategy", "single")
        if saved != "fsdp":
            raise ConfigError(
                f"the checkpoint holds a full ({saved}) model and this run uses "
                f"distributed.strategy = fsdp: resume with distributed.strategy = {saved}"
            )
        saved_world = int(state.get("world_size", 1))
        if saved_world != self.dist.world_size:
            log.warning(
                "resharding a checkpoint of %d processes onto %d: the data order continues "
                "exactly, the random streams of the ranks (dropout) start afresh",
                saved_world,
                self.dist.world_size,
            )

    def state_keys(self) -> list[str]:
        return []


def _sharded_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state as this rank's shards (DTensors), keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}
