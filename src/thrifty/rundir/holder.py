"""Who holds a run lock: the process, the machine it runs on, and the engine job it belongs to.

A lock names its holder so that the next process can tell a live holder from one that is gone:

- on this machine for certain: a pid that no longer runs, or now belongs to another process (its
  start time differs), or ran before the last reboot;
- on another machine only through the engine that relaunches jobs. Slurm, SkyPilot and torchrun
  keep one job id across the attempts they relaunch; a holder of the same job but another
  attempt was replaced by its engine, so it is gone, although nobody saw it die.

Job ids, and what tells attempts apart (each engine's documented environment):

- SkyPilot sets `SKYPILOT_TASK_ID`, the same for every recovery of a managed job. It exports no
  recovery count, but a recovery runs on newly provisioned machines: the machine (host and boot
  id) tells its attempts apart.
- Slurm sets `SLURM_JOB_ID` (with `SLURM_CLUSTER_NAME`); a requeued job keeps its id and
  `SLURM_RESTART_COUNT` counts the requeues (unset before the first).
- torchrun sets `TORCHELASTIC_RUN_ID` (its `--rdzv-id`) and `TORCHELASTIC_RESTART_COUNT`, which
  grows with each restart of the worker group. Its default id, "none", names no job.

The outermost engine names the job; every restart count present (and the machine, under
SkyPilot) names the attempt.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone

from thrifty.errors import ThriftyError


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat from field 3 (the state) on; empty where there is no such file."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return []
    # Field 2 (the command) may hold spaces and parentheses: count fields after the last ")".
    return stat.rsplit(")", 1)[-1].split()


def process_start(pid: int) -> int | None:
    """When `pid` started, in clock ticks after boot (/proc/<pid>/stat field 22), or None.

    Together with the pid it names one process: a reused pid has another start time.
    """
    fields = _stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def boot_id() -> str | None:
    """This boot's random id (Linux), or None: a pid from before a reboot is gone."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def pid_alive(pid: int) -> bool:
    """True when a process with this pid exists on this host (whoever owns it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, and belongs to another user
        return True
    except OSError:
        return False
    return _stat_fields(pid)[:1] != ["Z"]  # a zombie has ended; only its exit status is left


def engine_job(environ: Mapping[str, str], host: str, boot: str | None) -> tuple[str, str] | None:
    """(the engine job this process is an attempt of, which attempt), or None outside one.

    `host` and `boot` name this machine: under SkyPilot they tell its recoveries apart.
    """
    job = None
    attempt = []
    if environ.get("SKYPILOT_TASK_ID"):
        job = f"SkyPilot task {environ['SKYPILOT_TASK_ID']}"
        attempt.append(f"machine {host}" + (f" boot {boot}" if boot else ""))
    if environ.get("SLURM_JOB_ID"):
        cluster = environ.get("SLURM_CLUSTER_NAME")
        job = job or f"Slurm job {environ['SLURM_JOB_ID']}" + (f" on {cluster}" if cluster else "")
        attempt.append(f"Slurm restart {environ.get('SLURM_RESTART_COUNT') or 0}")
    if "TORCHELASTIC_RUN_ID" in environ:
        run_id = environ["TORCHELASTIC_RUN_ID"]
        if run_id and run_id != "none":  # torchrun's default --rdzv-id: shared by unrelated jobs
            job = job or f"torchrun run {run_id}"
        attempt.append(f"torchrun restart {environ.get('TORCHELASTIC_RESTART_COUNT') or 0}")
    return None if job is None else (job, ", ".join(attempt))


@dataclass(frozen=True, slots=True)
class Holder:
    """The process that holds a lock: written into the lock file or lease object."""

    host: str
    pid: int
    started: str  # when it took the lock: ISO 8601, UTC
    token: str  # unique per RunLock: tells our own lease from another's
    process_start: int | None = None  # clock ticks after boot; None off Linux
    boot_id: str | None = None
    expires: float | None = None  # leases only: seconds since the epoch
    job: str | None = None  # the engine job it is an attempt of ("Slurm job 123"), if any
    attempt: str | None = None  # which attempt of that job ("Slurm restart 0")

    @classmethod
    def me(cls) -> Holder:
        pid, host, boot = os.getpid(), socket.gethostname(), boot_id()
        job, attempt = engine_job(os.environ, host, boot) or (None, None)
        return cls(
            host=host,
            pid=pid,
            started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            token=uuid.uuid4().hex,
            process_start=process_start(pid),
            boot_id=boot,
            job=job,
            attempt=attempt,
        )

    @classmethod
    def parse(cls, data: bytes) -> Holder | None:
        """The holder recorded in `data`, or None when it is empty or unreadable."""
        try:
            record = json.loads(data)
            holder = cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})
        except (ValueError, TypeError, AttributeError):
            return None
        return holder if isinstance(holder.pid, int) else None

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1) + "\n").encode()

    def describe(self) -> str:
        """'pid 1234 on host h since 2026-... (Slurm job 7)', noting when that is this process."""
        text = f"pid {self.pid} on host {self.host} since {self.started}"
        if self.job:
            text += f" ({self.job})"
        if self.host == socket.gethostname() and self.pid == os.getpid():
            text += " (this process: another run in it still holds the lock)"
        return text

    def gone(self) -> bool:
        """True when this holder ran on this host and no longer runs (False if unknowable)."""
        if self.host != socket.gethostname():
            return False
        now_boot = boot_id()
        if self.boot_id and now_boot and self.boot_id != now_boot:
            return True
        if not pid_alive(self.pid):
            return True
        started = process_start(self.pid)
        return None not in (started, self.process_start) and started != self.process_start

    def replaced(self, other: Holder) -> str | None:
        """Why `other`, a holder on another machine, is gone although it may not look it: it is
        an earlier attempt of this holder's engine job (relaunched by the engine); else None."""
        if self.job is None or other.job != self.job or other.attempt == self.attempt:
            return None
        return f"an earlier attempt of {self.job} ({other.attempt}; this is {self.attempt})"

    def why_gone(self, other: Holder) -> str | None:
        """Why this holder may take over `other`'s lock at once, or None: on this machine, when
        its process ended; on another, when it is an earlier attempt of this engine job."""
        if other.host == self.host:  # here a live process is certainly live
            return "which ended" if other.gone() else None
        return self.replaced(other)


LOCK_FILE = ".thrifty.lock"  # a run directory's lock file
LEASE_FILE = ".thrifty-lease.json"  # an object-store location's lease


class RunInUseError(ThriftyError):
    """Another process holds the run directory or checkpoint location; the message names it."""
