"""One writer per run: an exclusive lock on the run directory and the checkpoint location.

Two trainings writing into one run directory would interleave their metrics and overwrite each
other's checkpoints. `RunLock` stops the second one at once, with a message naming the first.

- A local directory gets `<dir>/.thrifty.lock`, held with `flock` on a descriptor kept open for
  the life of the run. The kernel drops the lock when the process dies, so a killed run never
  blocks the next one. The file records the holder (host, pid, start time, engine job) for the
  message.
- Where `flock` is unsupported (some network file systems), the file's existence is the lock
  (O_CREAT|O_EXCL), touched every ttl/4. It is stale when its holder is gone (`Holder.why_gone`:
  on this host, its process ended; on another, the engine relaunched its job), or when nobody
  touched it for a ttl. Stale locks are taken over with a warning.
- An object store location (s3://, gs://, ...) gets a lease object `<location>/.thrifty-lease.json`
  with an expiry, renewed every ttl/4 by a background thread (nothing per training step). It is
  taken over with a warning at once when its holder is gone, as above, else once it expired: a
  machine that died without notice blocks another job for at most a ttl (60 s by default).

A relaunch therefore resumes at once: the engine's next attempt of the same job, or a restart
on the same machine, takes over; only a different job waits for the lease to lapse.

Residual races, by design: object stores offer no compare-and-swap through fsspec, so a lease is
written, read back after `settle_seconds` and kept only if it is still ours. Two processes that
both find no lease, and whose writes land more than `settle_seconds` apart, can both proceed; the
loser notices at its next renewal and logs an error (`RunLock.lost`). Lease expiry compares wall
clocks, so hosts sharing a location need synchronized clocks (NTP). Two processes taking over the
same stale lock file in the same instant are resolved by an atomic rename, except on file systems
where rename is not atomic.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import threading
import time
from collections.abc import Mapping
from typing import Any, Protocol

from thrifty.errors import ThriftyError
from thrifty.rundir.holder import (
    LEASE_FILE,
    LOCK_FILE,
    Holder,
    RunInUseError,
    boot_id,
    pid_alive,
    process_start,
)

__all__ = [
    "DEFAULT_TTL_SECONDS",
    "LEASE_FILE",
    "LOCK_FILE",
    "Holder",
    "RunInUseError",
    "RunLock",
    "boot_id",
    "pid_alive",
    "process_start",
]

log = logging.getLogger("thrifty.rundir.lock")

# A lease lapses this long after its holder's last renewal: how long a machine that died without
# notice blocks another job (a relaunch of its own job takes over at once).
DEFAULT_TTL_SECONDS = 60.0
# Renewals per ttl: a renewal that fails (a bucket's hiccup) leaves two more before it lapses.
RENEWALS_PER_TTL = 4
SETTLE_SECONDS = 1.0
# A dead holder's forked children (data loader workers) keep its flock until they notice.
STALE_WAIT_SECONDS = 10.0
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")  # as checkpoint.storage.is_remote, unimported


class _Part(Protocol):
    """One place a RunLock holds: a local lock file or an object-store lease."""

    needs_renewal: bool
    lost: str | None

    def acquire(self) -> None: ...

    def renew(self) -> None: ...

    def release(self) -> None: ...


# --- local directories ---------------------------------------------------------------------------


def _read(path: str) -> tuple[bytes, float] | None:
    """The file's bytes and its age in seconds (by mtime), or None when it does not exist."""
    try:
        with open(path, "rb") as f:
            return f.read(), time.time() - os.fstat(f.fileno()).st_mtime
    except FileNotFoundError:
        return None


