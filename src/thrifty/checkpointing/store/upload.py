"""Publishing staged checkpoints at a remote location, on a thread of its own.

A slow or absent bucket must never hold up training, so a save waits only for its local write
and the upload goes on here. Saves staged while an upload is running are not queued one by one:
the next pass uploads the newest first and skips what retention would drop anyway. Transient
errors are retried until `deadline` seconds after the pass began, whatever their count (s3fs
and botocore retry underneath, so counts multiply); past it the pass ends with a warning naming
the location and the fix, the local copy stays, and the next save tries again.

The local staging folder is shared with the writer: every change to it happens under `lock`,
which this thread never holds across a network call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from thrifty.checkpointing.store.errors import CheckpointError, TransientStorageError
from thrifty.checkpointing.store.manifest import MANIFEST, Manifest, read_published, scan, step_dir
from thrifty.checkpointing.store.retention import purge
from thrifty.checkpointing.store.retry import RetryPolicy
from thrifty.checkpointing.store.storage import LocalStorage, Storage, redact

log = logging.getLogger("thrifty.checkpointing.store")


class _Changed(Exception):
    """The local checkpoint being uploaded was rewritten or removed: start the pass over."""


class Uploader:
    """Uploads what is staged in `local` to `remote`, newest first; see the module docstring.

    `keep(published)` is the retention rule (steps to keep). `deadline` is in seconds.
    """

    def __init__(
        self,
        local: LocalStorage,
        remote: Storage,
        *,
        keep: Callable[[Mapping[int, Manifest]], set[int]],
        retry: RetryPolicy,
        deadline: float,
        lock: threading.RLock,
    ) -> None:
        self._local = local
        self._remote = remote
        self.location = redact(remote.uri)
        self._keep = keep
        self._retry = retry
        self.deadline = deadline
        self._lock = lock
        self._wake = threading.Condition()
        self._idle = threading.Event()
        self._idle.set()
        self._closing = threading.Event()
        self._staged_since_pass = False
        self._thread: threading.Thread | None = None
        # Replaced, never mutated, so that readers without the lock see a consistent dict.
        self._confirmed: dict[int, Manifest] = {}  # the remote's checkpoints, as last seen
        self._staged: dict[int, Manifest] = {}  # the local staging folder's, after its purge
        self._uploading: int | None = None
        self.error: str | None = None  # why the last pass did not finish
        self._failure: CheckpointError | None = None  # permanent: raised by the manager

    # --- the writer's side ---------------------------------------------------------------------

    def staged(self) -> None:
        """A checkpoint was written to the staging folder: trim the folder, start a pass."""
        self.purge_local()
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="thrifty-upload", daemon=True)
            self._thread.start()
        with self._wake:
            self._staged_since_pass = True
            self._idle.clear()
            self._wake.notify()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait up to `timeout` seconds for the upload passes to end; True when none is left."""
        return self._idle.wait(timeout)

    def close(self) -> None:
        """Stop: a retry in progress gives up at once, a call in flight ends on its own."""
        with self._wake:
            self._closing.set()
            self._wake.notify()

    def take_failure(self) -> CheckpointError | None:
        failure, self._failure = self._failure, None
        return failure

    @property
    def pending(self) -> list[int]:
        """Steps in the staging folder whose upload is not confirmed. No I/O."""
        confirmed = self._confirmed
        return sorted(s for s, m in self._staged.items() if confirmed.get(s) != m)

    def status(self) -> dict[str, Any]:
        """The newest staged checkpoint and whether it is at the remote location. No I/O."""
        staged, confirmed = self._staged, self._confirmed
        newest = max(staged, default=None)
        uploaded = newest is not None and confirmed.get(newest) == staged[newest]
        return {
            "newest_step": newest,
            "uploaded": uploaded,
            "local_path": None if newest is None else self._local.path(step_dir(newest)),
            "location": self.location,
            "error": None if uploaded else self.error,
        }

    def purge_local(self) -> None:
        """Trim the staging folder: keep its newest checkpoint (a restart here needs no
        download), the one being uploaded, and whatever retention keeps that is not uploaded."""
        with self._lock:
            listing = scan(self._local)
            local, confirmed = listing.published, self._confirmed
            newest = max(local, default=-1)
            unconfirmed = {s for s, m in local.items() if confirmed.get(s) != m}
            keep = {newest} | (unconfirmed & self._keep({**confirmed, **local}))
            if self._uploading is not None:
                keep.add(self._uploading)
            purge(self._local, local, keep, listing.orphans)
            self._staged = local

    # --- the upload thread ---------------------------------------------------------------------

    def _run(self) -> None:
        # A daemon thread: a process exiting after a bounded wait must not hang on an upload.
        while True:
            with self._wake:
                while not self._staged_since_pass and not self._closing.is_set():
                    self._wake.wait()
                if self._closing.is_set():
                    self._idle.set()
                    return
            self._pass()
            with self._wake:
                if not self._staged_since_pass:
                    self._idle.set()

    def _pass(self) -> None:
        """Upload until nothing new is staged, giving up `deadline` seconds after the start."""
        until = time.monotonic() + self.deadline
        while True:
            with self._wake:
                self._staged_since_pass = False
            try:
                self._sync(until)
                self.error = None
                return
            except _Changed:
                continue
            except TransientStorageError as exc:
                self._give_up(exc)
                return
            except CheckpointError as exc:  # access denied, no bucket: retrying will not help
                self.error, self._failure = str(exc), exc
                return

    def _give_up(self, exc: TransientStorageError) -> None:
        self.error = str(exc)
        if self._closing.is_set():
            return  # the caller reports it, with upload_status()
        pending = self.pending
        where = self._local.path(step_dir(pending[-1])) if pending else self._local.root
        log.warning(
            "upload to %s gave up after checkpoint.upload_deadline (%g s): %s; the local copy "
            "%s is kept and the next save tries again",
            self.location,
            self.deadline,
            exc,
            where,
        )

    def _sync(self, until: float) -> None:
        """Upload what retention keeps and the remote lacks, newest first; purge both sides."""
        call = partial(self._retry.call, until=until, stop=self._closing)
        local = scan(self._local).published
        listing = call(lambda: scan(self._remote), "list checkpoints")
        published = listing.published
        self._confirmed = dict(published)
        keep = self._keep({**published, **local})
        for step in sorted(local, reverse=True):
            if step in keep and published.get(step) != local[step]:
                self._upload(step, local[step], step in published, call)
                published[step] = local[step]
                self._confirmed = dict(published)
        kept = self._keep(published)
        # Forget first: a checkpoint half-deleted remotely must not count as uploaded.
        self._confirmed = {s: m for s, m in published.items() if s in kept}
        purge(self._remote, published, kept, listing.orphans, call)
        self._confirmed = dict(published)
        self.purge_local()

    def _upload(self, step: int, manifest: Manifest, replacing: bool, call: Any) -> None:
        """Files first, manifest last, so a reader never trusts a partial upload."""
        name = step_dir(step)
        self._check_unchanged(step, manifest, start=True)
        try:
            if replacing:
                self._confirmed = {s: m for s, m in self._confirmed.items() if s != step}
                call(partial(self._remote.delete, f"{name}/{MANIFEST}"), f"upload {name}")
            for entry in manifest.files:
                call(
                    partial(self._put, self._local.path(f"{name}/{entry.name}"), entry, name),
                    f"upload {name}/{entry.name}",
                )
        except CheckpointError:
            self._check_unchanged(step, manifest)  # a file that vanished: it was rewritten
            raise
        else:
            self._check_unchanged(step, manifest)
            call(
                partial(self._remote.write_bytes, f"{name}/{MANIFEST}", manifest.to_json()),
                f"upload {name}",
            )
        finally:
            self._uploading = None  # from now on the local purge decides
        log.info("checkpoint step %d uploaded to %s", step, self.location)

    def _put(self, source: str, entry: Any, name: str) -> None:
        target = f"{name}/{entry.name}"
        self._remote.upload(source, target)
        if self._remote.size(target) != entry.size:
            raise TransientStorageError(f"{self.location}/{target} has the wrong size after upload")

    def _check_unchanged(self, step: int, manifest: Manifest, *, start: bool = False) -> None:
        """Raise _Changed when the staged checkpoint is no longer the one being uploaded (the
        same step saved again); at the start, also mark it as being uploaded."""
        with self._lock:
            try:
                current = read_published(self._local, step)
            except CheckpointError:
                current = None
            if current != manifest:
                raise _Changed
            if start:
                self._uploading = step
