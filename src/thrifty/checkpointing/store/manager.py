"""Spot-safe checkpoints: asynchronous save, atomic publish, verified resume, bounded retention.

`save()` blocks training only while the state is copied to host memory. A background thread
then writes the checkpoint to local disk (temporary name, fsync, rename; manifest last) and
deletes old checkpoints (manifest first, and only once a newer one is published). When the
location is remote, a second thread uploads (files first, manifest last; see `upload.py`), so a
slow or absent bucket never holds up the next save. A SIGKILL at any of those moments leaves
either a folder with no manifest, which readers ignore, or a complete checkpoint.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from thrifty.checkpointing.store.errors import CheckpointError
from thrifty.checkpointing.store.finding import CheckpointFinder, CheckpointInfo
from thrifty.checkpointing.store.manifest import MANIFEST, Manifest, clean_metric, scan, step_dir
from thrifty.checkpointing.store.probe import probe_storage
from thrifty.checkpointing.store.retention import SAVE_NAMES, checkpoints_to_keep, purge
from thrifty.checkpointing.store.retry import RetryPolicy
from thrifty.checkpointing.store.snapshot import HostBuffers, copy_to_host
from thrifty.checkpointing.store.storage import (
    LocalStorage,
    Storage,
    is_remote,
    local_error,
    open_storage,
    redact,
)
from thrifty.checkpointing.store.upload import Uploader
from thrifty.checkpointing.store.writing import write_checkpoint
from thrifty.errors import ConfigError

log = logging.getLogger("thrifty.checkpointing.store")


class CheckpointManager:
    """Save, find and load checkpoints at `location`: a local directory or an fsspec URL.

    With a URL, `local_dir` is required: checkpoints are written there first and uploaded in the
    background, and a local copy is kept until its upload is confirmed. With a local `location`,
    `local_dir` is ignored. Transient storage errors are retried with exponential backoff from
    `retry_backoff` seconds: an upload until `upload_deadline` seconds have passed, a read or a
    listing `upload_retries` times. When an upload gives up the checkpoint stays local, training
    goes on, and the next save uploads it. Call it from one thread only.
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
        upload_deadline: float = 90.0,
    ) -> None:
        _check_settings(keep_last, upload_retries, retry_backoff, upload_deadline)
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
        self.upload_deadline = upload_deadline
        self.last_stall_seconds = 0.0
        self.last_save_seconds = 0.0
        self._buffers = HostBuffers()
        # Held for every change to local_dir: the write job, latest(), load(), upload purges.
        self._io_lock = threading.RLock()
        self._uploader: Uploader | None = None
        if self._remote is not None:
            self._uploader = Uploader(
                self._local,
                self._remote,
                keep=self._keep,
                retry=self._retry,
                deadline=upload_deadline,
                lock=self._io_lock,
            )
        self._newest_written: int | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._wake = threading.Condition()
        self._job: Callable[[], None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._closed = False
        self._finder = CheckpointFinder(  # the resume side: latest(), load()
            self._local,
            self._remote,
            self.location,
            self._retry,
            self._storage_options,
            self._io_lock,
        )

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
        record: dict[str, Any] | None = None,
    ) -> None:
        """Copy `state` to host memory and write it in the background; return at once after.

        Waits first for the previous save's local write (raising its error if it failed
        permanently), never for an upload. The caller is blocked only for that wait and the
        copy: `last_stall_seconds` (seconds).
        `metric` ranks checkpoints for keep_best (lower is better; NaN is not ranked).
        `extra_files` are files already written into `begin(step)`'s folder (sharded
        checkpoints): they are hashed into the manifest and uploaded with the state. `record`
        (plain values) is written into the manifest.
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
        self._submit(lambda: self._save_job(step, host_state, metric, start, extra, record))

    def begin(self, step: int) -> str:
        """The local folder for step `step`, emptied and unpublished, for files written into it
        before `save(step, ..., extra_files=...)`; waits for the save in flight first."""
        self._check_step(step)
        self._idle.wait()
        self._raise_pending()
        name = step_dir(step)
        folder = self._local.path(name)
        with self._io_lock:
            self._check_ours(step)
            try:
                self._local.delete(f"{name}/{MANIFEST}")  # stop trusting an old copy first
                self._local.delete(name)
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise local_error(exc, f"prepare checkpoint step {step}", folder) from exc
        return folder

    def _check_ours(self, step: int) -> None:
        """Refuse to write into (and so later delete) a folder named like step `step`'s save
        that holds anything a save does not write: it is someone else's."""
        name = step_dir(step)
        foreign = [n for n in self._local.list(name) if n not in SAVE_NAMES]
        if foreign:
            raise CheckpointError(
                f"{self._local.path(name)} holds {', '.join(foreign[:3])}, which thrifty did "
                "not write: it never writes into or deletes that folder; move it away"
            )

    def _check_step(self, step: int) -> None:
        if self._closed:
            raise CheckpointError(f"the checkpoint manager for {self.location} is closed")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise CheckpointError(f"checkpoint step must be a non-negative integer, got {step!r}")

    def wait(self, timeout: float | None = None, *, uploads: bool = True) -> bool:
        """Wait up to `timeout` seconds for the save in flight and (with `uploads`) its upload;
        True when done.

        Raises the background save's error if it failed permanently. An upload that gave up on
        an unreachable location is not an error: see `pending_uploads` and `upload_status()`.
        """
        until = None if timeout is None else time.monotonic() + timeout
        done = self._idle.wait(timeout)
        if done and uploads and self._uploader is not None:
            done = self._uploader.wait(None if until is None else until - time.monotonic())
        if done:
            self._raise_pending()
        return done

    def close(self, timeout: float | None = None) -> bool:
        """Wait for the save in flight, then up to `timeout` seconds (default: upload_deadline)
        for its upload, and stop the background threads.

        The local write is waited for without a limit: it only touches local disk, and cutting
        it short would lose the newest checkpoint. Returns False if the upload was still going;
        the checkpoint then stays in local_dir (see `upload_status()`).
        """
        self._idle.wait()
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._buffers = HostBuffers()  # give back the host copy of the state
        done = True
        if self._uploader is not None:
            done = self._uploader.wait(self.upload_deadline if timeout is None else timeout)
            self._uploader.close()
        self._raise_pending()
        return done

    @property
    def pending_uploads(self) -> list[int]:
        """Steps kept in local_dir because their upload is not confirmed yet.

        No I/O: safe to read on the way out of a preempted run. Always empty for a local location.
        """
        return [] if self._uploader is None else self._uploader.pending

    @property
    def newest_written(self) -> int | None:
        """The step of the newest checkpoint this manager has published on local disk (a save
        still being written in the background is not); None before any."""
        return self._newest_written

    def upload_status(self) -> dict[str, Any]:
        """Where the newest checkpoint this manager knows of is. No I/O.

        `newest_step` (None before any save), `uploaded` (True once it is at `location`; always
        for a local location), `local_path` (its folder on this machine), `location`, and
        `error`: why it is not uploaded (None when it is).
        """
        if self._uploader is not None:
            return self._uploader.status()
        newest = self._newest_written
        return {
            "newest_step": newest,
            "uploaded": True,
            "local_path": None if newest is None else self._local.path(step_dir(newest)),
            "location": self.location,
            "error": None,
        }

    def probe(self) -> None:
        """Write, read back and delete a small file at the location (and in local_dir).

        Call it before training so that a read-only directory, a path that is a file, a wrong
        bucket, missing credentials or an unreachable endpoint fail at once, in one line naming
        the location and the fix, rather than at the first checkpoint.
        """
        local_key = "checkpoint.local_dir" if self._remote is not None else "checkpoint.location"
        probe_storage(self._local, local_key, self._retry)
        if self._remote is not None:
            probe_storage(self._remote, "checkpoint.location", self._retry)

    # --- resume (see finding.py) -------------------------------------------------------------

    def has_checkpoints(self, *, local: bool = True) -> bool:
        """True when a checkpoint folder with a manifest is at the location or (with `local`,
        for a URL) in local_dir, whether or not it verifies (reads manifests only; no hashing,
        no download)."""
        return self._finder.has_checkpoints(local=local)

    def latest(self, before: int | None = None) -> CheckpointInfo | None:
        """The newest checkpoint that verifies (below step `before` when given); None when there
        is none at all, NoValidCheckpointError when some exist but none verifies."""
        return self._finder.latest(before)

    def load(self, ref: CheckpointInfo | str) -> dict[str, Any]:
        """Load a checkpoint (a CheckpointInfo, or one folder's path or URL) onto the CPU after
        checking it against its manifest; never executes code from the file."""
        return self._finder.load(ref)

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
        if error is None and self._uploader is not None:
            error = self._uploader.take_failure()
        if error is not None:
            raise error

    def _save_job(
        self,
        step: int,
        state: Any,
        metric: float | None,
        start: float,
        extra: tuple[str, ...],
        record: dict[str, Any] | None = None,
    ) -> None:
        self._check_ours(step)
        write_checkpoint(self._local, step, state, metric, extra, record)
        del state
        self._newest_written = step
        log.info("checkpoint step %d written to %s", step, self.local_dir)
        if self._uploader is not None:
            self._uploader.staged()
        else:
            listing = scan(self._local)
            purge(self._local, listing.published, self._keep(listing.published), listing.orphans)
        # Until the checkpoint is on local disk: an upload no longer holds up the next save.
        self.last_save_seconds = time.perf_counter() - start

    def _keep(self, published: Mapping[int, Manifest]) -> set[int]:
        metrics = {step: manifest.metric for step, manifest in published.items()}
        return checkpoints_to_keep(metrics, keep_last=self.keep_last, keep_best=self.keep_best)


def _check_settings(
    keep_last: int, upload_retries: int, retry_backoff: float, upload_deadline: float
) -> None:
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 2:
        raise ConfigError(
            f"checkpoint.keep_last must be an integer of at least 2, got {keep_last!r}: "
            "with one checkpoint a corrupt newest one leaves nothing to resume from"
        )
    if upload_retries < 0 or retry_backoff < 0 or upload_deadline < 0:
        raise ConfigError(
            "checkpoint.upload_retries, checkpoint.retry_backoff and checkpoint.upload_deadline "
            f"must be >= 0, got {upload_retries!r}, {retry_backoff!r} and {upload_deadline!r}"
        )
