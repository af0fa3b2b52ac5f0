"""A sweep's Optuna study: where it is stored, what it was made from, and which trial is alive.

Storage. By default the study is a journal file in the sweep's folder, `DIR/study.journal`
(Optuna's `JournalStorage` over `JournalFileBackend`): every change is one appended record, taken
under a lock file, so several processes on one machine share it, and a process killed by
SIGKILL mid-write leaves at most a record that is not there yet (its lock is broken after a
grace period). SQLite would serve one process well, but several writing at once meet
"database is locked"; the journal is what Optuna advises for that. `--storage URL` (any URL
Optuna's RDBStorage takes: postgresql://, mysql://) shares one study between machines.

Identity. The study keeps, as user attributes, the fingerprint of the config and the space it
was made from; a run of the sweep with a different one is refused (one line), never mixed in.

Liveness. A trial being run holds a lease in the study (`thrifty.lease`: host, pid, process
start time, and an expiry its worker renews every few seconds). A RUNNING trial whose lease
has expired, or whose process is gone from this very machine, was orphaned (its worker
preempted or SIGKILLed): `requeue_orphans` puts it back in the queue (WAITING), and the next
`ask` of any worker takes it up again with the parameters it had and resumes its run from its
own checkpoint. Optuna's own heartbeat would mark such a trial FAILED, and exists for RDB
storages only; the lease works on every storage, and the trial's run lock
(`thrifty.rundir.lock`) still keeps two processes off one run directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thrifty.errors import ConfigError, ThriftyError
from thrifty.redact import redact_known, url_secrets

if TYPE_CHECKING:
    import optuna

JOURNAL = "study.journal"
LEASE_KEY = "thrifty.lease"
LEASE_SECONDS = 60.0  # a worker renews every LEASE_SECONDS / 6
FINGERPRINT_KEY = "thrifty.fingerprint"
PAUSED_KEY = (
    "thrifty.paused"  # the rung a Hyperband trial waits at (thrifty.search.sweep.hyperband)
)


def fingerprint(config: Mapping[str, Any], space: str) -> str:
    """What a sweep is made from, as a short hash: the base config (overrides applied) and the
    space."""
    text = json.dumps({"config": config, "space": space}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def open_storage(out: Path, url: str | None) -> Any:
    """The study's storage: the journal file in `out`, or the database at `url`. A database that
    cannot be reached is one line (the URL without its password)."""
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    if url is None:
        return JournalStorage(JournalFileBackend(str(out / JOURNAL)))
    secrets = url_secrets(url)  # a password may hold what no pattern can tell from text
    _check_sqlite_file(url)
    try:
        return _rdb_storage(url)
    except ImportError as exc:
        raise ThriftyError(
            f"--storage {redact_known(url, secrets)}: its driver is not installed "
            f"({redact_known(str(exc), secrets)}); for PostgreSQL "
            "pip install 'thrifty[postgres]'"
        ) from None
    except Exception as exc:  # sqlalchemy's errors: the server is down, refused, unknown
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ThriftyError(
            f"--storage {redact_known(url, secrets)}: cannot open the study's database: "
            f"{redact_known(first, secrets)}; check that the server is up and the URL is right"
        ) from None


# Optuna's own tables (and Alembic's record of their version): a SQLite file holding any other
# is someone else's database, which a study must not add its tables to.
OPTUNA_TABLES = frozenset(
    {
        "studies",
        "study_directions",
        "study_system_attributes",
        "study_user_attributes",
        "trial_heartbeats",
        "trial_intermediate_values",
        "trial_params",
        "trial_system_attributes",
        "trial_user_attributes",
        "trial_values",
        "trials",
        "version_info",
        "alembic_version",
    }
)


def _check_sqlite_file(url: str) -> None:
    """`--storage sqlite:///PATH` names a new file, an empty one, or an Optuna study's
    database: a file holding other tables (the user's own data) or no SQLite database at all
    is refused before Optuna creates a table in it. The file is opened read-only."""
    import sqlite3

    try:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
    except Exception:  # not a URL sqlalchemy reads: Optuna's own error says so
        return
    path = parsed.database
    if parsed.get_backend_name() != "sqlite" or not path or path == ":memory:":
        return
    file = Path(path)
    if not file.exists() or (file.is_file() and file.stat().st_size == 0):
        return
    fix = "give a new file (or a study's database) to --storage"
    if not file.is_file():
        raise ThriftyError(f"--storage {url}: {path} is not a regular file; {fix}")
    try:
        with open(file, "rb") as f:
            header = f.read(16)
        if header != b"SQLite format 3\x00":
            raise sqlite3.DatabaseError("file is not a database")
        reader = sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)
        try:
            names = {
                r[0] for r in reader.execute("SELECT name FROM sqlite_master WHERE type='table'")
            }
        finally:
            reader.close()
    except (OSError, sqlite3.Error) as exc:
        raise ThriftyError(
            f"--storage {url}: {path} is not a SQLite database ({exc}); {fix}"
        ) from None
    others = sorted(n for n in names if n not in OPTUNA_TABLES and not n.startswith("sqlite_"))
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise ThriftyError(
            f"--storage {url}: {path} is another database (it holds the table "
            f"{others[0]!r}{more}, which is not an Optuna study's): a sweep never adds its "
            f"tables to it; {fix}"
        )


def _rdb_storage(url: str) -> Any:
    """Optuna's RDB storage at `url`. Machines that open a new database at once race to
    create its tables: the loser's "already exists" is tried again, after the winner's."""
    import optuna

    for attempt in range(4):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=_engine_options(url))
        except ImportError:
            raise
        except Exception as exc:
            text = str(exc).lower()
            if attempt == 3 or not any(
                w in text for w in ("duplicate", "already exists", "unique")
            ):
                raise
            time.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


def _engine_options(url: str) -> dict[str, Any]:
    """A server that does not answer fails in seconds, not after the system's TCP timeout; a
    connection the server dropped (it restarted) is found and replaced before it is used."""
    if url.startswith(("postgresql", "postgres")):
        return {"connect_args": {"connect_timeout": 10}, "pool_pre_ping": True}
    return {}


def load_or_create(storage: Any, name: str, print_: str, pruner: Any) -> optuna.Study:
    """The study `name` in `storage`, created on first use; `print_` is its fingerprint, and a
    study made from another config or space is refused."""
    import optuna

    for attempt in range(3):  # several machines creating one study's tables at once may clash
        try:
            study = optuna.create_study(
                storage=storage,
                study_name=name,
                direction="minimize",
                pruner=pruner,
                load_if_exists=True,
            )
            break
        except optuna.exceptions.DuplicatedStudyError:
            time.sleep(1.0 + attempt)
    else:
        study = optuna.load_study(study_name=name, storage=storage, pruner=pruner)
    known = study.user_attrs.get(FINGERPRINT_KEY)
    if known is None:
        study.set_user_attr(FINGERPRINT_KEY, print_)
    elif known != print_:
        raise ConfigError(
            f"the sweep {name!r} was made from a different config or space (fingerprint "
            f"{known}, now {print_}): give a new --out (or --study), or undo the change"
        )
    return study


def storage_trouble(exc: BaseException) -> str:
    """What went wrong with the study's storage, in a few words: "the study's database is
    unreachable" for a connection that failed or was lost (not the driver's words, nor
    Optuna's "invalid data in the commit" that a lost connection brings with it), else the
    error's type and first line, credentials removed."""
    from thrifty.redact import redact_text

    seen: BaseException | None = exc
    for _ in range(8):  # the error and what it came from
        if seen is None:
            break
        name = type(seen).__name__
        text = str(seen).lower()
        if name in ("OperationalError", "InterfaceError", "DisconnectionError") or any(
            w in text for w in ("connection", "could not connect", "server closed", "terminating")
        ):
            return "the study's database is unreachable"
        seen = seen.__cause__ or seen.__context__
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = redact_text(first)
    return (
        f"the study's storage failed ({type(exc).__name__}: {text})"
        if text
        else (f"the study's storage failed ({type(exc).__name__})")
    )


# --- leases --------------------------------------------------------------------------------


def _start_time(pid: int) -> str | None:
    """The process's start time (Linux: /proc/PID/stat field 22), to tell a reused pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def lease(since: float, seconds: float = LEASE_SECONDS) -> dict[str, Any]:
    """A lease held by this process until `seconds` from now, for a session of a trial that
    began at `since` (wall time): what a worker that dies without a word still leaves of the
    trial's time (`orphan_seconds`)."""
    pid = os.getpid()
    now = time.time()
    return {
        "host": socket.gethostname(),
        "pid": pid,
        "started": _start_time(pid),
        "since": since,
        "renewed": now,
        "until": now + seconds,
    }


def orphan_seconds(held: Mapping[str, Any] | None) -> float:
    """The seconds an orphaned trial's last session ran, as far as its lease saw."""
    if not isinstance(held, Mapping):
        return 0.0
    try:
        return max(0.0, float(held["renewed"]) - float(held["since"]))
    except (KeyError, TypeError, ValueError):
        return 0.0


def lease_expired(held: Mapping[str, Any] | None, now: float | None = None) -> bool:
    """Whether a trial's lease no longer holds: past its expiry, or its process is gone from
    this machine (a SIGKILLed worker is seen at once here, and elsewhere once it expires)."""
    if not isinstance(held, Mapping):
        return True
    now = time.time() if now is None else now
    if now > float(held.get("until", 0)):
        return True
    if held.get("host") != socket.gethostname():
        return False
    pid = held.get("pid")
    if not isinstance(pid, int):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return held.get("started") is not None and _start_time(pid) != held.get("started")


def requeue_orphans(study: optuna.Study, seconds_key: str) -> list[int]:
    """Put every RUNNING trial whose lease no longer holds back in the queue (WAITING), its
    last session's seconds added to `seconds_key`; the numbers of those requeued. A trial just
    asked for, whose lease is not written yet, is left alone for a lease's length."""
    from optuna.trial import TrialState

    requeued = []
    now = time.time()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if isinstance(trial.user_attrs.get(PAUSED_KEY), int):
            continue  # saved and ended at a Hyperband rung: released by its bracket, not here
        held = trial.user_attrs.get(LEASE_KEY)
        if held is None:
            started = trial.datetime_start.timestamp() if trial.datetime_start else 0.0
            if now - started < LEASE_SECONDS:
                continue
        elif not lease_expired(held, now):
            continue
        storage = study._storage
        before = float(trial.user_attrs.get(seconds_key, 0.0))
        storage.set_trial_user_attr(trial._trial_id, seconds_key, before + orphan_seconds(held))
        storage.set_trial_user_attr(trial._trial_id, LEASE_KEY, None)
        storage.set_trial_state_values(trial._trial_id, TrialState.WAITING)
        requeued.append(trial.number)
    return requeued
