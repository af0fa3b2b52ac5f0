"""Reading checkpoints back: download, verify against the manifest, load without running code."""

from __future__ import annotations

import contextlib
import os
import pickle
import tempfile
import warnings
from collections.abc import Mapping
from functools import partial
from typing import Any

import torch

from thrifty.checkpointing.store.errors import (
    CheckpointError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
)
from thrifty.checkpointing.store.manifest import (
    MANIFEST,
    Manifest,
    check_file,
    read_manifest,
    verify_dir,
)
from thrifty.checkpointing.store.retry import RetryPolicy
from thrifty.checkpointing.store.storage import (
    Storage,
    atomic_write_bytes,
    fsync_dir,
    is_remote,
    local_error,
    open_storage,
    redact,
)

STATE_FILE = "state.pt"


def load_state(folder: str, manifest: Manifest, *, where: str) -> dict[str, Any]:
    """torch.load the state file of a verified local folder onto the CPU.

    Uses `weights_only=True`: a pickle that would import or call anything other than tensors
    and plain values raises UnsafeCheckpointError naming the file; nothing from it runs.
    """
    if not any(entry.name == STATE_FILE for entry in manifest.files):
        raise CorruptCheckpointError(f"{where} has no {STATE_FILE} in its manifest")
    path = os.path.join(folder, STATE_FILE)
    try:
        with warnings.catch_warnings():
            # A plain pickle (not torch.save's): torch warns of its protocol before it refuses
            # the objects in it; the refusal below is the one line to say.
            warnings.filterwarnings("ignore", "Detected pickle protocol", UserWarning)
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch names the offending global on a line of its own ("... unsupported GLOBAL ...").
        lines = str(exc).splitlines()
        detail = next((line.strip() for line in lines if "global" in line.lower()), "")
        raise UnsafeCheckpointError(
            f"refusing to load {where}/{STATE_FILE}: it holds pickled objects other than tensors "
            f"and plain values ({detail or 'rejected by torch.load(weights_only=True)'}) and "
            "thrifty never executes code from a checkpoint; if you trust its source, read it "
            "yourself with torch.load(weights_only=False) and re-save the plain state"
        ) from None
    except (RuntimeError, EOFError, ValueError) as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CorruptCheckpointError(
            f"{where}/{STATE_FILE} matches its manifest but is not a readable torch file "
            f"({first_line}): resume from an earlier checkpoint"
        ) from exc
    if not isinstance(state, dict):
        raise CorruptCheckpointError(
            f"{where}/{STATE_FILE} holds a {type(state).__name__}, not a dict"
        )
    return state


def download_checkpoint(remote: Storage, name: str, manifest: Manifest, folder: str) -> None:
    """Copy checkpoint folder `name` from `remote` into local `folder`, manifest last.

    Each file lands under a temporary name and is renamed only once it matches the manifest;
    a mismatch raises CorruptCheckpointError naming the remote file.
    """
    where = f"{redact(remote.uri)}/{name}"
    try:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(folder, MANIFEST))
        os.makedirs(folder, exist_ok=True)
        for entry in manifest.files:
            tmp = os.path.join(folder, entry.name + ".tmp")
            os.makedirs(os.path.dirname(tmp), exist_ok=True)
            remote.download(f"{name}/{entry.name}", tmp)
            try:
                check_file(tmp, entry, where=f"{where}/{entry.name}")
            except CorruptCheckpointError:
                os.remove(tmp)
                raise
            os.replace(tmp, os.path.join(folder, entry.name))
        fsync_dir(folder)
        atomic_write_bytes(os.path.join(folder, MANIFEST), manifest.to_json())
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{where} lists a file that is missing ({exc})") from exc
    except OSError as exc:
        raise local_error(exc, f"download checkpoint {where}", folder) from exc


def load_checkpoint(
    ref: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    scratch_dir: str | None = None,
    retry: RetryPolicy | None = None,
) -> dict[str, Any]:
    """Load one checkpoint folder given by local path or URL (its manifest.json also works).

    A remote checkpoint is downloaded into a temporary folder under `scratch_dir` (default: the
    system's temporary directory), verified, loaded and deleted.
    """
    retry = retry or RetryPolicy()
    ref = ref.rstrip("/")
    if ref.endswith("/" + MANIFEST):
        ref = ref[: -len(MANIFEST) - 1]
    if not is_remote(ref):
        folder, manifest = verified_folder(ref)
        return load_state(folder, manifest, where=folder)
    storage = open_storage(ref, storage_options)
    where = redact(ref)
    try:
        data = retry.call(lambda: storage.read_bytes(MANIFEST), f"load {where}")
    except FileNotFoundError:
        raise CheckpointError(_not_a_checkpoint(where)) from None
    manifest = Manifest.from_json(data, where=f"{where}/{MANIFEST}")
    if scratch_dir is not None:
        os.makedirs(scratch_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=scratch_dir) as folder:
        for entry in manifest.files:
            path = os.path.join(folder, entry.name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            retry.call(partial(storage.download, entry.name, path), f"load {where}")
            check_file(path, entry, where=f"{where}/{entry.name}")
        return load_state(folder, manifest, where=where)


def verified_folder(ref: str) -> tuple[str, Manifest]:
    """A local checkpoint folder (or its manifest.json) as an absolute path, checked against
    its manifest, and the manifest."""
    ref = ref.rstrip("/")
    if ref.endswith("/" + MANIFEST):
        ref = ref[: -len(MANIFEST) - 1]
    folder = os.path.abspath(os.path.expanduser(ref))
    manifest = read_manifest(folder, where=folder)
    if manifest is None:
        raise CheckpointError(_not_a_checkpoint(folder))
    verify_dir(folder, manifest, where=folder)
    return folder, manifest


def _not_a_checkpoint(where: str) -> str:
    return f"{where} is not a thrifty checkpoint (no {MANIFEST}): give a step-* folder it wrote"
