"""A checkpoint folder every rank reads: under several processes rank 0 chooses and verifies
the checkpoint, and every rank loads the same folder, which must be visible to all of them."""

from __future__ import annotations

import os
import uuid
from typing import Any

from thrifty.errors import ConfigError
from thrifty.strategies.process_group import Distributed


def local_checkpoint_folder(ref: Any) -> str:
    """On rank 0: the verified local folder of the checkpoint `ref` points at, for every rank
    to read. A URL must be resumed through checkpoint.location (downloaded into local_dir)."""
    from thrifty.checkpointing.store import CheckpointInfo
    from thrifty.checkpointing.store.loading import verified_folder
    from thrifty.checkpointing.store.storage import is_remote, redact

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
    from thrifty.checkpointing.store.loading import load_state
    from thrifty.checkpointing.store.manifest import read_manifest

    manifest = read_manifest(folder, where=folder) if os.path.isdir(folder) else None
    if d.any_of(manifest is None)[0]:
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
    import torch.distributed as dist

    probe: list[str | None] = [None]
    if d.is_main:
        os.makedirs(local_dir, exist_ok=True)
        mine = os.path.join(local_dir, f".thrifty-probe-{uuid.uuid4().hex}")
        with open(mine, "w"):
            pass
        probe[0] = mine
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
