"""Spot-safe checkpoints: asynchronous save, atomic publish, verified resume, bounded retention.

`save()` blocks training only while the state is copied to host memory. One background thread
then writes the checkpoint to local disk (temporary name, fsync, rename; manifest last), uploads
it when the location is remote (files first, manifest last) and deletes old checkpoints
(manifest first, and only once a newer one is published). A SIGKILL at any of those moments
leaves either a folder with no manifest, which readers ignore, or a complete checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from thrifty.checkpoint.errors import CheckpointError, CorruptCheckpointError, TransientStorageError
from thrifty.checkpoint.loading import (
    STATE_FILE,
    download_checkpoint,
    load_checkpoint,
    load_state,
)
from thrifty.checkpoint.manifest import (
    MANIFEST,
    FileEntry,
    Manifest,
    clean_metric,
    read_published,
    scan,
    sha256_file,
    step_dir,
    utc_now,
    verify_dir,
)
from thrifty.checkpoint.retention import checkpoints_to_keep
from thrifty.checkpoint.retry import RetryPolicy
from thrifty.checkpoint.snapshot import HostBuffers, copy_to_host
from thrifty.checkpoint.storage import (
    LocalStorage,
    Storage,
    atomic_write_bytes,
    fsync_dir,
    fsync_file,
    is_remote,
    local_error,
    open_storage,
    redact,
)
from thrifty.errors import ConfigError

log = logging.getLogger("thrifty.checkpoint")


@dataclass(frozen=True)
class CheckpointInfo:
    """A published, verified checkpoint. `uri` is redacted; `path` is its verified local copy."""

    step: int
    uri: str
    metric: float | None = None
    created: str = ""
    path: str | None = None


def _versions() -> tuple[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("thrifty"), torch.__version__
    except PackageNotFoundError:
        return "unknown", torch.__version__


class CheckpointManager:
    """Save, find and load checkpoints at `location`: a local directory or an fsspec URL.

    With a URL, `local_dir` is required: checkpoints are written there first and uploaded in the
    background, and a local copy is kept until its upload is confirmed. With a local `location`,
    `local_dir` is ignored. Transient storage errors are retried `upload_retries` times with
    exponential backoff from `retry_backoff` seconds; when they run out the checkpoint stays
    local, training goes on, and the next save uploads it. Call it from one thread only.
    """

    def __init__(
        self,
        location: str,
        *,
        local_dir: str | None = None,
        keep_last: int = 2,
        keep_best: bool = False,
        storage_options: Mapping[str, Any] | None = None,
        upload_retries: int = 5,
        retry_backoff: float = 1.0,
    ) -> None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 2:
            raise ConfigError(
                f"checkpoint.keep_last must be an integer of at least 2, got {keep_last!r}: "
                "with one checkpoint a corrupt newest one leaves nothing to resume from"
            )
        if upload_retries < 0 or retry_backoff < 0:
            raise ConfigError(
                "checkpoint.upload_retries and checkpoint.retry_backoff must be >= 0, got "
                f"{upload_retries!r} and {retry_backoff!r}"
            )
        self.location = redact(location.rstrip("/")) if is_remote(location) else ""
        self.keep_last = keep_last
        self.keep_best = keep_best
        self._retry = RetryPolicy(retries=upload_retries, backoff=retry_backoff)
        self._storage_options = dict(storage_options or {})
        self._remote: Storage | None = None
        if is_remote(location):
            if not local_dir:
                raise ConfigError(
                    f"checkpoint.local_dir is required when checkpoint.location is a URL "
                    f"({self.location}): give a local directory to stage checkpoints in"
                )
            self._remote = open_storage(location, self._storage_options)
        self._local = LocalStorage(local_dir if local_dir and self._remote else location)
        self.local_dir = self._local.root
        self.location = self.location or self.local_dir
        self.last_stall_seconds = 0.0
        self.last_save_seconds = 0.0
        self._buffers = HostBuffers()
        self._io_lock = threading.RLock()  # one of: the background job, latest(), load()
        self._idle = threading.Event()
        self._idle.set()
        self._wake = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._pending: list[int] = []
        self._confirmed: dict[int, Manifest] = {}  # the remote's published checkpoints, last seen
        self._verified_files: dict[str, tuple[object, ...]] = {}

    def __repr__(self) -> str:
        return f"CheckpointManager({self.location!r}, keep_last={self.keep_last})"

    def __enter__(self) -> CheckpointManager:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except Exception:  # do not hide the error that is already on its way out
            log.exception("checkpoint error while closing after another error")

    # --- the training loop's side ------------------------------------------------------------

    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        *,
        metric: float | None = None,
        extra_files: Sequence[str] = (),
    ) -> None:
        """Copy `state` to host memory and write it in the background; return at once after.

        Waits first for the previous save (raising its error if it failed permanently). The
        caller is blocked only for that wait and the copy: `last_stall_seconds` (seconds).
        `metric` ranks checkpoints for keep_best (lower is better; NaN is not ranked).
        `extra_files` are files already written into `begin(step)`'s folder (sharded
        checkpoints): they are hashed into the manifest and uploaded with the state.
        """
        self._check_step(step)
        start = time.perf_counter()
        self._idle.wait()
        self._raise_pending()
        try:
            host_state = copy_to_host(dict(state), self._buffers)
        except TypeError as exc:
            raise CheckpointError(f"cannot checkpoint step {step}: {exc}") from None
        self.last_stall_seconds = time.perf_counter() - start
        metric = clean_metric(metric)
        extra = tuple(extra_files)
        self._submit(lambda: self._save_job(step, host_state, metric, start, extra))

    def begin(self, step: int) -> str:
        """The local folder for step `step`, emptied and unpublished, for files written into it
        before `save(step, ..., extra_files=...)`; waits for the save in flight first."""
        self._check_step(step)
        self._idle.wait()
        self._raise_pending()
        name = step_dir(step)
        folder = self._local.path(name)
        try:
            self._local.delete(f"{name}/{MANIFEST}")  # stop trusting an old copy first
            self._local.delete(name)
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise local_error(exc, f"prepare checkpoint step {step}", folder) from exc
        return folder

    def _check_step(self, step: int) -> None:
        if self._closed:
            raise CheckpointError(f"the checkpoint manager for {self.location} is closed")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"checkpoint step must be a non-negative integer, got {step!r}")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for the save in flight; True when none is left.

        Raises the background save's error if it failed permanently. Transient upload failures
        are not errors: see `pending_uploads`.
        """
        done = self._idle.wait(timeout)
        if done:
            self._raise_pending()
        return done

    def close(self, timeout: float | None = 300.0) -> bool:
        """Wait up to `timeout` seconds for the save in flight, then stop the background thread.

        Returns False if the save was still running; it then goes on until the process exits.
        """
        done = self._idle.wait(timeout)
        with self._wake:
            self._closed = True
            self._wake.notify()
        if done and self._thread is not None:
            self._thread.join(timeout=5.0)
        if done:
            self._buffers = HostBuffers()  # give back the host copy of the state
            self._raise_pending()
        return done

    @property
    def pending_uploads(self) -> list[int]:
        """Steps kept in local_dir because their upload is not confirmed, as of the last save.

        No I/O: safe to read on the way out of a preempted run. Always empty for a local location.
        """
        return list(self._pending)

    def check(self) -> None:
        """Write, read back and delete a small file at the location; raise a one-line error.

        Call it before training so that a wrong bucket, missing credentials or an unreachable
        endpoint fail at once rather than at the first checkpoint.
        """
        probe = ".thrifty-write-test"
        for storage in (self._local, self._remote):
            if storage is None:
                continue
            self._retry.call(partial(storage.write_bytes, probe, b"ok"), "check")
            data = self._retry.call(partial(storage.read_bytes, probe), "check")
            self._retry.call(partial(storage.delete, probe), "check")
            if data != b"ok":
                raise CheckpointError(
                    f"{redact(storage.uri)} returned other bytes than were written to it: "
                    "check the storage endpoint"
                )

    # --- resume ------------------------------------------------------------------------------

    def latest(self) -> CheckpointInfo | None:
        """The newest checkpoint whose files match its manifest, or None.

        Looks in local_dir and, for a URL, at the remote location; a remote checkpoint is
        downloaded into local_dir to be verified. One that does not match its manifest is
        skipped with a warning naming it, and the previous one is tried.
        """
        with self._io_lock:
            local = scan(self._local, warn=True)[0]
            remote: dict[int, Manifest] = {}
            if self._remote is not None:
                remote_storage = self._remote
                remote = self._retry.call(
                    lambda: scan(remote_storage, warn=True)[0], "list checkpoints"
                )
            for step in sorted(set(local) | set(remote), reverse=True):
                info = self._verified(step, local.get(step), remote.get(step))
                if info is not None:
                    return info
            return None

    def load(self, ref: CheckpointInfo | str) -> dict[str, Any]:
        """Load a checkpoint's state onto the CPU after checking it against its manifest.

        `ref` is a CheckpointInfo or the path/URL of one checkpoint folder. Never executes code
        from the file: objects other than tensors and plain values raise UnsafeCheckpointError.
        """
        with self._io_lock:
            if not isinstance(ref, CheckpointInfo):
                return load_checkpoint(
                    ref,
                    storage_options=self._storage_options,
                    scratch_dir=self.local_dir,
                    retry=self._retry,
                )
            remote: Manifest | None = None
            if self._remote is not None:
                remote_storage = self._remote
                remote = self._retry.call(
                    lambda: read_published(remote_storage, ref.step), f"load {ref.uri}"
                )
            info = self._verified(ref.step, self._local_manifest(ref.step), remote)
            manifest = self._local_manifest(ref.step)
            if info is None or manifest is None:
                raise CorruptCheckpointError(
                    f"checkpoint {ref.uri} is gone or no longer matches its manifest: "
                    "resume from CheckpointManager.latest()"
                )
            return load_state(self._local.path(step_dir(ref.step)), manifest, where=info.uri)

    # --- background work ---------------------------------------------------------------------

    def _submit(self, job: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="thrifty-checkpoint", daemon=True
            )
            self._thread.start()
        with self._wake:
            self._idle.clear()
            self._job = job
            self._wake.notify()

    def _run(self) -> None:
        # A daemon thread: a process exiting after a bounded wait() must not hang on an upload.
        while True:
            with self._wake:
                while self._job is None and not self._closed:
                    self._wake.wait()
                job, self._job = self._job, None
            if job is None:
                return
            try:
                with self._io_lock:
                    job()
            except BaseException as exc:  # surfaced by the next save(), wait() or close()
                self._error = exc
            finally:
                self._idle.set()

    def _raise_pending(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def _save_job(
        self, step: int, state: Any, metric: float | None, start: float, extra: tuple[str, ...]
    ) -> None:
        self._write_local(step, state, metric, extra)
        del state
        log.info("checkpoint step %d written to %s", step, self.local_dir)
        if self._remote is not None:
            self._sync_remote(self._remote)
        else:
            published, orphans = scan(self._local)
            self._purge(self._local, published, self._keep(published), orphans)
        self.last_save_seconds = time.perf_counter() - start

    def _write_local(
        self, step: int, state: Any, metric: float | None, extra: tuple[str, ...] = ()
    ) -> None:
        name = step_dir(step)
        folder = self._local.path(name)
        tmp = os.path.join(folder, STATE_FILE + ".tmp")
        try:
            # Saving a step that exists: stop trusting the old copy before touching its files.
            self._local.delete(f"{name}/{MANIFEST}")
            os.makedirs(folder, exist_ok=True)
            torch.save(state, tmp)
            fsync_file(tmp)
            # Hashing reads the fresh file back: the manifest describes what landed on disk.
            entries = [FileEntry(STATE_FILE, os.path.getsize(tmp), sha256_file(tmp))]
            for rel in extra:
                path = os.path.join(folder, rel)
                entries.append(FileEntry(rel, os.path.getsize(path), sha256_file(path)))
            os.replace(tmp, os.path.join(folder, STATE_FILE))
            fsync_dir(folder)
            thrifty_version, torch_version = _versions()
            manifest = Manifest(
                step, tuple(entries), utc_now(), metric, thrifty_version, torch_version
            )
            atomic_write_bytes(os.path.join(folder, MANIFEST), manifest.to_json())
            fsync_dir(self._local.root)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise local_error(exc, f"write checkpoint step {step}", folder) from exc

    def _keep(self, published: Mapping[int, Manifest]) -> set[int]:
        metrics = {step: manifest.metric for step, manifest in published.items()}
        return checkpoints_to_keep(metrics, keep_last=self.keep_last, keep_best=self.keep_best)

    def _sync_remote(self, remote: Storage) -> None:
        """Upload what retention keeps, newest first, then purge both sides.

        When the storage stays unreachable through every retry, checkpoints stay in local_dir
        and training goes on; the next save tries again.
        """
        try:
            self._pending = self._upload_and_purge(remote)
        except TransientStorageError as exc:
            confirmed = self._confirmed
            self._pending = sorted(
                s for s, m in scan(self._local)[0].items() if confirmed.get(s) != m
            )
            log.warning(
                "checkpoints stay in %s until %s can be reached: %s",
                self.local_dir,
                self.location,
                exc,
            )

    def _upload_and_purge(self, remote: Storage) -> list[int]:
        """Returns the steps still waiting for their upload (none, unless an error cut in)."""
        local, local_orphans = scan(self._local)
        published, orphans = self._retry.call(lambda: scan(remote), "list checkpoints")
        self._confirmed = published
        keep = self._keep({**published, **local})
        for step in sorted(local, reverse=True):
            if step in keep and published.get(step) != local[step]:
                self._upload(remote, step, local[step], replacing=step in published)
                published[step] = local[step]
        self._purge(remote, published, self._keep(published), orphans)
        # Locally keep the newest (a restart on this machine needs no download) and whatever
        # retention keeps that is not confirmed remotely yet.
        newest = max(local, default=-1)
        unconfirmed = {s for s, m in local.items() if s in keep and published.get(s) != m}
        self._purge(self._local, local, unconfirmed | {newest}, local_orphans)
        return sorted(unconfirmed)

    def _upload(self, remote: Storage, step: int, manifest: Manifest, *, replacing: bool) -> None:
        name = step_dir(step)
        if replacing:
            self._retry.call(lambda: remote.delete(f"{name}/{MANIFEST}"), f"upload {name}")
        for entry in manifest.files:
            source = self._local.path(f"{name}/{entry.name}")
            target = f"{name}/{entry.name}"

            def put(source: str = source, target: str = target, size: int = entry.size) -> None:
                remote.upload(source, target)
                if remote.size(target) != size:
                    raise TransientStorageError(
                        f"{redact(remote.uri)}/{target} has the wrong size after upload"
                    )

            self._retry.call(put, f"upload {target}")
        self._retry.call(
            lambda: remote.write_bytes(f"{name}/{MANIFEST}", manifest.to_json()), f"upload {name}"
        )
        log.info("checkpoint step %d uploaded to %s", step, self.location)

    def _purge(
        self, storage: Storage, published: dict[int, Manifest], keep: set[int], orphans: list[int]
    ) -> None:
        """Delete published checkpoints not in `keep` (manifest first) and stale partial ones."""
        newest = max(published, default=None)
        if newest is None:
            return
        for step in sorted(published):
            if step not in keep and step < newest:
                name = step_dir(step)
                self._retry.call(partial(storage.delete, f"{name}/{MANIFEST}"), "purge")
                self._retry.call(partial(storage.delete, name), "purge")
                del published[step]
        # Folders without a manifest below the newest step are leftovers of a killed save.
        for name in [step_dir(step) for step in orphans if step < newest]:
            self._retry.call(partial(storage.delete, name), "purge")

    # --- finding and verifying ---------------------------------------------------------------

    def _local_manifest(self, step: int) -> Manifest | None:
        try:
            return read_published(self._local, step)
        except CorruptCheckpointError as exc:
            log.warning("skipping checkpoint %s: %s", self._local.path(step_dir(step)), exc)
            return None

    def _verify_local(self, folder: str, manifest: Manifest, where: str) -> None:
        """verify_dir, skipped when this process verified the same unchanged files already.

        latest() then load() would otherwise hash every byte twice on the way to resuming.
        """
        stamp = _stamp(folder, manifest)
        if stamp is not None and self._verified_files.get(folder) == stamp:
            return
        verify_dir(folder, manifest, where=where)
        if stamp is not None:
            self._verified_files[folder] = stamp

    def _verified(
        self, step: int, local: Manifest | None, remote: Manifest | None
    ) -> CheckpointInfo | None:
        """Info for a checkpoint whose local copy matches its manifest (downloading if needed)."""
        name = step_dir(step)
        folder = self._local.path(name)
        remote_uri = f"{self.location}/{name}"
        if local is not None:
            where = folder
            try:
                self._verify_local(folder, local, where)
                uri = remote_uri if remote == local else where
                return CheckpointInfo(step, uri, local.metric, local.created, folder)
            except CorruptCheckpointError as exc:
                log.warning("skipping checkpoint %s: %s; trying an earlier one", where, exc)
        if remote is not None and self._remote is not None:
            remote_storage = self._remote
            try:
                self._retry.call(
                    lambda: download_checkpoint(remote_storage, name, remote, folder),
                    f"download {remote_uri}",
                )
                return CheckpointInfo(step, remote_uri, remote.metric, remote.created, folder)
            except CorruptCheckpointError as exc:
                log.warning("skipping checkpoint %s: %s; trying an earlier one", remote_uri, exc)
        return None


def _stamp(folder: str, manifest: Manifest) -> tuple[object, ...] | None:
    """What identifies a verified folder's files: the manifest and each file's size and mtime."""
    try:
        stats = [os.stat(os.path.join(folder, entry.name)) for entry in manifest.files]
    except OSError:
        return None
    return (manifest, *((st.st_size, st.st_mtime_ns, st.st_ino) for st in stats))
