"""Sharded checkpoints for FSDP: each rank writes its own shard with torch.distributed.checkpoint.

A sharded checkpoint is an ordinary thrifty checkpoint folder (`step-N/` with `state.pt` and a
manifest written last) whose `shards/` folder holds DCP's files: one `.distcp` per rank with
that rank's pieces of the model and optimizer, and DCP's `.metadata` index. Only tensors go to
DCP; every plain value (param groups, counters, the config) goes to `state.pt`, which is loaded
with `weights_only=True` like every thrifty checkpoint.

DCP reads its index with `pickle.load`; `SafeReader` reads it with an unpickler that admits
only DCP's own metadata classes and torch's sizes and dtypes, and refuses an index that would
make DCP unpickle stored objects. Nothing in a checkpoint is executed.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

from thrifty.checkpointing.store.errors import CorruptCheckpointError, UnsafeCheckpointError

SHARDS_DIR = "shards"
_METADATA = ".metadata"


# --- tensors to DCP, the rest to state.pt -------------------------------------------------------


_NOTHING: Any = type("Nothing", (), {"__repr__": lambda self: "<nothing>"})()


def split_tensors(tree: Any) -> tuple[Any, Any]:
    """(the tensors of a nested dict, everything else), each keeping the nesting.

    A part with nothing in it is None at the top level (plain values such as None inside the
    tree are kept as they are)."""
    tensors, rest = _split(tree)
    return (None if tensors is _NOTHING else tensors), (None if rest is _NOTHING else rest)


def _split(tree: Any) -> tuple[Any, Any]:
    if isinstance(tree, torch.Tensor):
        return tree, _NOTHING
    if not isinstance(tree, Mapping):
        return _NOTHING, tree
    if not tree:
        return _NOTHING, {}  # an empty dict is a value (a parameter with no optimizer state)
    tensors: dict[Any, Any] = {}
    rest: dict[Any, Any] = {}
    for key, value in tree.items():
        t, r = _split(value)
        if t is not _NOTHING:
            tensors[key] = t
        if r is not _NOTHING:
            rest[key] = r
    return (tensors or _NOTHING), (rest or _NOTHING)


def merge_tensors(tensors: Any, rest: Any) -> Any:
    """The inverse of `split_tensors`."""
    if tensors is None:
        return rest
    if rest is None or not isinstance(tensors, Mapping):
        return tensors
    merged = dict(rest)
    for key, value in tensors.items():
        merged[key] = merge_tensors(value, rest[key]) if key in rest else value
    return merged


# --- writing and reading shards ----------------------------------------------------------------


def write_shards(tensors: Mapping[str, Any], folder: str, group: Any = None) -> list[str]:
    """Write this rank's shard of `tensors` (DCP, collective over `group`) under folder/shards.

    Returns, on every rank, the shard folder's file names relative to `folder` as rank 0 sees
    them once DCP has finished (DCP writes its index only after every rank's data is written).
    """
    import torch.distributed.checkpoint as dcp

    path = os.path.join(folder, SHARDS_DIR)
    dcp.save(
        dict(tensors), storage_writer=FileSystemWriter(path, sync_files=True), process_group=group
    )
    return sorted(f"{SHARDS_DIR}/{name}" for name in os.listdir(path))


def read_shards(tensors: dict[str, Any], folder: str, group: Any = None) -> None:
    """Load a sharded checkpoint into `tensors` in place (each rank reads what it holds)."""
    import torch.distributed.checkpoint as dcp

    dcp.load(
        tensors, storage_reader=SafeReader(os.path.join(folder, SHARDS_DIR)), process_group=group
    )


def shard_shapes(folder: str) -> dict[str, tuple[int, ...]]:
    """Each stored tensor's full (unsharded) shape, by DCP key like `model.layers.0.weight`."""
    metadata = read_metadata_safely(os.path.join(folder, SHARDS_DIR, _METADATA))
    return {
        key: tuple(md.size)
        for key, md in metadata.state_dict_metadata.items()
        if not isinstance(md, BytesStorageMetadata)
    }


class SafeReader(FileSystemReader):
    """DCP's file reader with its pickled index read by an allow-list unpickler."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        rank = kwargs.get("rank")
        name = _METADATA if rank is None else f"__{rank}{_METADATA}"
        metadata = read_metadata_safely(os.path.join(str(self.path), name))
        storage_meta = getattr(metadata, "storage_meta", None)
        if storage_meta is None:
            storage_meta = metadata.storage_meta = StorageMeta()
        storage_meta.load_id = self.load_id
        return metadata


_ALLOWED_MODULES = (
    "torch.distributed.checkpoint.metadata",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.planner",
)
_ALLOWED_GLOBALS = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _Refused(pickle.UnpicklingError):
    """A global outside the allow-list: refused before it is imported."""


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = (
            (module, name) in _ALLOWED_GLOBALS
            or (module in _ALLOWED_MODULES and not name.startswith("__"))
            or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype))
        )
        if not allowed:
            raise _Refused(f"global {module}.{name} is not allowed")
        return super().find_class(module, name)


def read_metadata_safely(path: str) -> Metadata:
    """DCP's index at `path`, unpickled with an allow-list; refuses stored Python objects."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CorruptCheckpointError(
            f"{path} is missing: the sharded checkpoint is incomplete"
        ) from None
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except _Refused as exc:
        raise UnsafeCheckpointError(
            f"refusing to read {path}: {exc}; thrifty never executes code from a checkpoint"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise CorruptCheckpointError(f"{path} is not a readable DCP index ({exc})") from None
    if not isinstance(metadata, Metadata):
        raise CorruptCheckpointError(f"{path} holds a {type(metadata).__name__}, not a DCP index")
    pickled = [
        k for k, md in metadata.state_dict_metadata.items() if isinstance(md, BytesStorageMetadata)
    ]
    if pickled:
        raise UnsafeCheckpointError(
            f"refusing to read {path}: it stores pickled objects ({pickled[0]}), which DCP would "
            "unpickle; thrifty writes only tensors to shards"
        )
    return metadata
