"""Writing one checkpoint folder on local disk: state file, then manifest, each made durable.

A SIGKILL at any moment leaves either a folder with no manifest, which readers ignore, or a
complete checkpoint. A failed write (a full disk) removes what it wrote and says how much it
needed; a step saved again (a resumed run's final save of the step it resumed) keeps its
published copy until the new state file is whole.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any

import torch

from thrifty.checkpointing.store.loading import STATE_FILE
from thrifty.checkpointing.store.manifest import (
    MANIFEST,
    FileEntry,
    Manifest,
    sha256_file,
    step_dir,
    utc_now,
)
from thrifty.checkpointing.store.snapshot import nbytes
from thrifty.checkpointing.store.storage import (
    LocalStorage,
    atomic_write_bytes,
    fsync_dir,
    local_error,
)


def write_checkpoint(
    local: LocalStorage,
    step: int,
    state: Any,
    metric: float | None,
    extra: Sequence[str] = (),
    record: dict[str, Any] | None = None,
) -> Manifest:
    """Write `state` as checkpoint `step` in `local` and publish it with its manifest.

    `extra` are files already in the step's folder (sharded checkpoints), hashed into the
    manifest; `record` goes into the manifest as it is. Raises a one-line CheckpointError on a
    failed write.
    """
    name = step_dir(step)
    folder = local.path(name)
    tmp = os.path.join(folder, STATE_FILE + ".tmp")
    existed = os.path.isdir(folder)
    try:
        os.makedirs(folder, exist_ok=True)
        _save_file(state, tmp)
        # Hashing reads the fresh file back: the manifest describes what landed on disk.
        entries = [FileEntry(STATE_FILE, os.path.getsize(tmp), sha256_file(tmp))]
        for rel in extra:
            path = os.path.join(folder, rel)
            entries.append(FileEntry(rel, os.path.getsize(path), sha256_file(path)))
        # Saving a step that exists: stop trusting the old copy before its file is replaced.
        local.delete(f"{name}/{MANIFEST}")
        os.replace(tmp, os.path.join(folder, STATE_FILE))
        fsync_dir(folder)
        thrifty_version, torch_version = _versions()
        manifest = Manifest(
            step, tuple(entries), utc_now(), metric, thrifty_version, torch_version, record
        )
        atomic_write_bytes(os.path.join(folder, MANIFEST), manifest.to_json())
        fsync_dir(local.root)
        return manifest
    except OSError as exc:
        # A partial folder would hold on to the space a full disk lacks. A step saved before
        # keeps its copy when the new one failed before replacing it; one whose manifest went
        # is unpublished, so nothing readable is lost.
        with contextlib.suppress(OSError):
            if existed and os.path.isfile(os.path.join(folder, MANIFEST)):
                local.delete(f"{name}/{STATE_FILE}.tmp")
            else:
                local.delete(name)
        needs = nbytes(state) + sum(_size(os.path.join(folder, rel)) for rel in extra)
        raise local_error(exc, f"write checkpoint step {step}", folder, needs_bytes=needs) from exc


def _save_file(state: Any, path: str) -> None:
    """torch.save and fsync. Written through a Python file so that a failed write raises its
    OSError (ENOSPC, EIO): given a path, torch reports "iostream error" and the errno is lost."""
    try:
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    except RuntimeError as exc:
        cause = exc.__context__ or exc.__cause__
        if isinstance(cause, OSError):
            raise cause from exc
        raise


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _versions() -> tuple[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("thrifty"), torch.__version__
    except PackageNotFoundError:
        return "unknown", torch.__version__
