"""Data parallelism for the Trainer: wrapping the model for DDP or FSDP2, gradient sync only on
the last micro-batch of a window, and the checkpoint state of a job of several processes.

DDP keeps a full replica per rank and all-reduces gradients during backward. FSDP2
(`torch.distributed.fsdp.fully_shard`) shards parameters, gradients and optimizer states: each
repeated block is one unit (gathered just before its forward and backward, freed after), the
root holds the rest. Its mixed-precision policy follows `precision`: parameters are gathered
in bf16 for compute, gradients reduced in fp32.
"""

from __future__ import annotations

import contextlib
import logging
import os
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from thrifty.activation_checkpointing import find_repeated_blocks
from thrifty.distributed import Distributed
from thrifty.errors import ConfigError
from thrifty.precision import Precision

log = logging.getLogger("thrifty")

GradSync = Callable[[bool], AbstractContextManager[Any]]


def _no_context(_: bool) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


def check_strategy(d: Distributed, precision: Precision, optimizer_given: bool) -> None:
    """Refuse (on every rank alike) what a strategy cannot do."""
    if d.strategy != "fsdp":
        return
    if precision.name == "fp16":
        raise ConfigError(
            "precision.mode = fp16 is not supported with distributed.strategy = fsdp (the loss "
            "scaler would see only this rank's shard of the gradients): use bf16, fp32, or ddp"
        )
    if optimizer_given:
        raise ConfigError(
            "an optimizer built before the model is sharded cannot be used with "
            "distributed.strategy = fsdp: pass a factory (optimizer=lambda model: ...) or let "
            "thrifty build it from [optimizer]"
        )


def wrap(model: nn.Module, d: Distributed, precision: Precision) -> tuple[nn.Module, GradSync]:
    """The module the loop calls, and a context factory: `grad_sync(last)` around each
    micro-batch's forward and backward syncs gradients only when `last` is True."""
    if d.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        ddp = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )

        def ddp_sync(last: bool) -> AbstractContextManager[Any]:
            return contextlib.nullcontext() if last else ddp.no_sync()

        return ddp, ddp_sync
    if d.strategy == "fsdp":
        return _fully_shard(model, precision)
    return model, _no_context


def _fully_shard(model: nn.Module, precision: Precision) -> tuple[nn.Module, GradSync]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=precision.dtype,  # None (fp32) keeps the parameters' own dtype
        reduce_dtype=torch.float32,
    )
    for name in find_repeated_blocks(model):
        fully_shard(model.get_submodule(name), mp_policy=policy)
    fully_shard(model, mp_policy=policy)

    def fsdp_sync(last: bool) -> AbstractContextManager[Any]:
        model.set_requires_gradient_sync(last)  # type: ignore[operator]
        return contextlib.nullcontext()

    return model, fsdp_sync


# --- checkpoint state ----------------------------------------------------------------------------


def fsdp_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Model and optimizer state as this rank's shards (DTensors), keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optimizer": optim_state}


def load_fsdp_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )


# --- resume in a job of several processes --------------------------------------------------------


def check_resumable(d: Distributed, state: dict[str, Any]) -> None:
    """Refuse, with the same ConfigError on every rank, a checkpoint this job cannot continue."""
    saved_strategy = state.get("strategy", "single")
    saved_world = int(state.get("world_size", 1))
    sharded, here_sharded = saved_strategy == "fsdp", d.strategy == "fsdp"
    if sharded != here_sharded:
        layout = "sharded (fsdp)" if sharded else f"full ({saved_strategy})"
        raise ConfigError(
            f"the checkpoint holds a {layout} model and this run uses distributed.strategy = "
            f"{d.strategy}: resume with distributed.strategy = {saved_strategy}"
        )
    if not here_sharded and saved_world != d.world_size:
        raise ConfigError(
            f"the checkpoint was written by {saved_world} process(es) and this run has "
            f"{d.world_size}: with {d.strategy}, every rank's random-number and data streams are "
            f"part of an exact resume, so it resumes only at the world size that wrote it; "
            f"launch {saved_world} process(es), or train with distributed.strategy = fsdp, "
            "whose checkpoints reshard"
        )
    if here_sharded and saved_world != d.world_size:
        log.warning(
            "resharding a checkpoint of %d processes onto %d: the data order continues exactly, "
            "the random streams of the ranks (dropout) start afresh",
            saved_world,
            d.world_size,
        )


def local_checkpoint_folder(guard: Any, ref: Any) -> str:
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
    missing = d.any_of(manifest is None)[0]
    if missing:
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
    probe: list[str | None] = [None]
    if d.is_main:
        os.makedirs(local_dir, exist_ok=True)
        probe[0] = os.path.join(local_dir, f".thrifty-probe-{uuid.uuid4().hex}")
        with open(probe[0], "w"):
            pass
    import torch.distributed as dist

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


def load_sharded(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    folder: str,
    effective_batch: int,
    d: Distributed,
) -> None:
    """Read the model's and optimizer's shards (resharding to this world size) into place."""
    from thrifty.checkpoint.sharded import (
        merge_tensors,
        read_shards,
        shard_shapes,
        split_tensors,
    )
    from thrifty.spot import check_compatible, shapes

    saved = {
        k[len("model.") :]: v for k, v in shard_shapes(folder).items() if k.startswith("model.")
    }
    check_compatible(saved, shapes(model.state_dict()), state["effective_batch"], effective_batch)
    tensors, _ = split_tensors(fsdp_state(model, optimizer))  # the optimizer state initialized
    read_shards(tensors, folder, d.control)
    load_fsdp_state(model, optimizer, merge_tensors(tensors, state.get("sharded")))
