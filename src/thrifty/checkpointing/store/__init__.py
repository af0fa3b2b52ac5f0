"""Spot-safe checkpoints: asynchronous save, atomic publish, verified resume, retention.

Importing this package is cheap: torch loads with the pieces that save and load tensors, and
fsspec or a cloud SDK only when a URL is used, so reading a manifest needs neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thrifty.lazy import lazy_exports

if TYPE_CHECKING:  # the real names for type checkers; at run time __getattr__ loads them
    from thrifty.checkpointing.store.errors import CheckpointError as CheckpointError
    from thrifty.checkpointing.store.errors import CorruptCheckpointError as CorruptCheckpointError
    from thrifty.checkpointing.store.errors import NoValidCheckpointError as NoValidCheckpointError
    from thrifty.checkpointing.store.errors import TransientStorageError as TransientStorageError
    from thrifty.checkpointing.store.errors import UnsafeCheckpointError as UnsafeCheckpointError
    from thrifty.checkpointing.store.finding import CheckpointInfo as CheckpointInfo
    from thrifty.checkpointing.store.loading import load_checkpoint as load_checkpoint
    from thrifty.checkpointing.store.manager import CheckpointManager as CheckpointManager
    from thrifty.checkpointing.store.manifest import Manifest as Manifest
    from thrifty.checkpointing.store.manifest import step_dir as step_dir
    from thrifty.checkpointing.store.retention import checkpoints_to_keep as checkpoints_to_keep
    from thrifty.checkpointing.store.retry import RetryPolicy as RetryPolicy
    from thrifty.checkpointing.store.snapshot import copy_to_host as copy_to_host
    from thrifty.checkpointing.store.storage import FsspecStorage as FsspecStorage
    from thrifty.checkpointing.store.storage import LocalStorage as LocalStorage
    from thrifty.checkpointing.store.storage import Storage as Storage
    from thrifty.checkpointing.store.storage import open_storage as open_storage
    from thrifty.checkpointing.store.storage import redact as redact

_EXPORTS = {  # module: the names it lends the package
    "thrifty.checkpointing.store.errors": (
        "CheckpointError CorruptCheckpointError NoValidCheckpointError TransientStorageError "
        "UnsafeCheckpointError"
    ),
    "thrifty.checkpointing.store.loading": "load_checkpoint",
    "thrifty.checkpointing.store.finding": "CheckpointInfo",
    "thrifty.checkpointing.store.manager": "CheckpointManager",
    "thrifty.checkpointing.store.manifest": "Manifest step_dir",
    "thrifty.checkpointing.store.retention": "checkpoints_to_keep",
    "thrifty.checkpointing.store.retry": "RetryPolicy",
    "thrifty.checkpointing.store.snapshot": "copy_to_host",
    "thrifty.checkpointing.store.storage": "FsspecStorage LocalStorage Storage open_storage redact",
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names.split())

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
