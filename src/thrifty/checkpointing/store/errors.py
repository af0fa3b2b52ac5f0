"""Checkpoint errors. Each message is one line naming the location and the fix.

Transient errors (network, throttling, a server restarting) are the only ones retried; every
other failure is permanent and raised to the caller at once.
"""

from __future__ import annotations

from thrifty.errors import ThriftyError


class CheckpointError(ThriftyError):
    """A checkpoint could not be written, found or read; retrying will not help."""


class TransientStorageError(CheckpointError):
    """The storage did not answer or asked us to slow down; the same call may succeed later."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's bytes do not match its manifest (truncated, flipped or missing files)."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holds pickled code; thrifty refuses to execute code from a checkpoint."""


class NoValidCheckpointError(CheckpointError):
    """Checkpoints exist at the location but none verifies: resuming would silently start over."""
