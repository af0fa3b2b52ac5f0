"""Trying a checkpoint location before training, so that a bad one fails before step 1 rather
than at the first save, minutes or hours in."""

from __future__ import annotations

import errno
import os
from functools import partial

from thrifty.checkpointing.store.errors import CheckpointError
from thrifty.checkpointing.store.retry import RetryPolicy
from thrifty.checkpointing.store.storage import (
    LocalStorage,
    Storage,
    atomic_write_bytes,
    local_error,
    redact,
)

PROBE = ".thrifty-write-test"


def probe_storage(storage: Storage, key: str, retry: RetryPolicy) -> None:
    """Write, read back and delete a small file in `storage`.

    Raises a one-line CheckpointError naming the location, the config field `key` that set it,
    and the fix. Transient errors are retried by `retry`.
    """
    if isinstance(storage, LocalStorage):
        _probe_directory(storage.root, key)
        return
    retry.call(partial(storage.write_bytes, PROBE, b"ok"), "probe")
    data = retry.call(partial(storage.read_bytes, PROBE), "probe")
    retry.call(partial(storage.delete, PROBE), "probe")
    if data != b"ok":
        raise CheckpointError(
            f"{key} {redact(storage.uri)} returned other bytes than were written to it: "
            "check the storage endpoint"
        )


def check_not_blocked(root: str, key: str) -> None:
    """Refuse a directory path that a file stands on (itself or one of its parents)."""
    blocker = root
    while not os.path.exists(blocker) and os.path.dirname(blocker) != blocker:
        blocker = os.path.dirname(blocker)
    if not os.path.isdir(blocker):
        raise CheckpointError(
            f"{key} {root} cannot be a directory: {blocker} is a file: choose another {key} "
            "or move the file"
        )


def _probe_directory(root: str, key: str) -> None:
    check_not_blocked(root, key)
    path = os.path.join(root, PROBE)
    try:
        os.makedirs(root, exist_ok=True)
        atomic_write_bytes(path, b"ok")
        with open(path, "rb") as f:
            data = f.read()
        os.remove(path)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise CheckpointError(
                f"{key} {root} is not writable ({exc.strerror}): fix its permissions or "
                f"choose another {key}"
            ) from exc
        raise local_error(exc, "write a test file", root) from exc
    if data != b"ok":
        raise CheckpointError(f"{key} {root} returned other bytes than were written to it")
