"""Spot-safe checkpoints: asynchronous save, atomic publish, verified resume, retention.

Importing this package does not import fsspec or any cloud SDK; they load when a URL is used.
"""

from thrifty.checkpoint.errors import (
    CheckpointError,
    CorruptCheckpointError,
    NoValidCheckpointError,
    TransientStorageError,
    UnsafeCheckpointError,
)
from thrifty.checkpoint.loading import load_checkpoint
from thrifty.checkpoint.manager import CheckpointInfo, CheckpointManager
from thrifty.checkpoint.manifest import Manifest, step_dir
from thrifty.checkpoint.retention import checkpoints_to_keep
from thrifty.checkpoint.retry import RetryPolicy
from thrifty.checkpoint.snapshot import copy_to_host
from thrifty.checkpoint.storage import (
    FsspecStorage,
    LocalStorage,
    Storage,
    open_storage,
    redact,
)

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CorruptCheckpointError",
    "FsspecStorage",
    "LocalStorage",
    "Manifest",
    "NoValidCheckpointError",
    "RetryPolicy",
    "Storage",
    "TransientStorageError",
    "UnsafeCheckpointError",
    "checkpoints_to_keep",
    "copy_to_host",
    "load_checkpoint",
    "open_storage",
    "redact",
    "step_dir",
]
