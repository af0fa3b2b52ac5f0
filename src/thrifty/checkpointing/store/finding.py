"""Finding, verifying and loading published checkpoints, locally and at a remote location.

A checkpoint counts only when its files match its manifest: the newest that does is the one to
resume from, and one that does not is skipped with a warning, never deleted. A remote checkpoint
is downloaded into the local folder to be verified there.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from thrifty.checkpointing.store.errors import CorruptCheckpointError, NoValidCheckpointError
from thrifty.checkpointing.store.loading import download_checkpoint, load_checkpoint, load_state
from thrifty.checkpointing.store.manifest import (
    Manifest,
    read_published,
    scan,
    step_dir,
    verify_dir,
)
from thrifty.checkpointing.store.retry import RetryPolicy
from thrifty.checkpointing.store.storage import LocalStorage, Storage

log = logging.getLogger("thrifty.checkpointing.store")


@dataclass(frozen=True)
class CheckpointInfo:
    """A published, verified checkpoint. `uri` is redacted; `path` is its verified local copy."""

    step: int
    uri: str
    metric: float | None = None
    created: str = ""
    path: str | None = None


@dataclass(eq=False)
class CheckpointFinder:
    """The resume side of a CheckpointManager: the checkpoints in `local` and, for a URL, in
    `remote` (its redacted URL is `location`). `lock` is the manager's, held for every change to
    the local folder; storage errors are retried with `retry`."""

    local: LocalStorage
    remote: Storage | None
    location: str
    retry: RetryPolicy
    storage_options: Mapping[str, Any]
    lock: threading.RLock
    # folder -> what identified its files when this process last verified them (see _stamp)
    verified_files: dict[str, tuple[object, ...]] = field(default_factory=dict)

    def has_checkpoints(self, *, local: bool = True) -> bool:
        """True when a checkpoint folder with a manifest is at the location or (with `local`)
        in local_dir, whether or not it verifies (reads manifests only; no hashing, no
        download)."""
        with self.lock:
            listings = [scan(self.local)] if local or self.remote is None else []
            if self.remote is not None:
                remote = self.remote
                listings.append(self.retry.call(lambda: scan(remote), "list checkpoints"))
        return any(listing.published or listing.damaged for listing in listings)

    def latest(self, before: int | None = None) -> CheckpointInfo | None:
        """The newest checkpoint whose files match its manifest; None when there is none at all.
        With `before`, the newest of those with a step below it (a rollback's target).

        Looks in local_dir and, for a URL, at the remote location; a remote checkpoint is
        downloaded into local_dir to be verified. One that does not match its manifest is
        skipped with a warning naming it, and the previous one is tried. When checkpoints exist
        but none verifies, raises NoValidCheckpointError: starting over would silently throw
        the run away. Nothing is deleted either way.
        """
        with self.lock:
            local = scan(self.local, warn=True)
            failures = dict(local.damaged)
            remote: dict[int, Manifest] = {}
            if self.remote is not None:
                remote_storage = self.remote
                listing = self.retry.call(
                    lambda: scan(remote_storage, warn=True), "list checkpoints"
                )
                remote = listing.published
                failures = {**listing.damaged, **failures}
            for step in sorted(set(local.published) | set(remote), reverse=True):
                if before is not None and step >= before:
                    continue
                info = self._verified(step, local.published.get(step), remote.get(step), failures)
                if info is not None:
                    return info
            if failures:
                raise NoValidCheckpointError(self._none_valid(failures))
            return None

    def _none_valid(self, failures: Mapping[int, str]) -> str:
        count = f"{len(failures)} fail" if len(failures) > 1 else "the only one fails"
        return (
            f"no valid checkpoint at {self.location}: {count} verification (newest: "
            f"{failures[max(failures)]}); nothing was deleted: resume from one you trust with "
            "--resume PATH (checkpoint.resume), or start fresh with --overwrite "
            "(run.overwrite = true)"
        )

    def load(self, ref: CheckpointInfo | str) -> dict[str, Any]:
        """Load a checkpoint's state onto the CPU after checking it against its manifest.

        `ref` is a CheckpointInfo or the path/URL of one checkpoint folder. Never executes code
        from the file: objects other than tensors and plain values raise UnsafeCheckpointError.
        """
        with self.lock:
            if not isinstance(ref, CheckpointInfo):
                return load_checkpoint(
                    ref,
                    storage_options=self.storage_options,
                    scratch_dir=self.local.root,
                    retry=self.retry,
                )
            remote: Manifest | None = None
            if self.remote is not None:
                remote_storage = self.remote
                remote = self.retry.call(
                    lambda: read_published(remote_storage, ref.step), f"load {ref.uri}"
                )
            info = self._verified(ref.step, self._local_manifest(ref.step), remote, {})
            manifest = self._local_manifest(ref.step)
            if info is None or manifest is None:
                raise CorruptCheckpointError(
                    f"checkpoint {ref.uri} is gone or no longer matches its manifest: "
                    "resume from CheckpointManager.latest()"
                )
            return load_state(self.local.path(step_dir(ref.step)), manifest, where=info.uri)

    def _local_manifest(self, step: int) -> Manifest | None:
        try:
            return read_published(self.local, step)
        except CorruptCheckpointError as exc:
            log.warning("skipping checkpoint %s: %s", self.local.path(step_dir(step)), exc)
            return None

    def _verify_local(self, folder: str, manifest: Manifest, where: str) -> None:
        """verify_dir, skipped when this process verified the same unchanged files already.

        latest() then load() would otherwise hash every byte twice on the way to resuming.
        """
        stamp = _stamp(folder, manifest)
        if stamp is not None and self.verified_files.get(folder) == stamp:
            return
        verify_dir(folder, manifest, where=where)
        if stamp is not None:
            self.verified_files[folder] = stamp

    def _verified(
        self,
        step: int,
        local: Manifest | None,
        remote: Manifest | None,
        failures: dict[int, str],
    ) -> CheckpointInfo | None:
        """Info for a checkpoint whose local copy matches its manifest (downloading if needed);
        None when it does not, with the reason recorded in `failures`."""
        name = step_dir(step)
        folder = self.local.path(name)
        remote_uri = f"{self.location}/{name}"
        if local is not None:
            where = folder
            try:
                self._verify_local(folder, local, where)
                uri = remote_uri if remote == local else where
                return CheckpointInfo(step, uri, local.metric, local.created, folder)
            except CorruptCheckpointError as exc:
                log.warning("skipping checkpoint %s: %s; trying an earlier one", where, exc)
                failures[step] = str(exc)
        if remote is not None and self.remote is not None:
            remote_storage = self.remote
            try:
                self.retry.call(
                    lambda: download_checkpoint(remote_storage, name, remote, folder),
                    f"download {remote_uri}",
                )
                return CheckpointInfo(step, remote_uri, remote.metric, remote.created, folder)
            except CorruptCheckpointError as exc:
                log.warning("skipping checkpoint %s: %s; trying an earlier one", remote_uri, exc)
                failures.setdefault(step, str(exc))
        return None


def _stamp(folder: str, manifest: Manifest) -> tuple[object, ...] | None:
    """What identifies a verified folder's files: the manifest and each file's size and mtime."""
    try:
        stats = [os.stat(os.path.join(folder, entry.name)) for entry in manifest.files]
    except OSError:
        return None
    return (manifest, *((st.st_size, st.st_mtime_ns, st.st_ino) for st in stats))