class _LocalLock:
    """`<directory>/.thrifty.lock`: flock where the file system has it, else exclusive create."""

    def __init__(self, directory: str, label: str, fix: str, holder: Holder, ttl: float) -> None:
        self.path = os.path.join(directory, LOCK_FILE)
        self.directory, self.label, self.fix = directory, label, fix
        self.holder, self.ttl = holder, ttl
        self.needs_renewal = False  # only the exclusive-create fallback is touched
        self.lost: str | None = None
        self._fd: int | None = None
        self._created = False  # the directory was made for the lock: removed with it if empty

    def acquire(self) -> None:
        from thrifty.checkpointing.store.probe import check_not_blocked

        key = "checkpoint.location" if self.label.startswith("checkpoint") else "run.out"
        check_not_blocked(self.directory, key)  # a file in the way: say which, and the fix
        self._created = not os.path.isdir(self.directory)
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as exc:
            raise ThriftyError(f"cannot create {self.label}: {exc.strerror}") from exc
        if not self._flock():
            self._exclusive_create()
            self.needs_renewal = True

    def refuse_if_held(self) -> None:
        """Raise RunInUseError when a live process holds the flock now; take nothing (a shared
        lock for an instant at most). A process that starts to take it meanwhile retries."""
        try:
            import fcntl

            fd = os.open(self.path, os.O_RDONLY)
        except (ImportError, OSError):  # no lock file (or no flock): acquire() decides
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder_on_disk()
            if holder is not None and not holder.gone():
                raise self.in_use(holder) from None
        except OSError:  # a file system without flock: the lock file's existence decides
            pass
        finally:
            os.close(fd)  # a shared lock taken here goes with it

    def in_use(self, holder: Holder | None) -> RunInUseError:
        who = holder.describe() if holder else "another process"
        return RunInUseError(f"{self.label} is in use by {who}: wait for it to end, or {self.fix}")

    def _open(self, flags: int) -> int:
        try:
            return os.open(self.path, flags, 0o644)
        except FileExistsError:
            raise
        except OSError as exc:
            raise ThriftyError(
                f"cannot create the lock file {self.path}: {exc.strerror}: make {self.label} "
                "writable or choose another"
            ) from exc

    def _holder_on_disk(self) -> Holder | None:
        found = _read(self.path)
        return Holder.parse(found[0]) if found else None

    def _flock(self) -> bool:
        """Take the flock; False when this file system does not support it."""
        try:
            import fcntl
        except ImportError:  # not a POSIX system
            return False
        deadline = time.monotonic() + STALE_WAIT_SECONDS
        while True:
            fd = self._open(os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = self._holder_on_disk()
                # A holder that is gone (or not yet written down) cannot hold it for long: its
                # forked children exit soon after it, a new holder writes its name at once.
                if (holder is None or holder.gone()) and time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                raise self._held_by(holder) from None
            except OSError as exc:
                os.close(fd)
                if exc.errno in _NO_FLOCK:
                    return False
                raise ThriftyError(f"cannot lock {self.path}: {exc.strerror}") from exc
            if not self._still_the_file(fd):  # its holder removed it between our open and flock
                os.close(fd)
                continue
            previous = self._holder_on_disk()
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, self.holder.to_bytes(), 0)
                os.fsync(fd)
            except OSError as exc:  # a full disk: the holder's name cannot be written down
                os.close(fd)
                raise ThriftyError(
                    f"cannot write the lock file {self.path}: {exc.strerror}: free space on "
                    f"the disk holding {self.label}, or choose another"
                ) from exc
            self._fd = fd
            if previous is not None:  # its holder died without releasing it
                log.warning(
                    "took over the lock on %s from %s, which ended", self.label, previous.describe()
                )
            return True

    def _held_by(self, holder: Holder | None) -> RunInUseError:
        if holder is not None and holder.gone():
            return RunInUseError(
                f"{self.label} is still locked by child processes of {holder.describe()}, "
                "which ended: stop those processes (e.g. its data loader workers), then start again"
            )
        return self.in_use(holder)

    def _still_the_file(self, fd: int) -> bool:
        try:
            return os.fstat(fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            return False

    def _exclusive_create(self) -> None:
        for _ in range(5):
            try:
                fd = self._open(os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                self._move_aside_if_stale()
                continue
            try:
                os.write(fd, self.holder.to_bytes())
                os.fsync(fd)
            finally:
                os.close(fd)
            return
        raise self.in_use(self._holder_on_disk())

    def _stale(self, holder: Holder | None, age: float) -> str | None:
        """Why the lock file is stale (for the warning), or None while its holder may live."""
        if holder is not None:
            why = self.holder.why_gone(holder)
            if why is not None or holder.host == self.holder.host:
                return why
        # Another host's holder touches it every ttl/4 while it lives.
        return f"untouched for {age:.0f} s" if age > self.ttl else None

    def _move_aside_if_stale(self) -> None:
        """Raise when the lock file is live; move a stale one out of the way."""
        found = _read(self.path)
        if found is None:
            return  # released meanwhile
        data, age = found
        holder = Holder.parse(data)
        why = self._stale(holder, age)
        if why is None:
            raise self.in_use(holder)
        # Renaming is atomic: of two processes taking over the same stale file, one moves it.
        aside = f"{self.path}.stale-{self.holder.token}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        with open(aside, "rb") as f:
            moved = f.read()
        if moved != data:  # a live lock taken since we looked: give it back
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            os.unlink(aside)
            raise self.in_use(Holder.parse(moved))
        os.unlink(aside)
        who = holder.describe() if holder else "an unknown process"
        log.warning("took over the stale lock on %s from %s, %s", self.label, who, why)

    def renew(self) -> None:
        found = _read(self.path)
        holder = Holder.parse(found[0]) if found else None
        if not self._is_mine(holder):
            self._lose(holder)
            return
        with contextlib.suppress(OSError):
            os.utime(self.path)

    def _is_mine(self, holder: Holder | None) -> bool:
        return holder is not None and holder.token == self.holder.token

    def _lose(self, holder: Holder | None) -> None:
        self.needs_renewal = False
        who = holder.describe() if holder else "nobody"
        self.lost = f"lost the lock on {self.label}: it is now held by {who}"
        log.error("%s; two runs may now write there", self.lost)

    def release(self) -> None:
        if self._fd is not None:
            # Remove while still holding it: a process that opened the old file sees, after its
            # flock, that the path no longer names it, and starts over.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
            os.close(self._fd)
            self._fd = None
        elif self.lost is None and self._is_mine(self._holder_on_disk()):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        if self._created:
            with contextlib.suppress(OSError):  # not empty: a save is in it
                os.rmdir(self.directory)


# --- the lock ------------------------------------------------------------------------------------


class RunLock:
    """Exclusive use of a run directory and, when given, its checkpoint location and `saves`,
    the local folder its saves are written to (a URL's staging folder, or the run directory's
    checkpoints/ folder, which another run could name as its location).

    Use as a context manager, or call `acquire()` and `release()`. `acquire` raises
    `RunInUseError` naming the holder when another live process has either one; `run_dir_fix`
    is the way out its message gives for a run directory in use. Leases and fallback lock files
    last `ttl_seconds` and are renewed every `renew_seconds` (a quarter of that) by a daemon
    thread, off the training's path; `lost` says so if another process took one over meanwhile
    (it is None while all is well).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        checkpoint_location: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        *,
        saves: str | os.PathLike[str] | None = None,
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        settle_seconds: float = SETTLE_SECONDS,
        run_dir_fix: str = "use another --out",
    ) -> None:
        if not ttl_seconds > 0:
            raise ThriftyError(f"the lock's ttl_seconds = {ttl_seconds} must be greater than 0")
        self.run_dir = os.path.abspath(os.fspath(run_dir))
        self.checkpoint_location = checkpoint_location
        self.storage_options = storage_options
        self.saves = os.path.abspath(os.path.expanduser(saves)) if saves is not None else None
        self.ttl_seconds = ttl_seconds
        self.settle_seconds = settle_seconds
        self.run_dir_fix = run_dir_fix
        self._parts: list[_Part] = []
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def renew_seconds(self) -> float:
        """Seconds between renewals of a lease or fallback lock file."""
        return self.ttl_seconds / RENEWALS_PER_TTL

    @property
    def held(self) -> bool:
        return bool(self._parts)

    @property
    def lost(self) -> str | None:
        """Why a part of the lock was lost to another process, or None."""
        return next((p.lost for p in self._parts if p.lost), None)

    def _run_dir_part(self, holder: Holder) -> _LocalLock:
        label = f"run directory {self.run_dir}"
        return _LocalLock(self.run_dir, label, self.run_dir_fix, holder, self.ttl_seconds)

    def _plan(self, holder: Holder) -> list[_Part]:
        parts: list[_Part] = [self._run_dir_part(holder)]
        location = self.checkpoint_location
        remote = location is not None and _URL.match(location) is not None
        folders: dict[str, str] = {}  # directory -> what it is, for the message
        if location is not None and not remote:
            folders[os.path.abspath(os.path.expanduser(location))] = "checkpoint location"
        if self.saves is not None:
            folders.setdefault(self.saves, "checkpoint folder")
        key = "checkpoint.local_dir" if remote else "checkpoint.location"
        for directory, what in folders.items():
            if directory != self.run_dir:
                label, fix = f"{what} {directory}", f"use another {key}"
                parts.append(_LocalLock(directory, label, fix, holder, self.ttl_seconds))
        if remote and location is not None:
            from thrifty.checkpointing.store.storage import open_storage, redact
            from thrifty.rundir.lease import Lease

            storage = open_storage(location, self.storage_options)
            parts.append(
                Lease(
                    storage,
                    f"checkpoint location {redact(location.rstrip('/'))}",
                    holder,
                    self.ttl_seconds,
                    self.settle_seconds,
                )
            )
        return parts

    def refuse_if_in_use(self) -> None:
        """Raise RunInUseError, as `acquire` would, when a live process holds the run directory
        now; take nothing. A command asks before it builds the model, which can take minutes and
        the device memory the running job needs; `acquire` still decides."""
        self._run_dir_part(Holder.me()).refuse_if_held()

    def acquire(self) -> RunLock:
        """Take every part of the lock, or none: raises RunInUseError naming the holder."""
        if self._parts:
            return self
        taken: list[_Part] = []
        try:
            for part in self._plan(Holder.me()):
                part.acquire()
                taken.append(part)
        except BaseException:
            for part in reversed(taken):
                with contextlib.suppress(Exception):
                    part.release()
            raise
        self._parts = taken
        if any(p.needs_renewal for p in taken):
            self._stop.clear()
            self._renewer = threading.Thread(
                target=self._renew_forever, name="thrifty-lock-renewal", daemon=True
            )
            self._renewer.start()
        return self

    def _renew_forever(self) -> None:
        while not self._stop.wait(self.renew_seconds):
            for part in self._parts:
                if part.needs_renewal:
                    part.renew()

    def release(self) -> None:
        """Give the lock up (a no-op when not held); never raises for a part already gone."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        parts, self._parts = self._parts, []
        for part in reversed(parts):
            try:
                part.release()
            except Exception as exc:  # the run is over: a lock left behind only goes stale
                log.warning("could not release the lock: %s", exc)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
