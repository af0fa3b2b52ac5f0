"""Spot-safe checkpoints: asynchronous save, atomic publish, verified resume, retention.

Importing this package is cheap: torch loads with the pieces that save and load tensors, and
fsspec or a cloud SDK only when a URL is used, so reading a manifest needs neither.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from thrifty.lazy import lazy_exports

if TYPE_CHECKING:  # the real names for type checkers; at run time __getattr__ loads them
    from thrifty.checkpoint.errors import CheckpointError as CheckpointError
    from thrifty.checkpoint.errors import CorruptCheckpointError as CorruptCheckpointError
    from thrifty.checkpoint.errors import NoValidCheckpointError as NoValidCheckpointError
    from thrifty.checkpoint.errors import TransientStorageError as TransientStorageError
    from thrifty.checkpoint.errors import UnsafeCheckpointError as UnsafeCheckpointError
    from thrifty.checkpoint.finding import CheckpointInfo as CheckpointInfo
    from thrifty.checkpoint.loading import load_checkpoint as load_checkpoint
    from thrifty.checkpoint.manager import CheckpointManager as CheckpointManager
    from thrifty.checkpoint.manifest import Manifest as Manifest
    from thrifty.checkpoint.manifest import step_dir as step_dir
    from thrifty.checkpoint.retention import checkpoints_to_keep as checkpoints_to_keep
    from thrifty.checkpoint.retry import RetryPolicy as RetryPolicy
    from thrifty.checkpoint.snapshot import copy_to_host as copy_to_host
    from thrifty.checkpoint.storage import FsspecStorage as FsspecStorage
    from thrifty.checkpoint.storage import LocalStorage as LocalStorage
    from thrifty.checkpoint.storage import Storage as Storage
    from thrifty.checkpoint.storage import open_storage as open_storage
    from thrifty.checkpoint.storage import redact as redact

_EXPORTS = {  # module: the names it lends the package
    "thrifty.checkpoint.errors": (
        "CheckpointError CorruptCheckpointError NoValidCheckpointError TransientStorageError "
        "UnsafeCheckpointError"
    ),
    "thrifty.checkpoint.loading": "load_checkpoint",
    "thrifty.checkpoint.finding": "CheckpointInfo",
    "thrifty.checkpoint.manager": "CheckpointManager",
    "thrifty.checkpoint.manifest": "Manifest step_dir",
    "thrifty.checkpoint.retention": "checkpoints_to_keep",
    "thrifty.checkpoint.retry": "RetryPolicy",
    "thrifty.checkpoint.snapshot": "copy_to_host",
    "thrifty.checkpoint.storage": "FsspecStorage LocalStorage Storage open_storage redact",
}

__all__ = sorted(name for names in _EXPORTS.values() for name in names.split())

__getattr__, __dir__ = lazy_exports(globals(), _EXPORTS)
