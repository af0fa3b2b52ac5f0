"""A throwaway PostgreSQL server on loopback for the tests that share an Optuna study through it.

The server's life, once per pytest process (each xdist worker starts its own):

1. The first test that asks for ``postgres_url`` (or ``postgres_db``) finds ``initdb`` and
   ``pg_ctl`` on PATH or under ``/usr/lib/postgresql/*/bin``. Where there are none, or the server
   cannot start, the test is skipped with one line saying why and how to install PostgreSQL.
2. ``initdb`` creates a cluster in a new temporary directory, with a random password for the
   superuser (``--pwfile``) and password (SCRAM) authentication for every connection. PostgreSQL
   refuses to run as root: as root, the cluster belongs to an unprivileged system user
   (``thrifty-pg``, created when missing) and every server command runs as that user.
3. ``pg_ctl -w start`` starts it listening on a free port of 127.0.0.1 only, with its Unix socket
   inside the temporary directory, so two servers side by side share nothing. Durability is off
   (``fsync``, ``synchronous_commit``, ``full_page_writes``): the data is thrown away anyway.
4. ``postgres_db`` gives each test a database of its own, created empty on this server and dropped
   after the test, open connections included.
5. At the end of the session, passed or failed, ``pg_ctl -m immediate stop`` stops the server
   (killing the postmaster if that does not) and the temporary directory is removed.

Every command runs under a timeout, so a server that does not come up skips its tests instead of
hanging them. Nothing here prints the password.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest

# The unprivileged system user that owns the cluster when the tests run as root.
SYSTEM_USER = "thrifty-pg"
# The superuser the URLs log in as, and the database `postgres_url` names.
DB_USER = "thrifty"
MAINTENANCE_DB = "postgres"
HOST = "127.0.0.1"
INSTALL_HINT = "apt-get install postgresql, or `make postgresql` as root"

# Seconds each server command may take before it is given up on (then killed).
INITDB_TIMEOUT = 60
START_TIMEOUT = 30
STOP_TIMEOUT = 15
COMMAND_TIMEOUT = 15
# Another process may take the port between our probe and the server binding it: a few tries.
START_ATTEMPTS = 3

# A throwaway server: no durability, small memory, quick to start and stop.
SERVER_SETTINGS = {
    "listen_addresses": f"'{HOST}'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "'32MB'",
    "max_connections": "100",
    "logging_collector": "off",
}


class ServerUnavailable(Exception):
    """PostgreSQL is missing or cannot start here: the tests that need it are skipped."""


@dataclass(frozen=True)
class PostgresServer:
    """A running server: where it listens and how to log in. `password` stays out of repr."""

    port: int
    user: str
    password: str

    def __repr__(self) -> str:
        return f"PostgresServer(host={HOST!r}, port={self.port}, user={self.user!r})"

    def url(self, database: str) -> str:
        """The SQLAlchemy URL (psycopg 3 driver) of `database` on this server."""
        return (
            f"postgresql+psycopg://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
            f"@{HOST}:{self.port}/{quote(database, safe='')}"
        )

    def conninfo(self, database: str) -> dict[str, object]:
        """psycopg.connect() keyword arguments for `database` on this server."""
        return {
            "host": HOST,
            "port": self.port,
            "user": self.user,
            "password": self.password,
            "dbname": database,
            "connect_timeout": COMMAND_TIMEOUT,
        }


def find_bin_dir() -> Path | None:
    """The directory holding both `initdb` and `pg_ctl` (newest major version first), if any."""
    candidates: list[Path] = []
    for name in ("initdb", "pg_ctl"):
        found = shutil.which(name)
        if found:
            candidates += [Path(found).parent, Path(found).resolve().parent]

    def major(path: str) -> int:
        match = re.search(r"/postgresql/(\d+)/bin$", path)
        return int(match.group(1)) if match else -1

    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=major)[::-1]]
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres")):
            return directory
    return None


def run(
    command: Sequence[str],
    *,
    timeout: float,
    cwd: Path,
    as_user: str | None,
    ok: Sequence[int] = (0,),
) -> str:
    """Runs `command` (as `as_user` when given), returning its output; raises ServerUnavailable
    with the last line it printed when it fails or outlives `timeout` (then its group is killed)."""
    argv = ["runuser", "-u", as_user, "--", *command] if as_user else list(command)
    # PG* variables (PGDATA, PGPORT, ...) of the caller's shell must not redirect these commands.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    try:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    except OSError as error:
        raise ServerUnavailable(f"cannot run {command[0]}: {error}") from error
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as error:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=5)
        raise ServerUnavailable(f"{Path(command[0]).name} took more than {timeout:g} s") from error
    if process.returncode not in ok:
        raise ServerUnavailable(f"{Path(command[0]).name} failed: {last_line(output)}")
    return output


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def first_fatal_line(log: str) -> str:
    """The line of a server log saying why it stopped: its first FATAL (or PANIC), else its last."""
    for line in log.splitlines():
        if "FATAL:" in line or "PANIC:" in line:
            return line.split(":  ", 1)[-1].strip()
    return last_line(log)


def ensure_system_user() -> str:
    """The unprivileged user that runs the server as root: created when missing. Two xdist
    workers may both try at once: a file lock orders them, and "already exists" is success."""
    with open(os.path.join(tempfile.gettempdir(), f"{SYSTEM_USER}-useradd.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(SYSTEM_USER).pw_name
        if shutil.which("useradd") is None or shutil.which("runuser") is None:
            raise ServerUnavailable("running as root, and useradd/runuser are missing")
        # Exit 9 ("already exists") means another process created it first: that is success.
        command = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
        run(
            [*command, SYSTEM_USER], timeout=COMMAND_TIMEOUT, cwd=Path("/"), as_user=None, ok=(0, 9)
        )
        try:
            return pwd.getpwnam(SYSTEM_USER).pw_name
        except KeyError:
            raise ServerUnavailable(f"useradd did not create user {SYSTEM_USER}") from None


def wait(timeout: int) -> list[str]:
    """pg_ctl's options to wait for the server, giving up a little before our own `timeout`."""
    return ["--wait", f"--timeout={timeout - 5}"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


def write_settings(data_dir: Path, port: int, socket_dir: Path) -> None:
    """Appends this start's settings to postgresql.conf (the last occurrence wins)."""
    settings = {**SERVER_SETTINGS, "port": str(port), "unix_socket_directories": f"'{socket_dir}'"}
    with open(data_dir / "postgresql.conf", "a") as conf:
        conf.write("\n# thrifty tests\n")
        conf.writelines(f"{key} = {value}\n" for key, value in settings.items())


@contextlib.contextmanager
def start_postgres_server() -> Iterator[PostgresServer]:
    """Starts a throwaway server, yields it, and stops and removes it however the block ends."""
    bin_dir = find_bin_dir()
    if bin_dir is None:
        raise ServerUnavailable(
            "PostgreSQL is not installed (no initdb/pg_ctl on PATH or under /usr/lib/postgresql)"
        )
    as_user = ensure_system_user() if os.geteuid() == 0 else None
    root = Path(tempfile.mkdtemp(prefix="thrifty-pg-"))
    data_dir, socket_dir = root / "data", root / "socket"
    log_file, pw_file = root / "server.log", root / "pwfile"
    pg_ctl = str(bin_dir / "pg_ctl")
    started = False
    try:
        socket_dir.mkdir(mode=0o700)
        password = secrets.token_urlsafe(24)
        pw_file.touch(mode=0o600)
        pw_file.write_text(password + "\n")
        if as_user is not None:
            owner = pwd.getpwnam(as_user)
            for path in (root, socket_dir, pw_file):
                os.chown(path, owner.pw_uid, owner.pw_gid)
        run(
            [
                str(bin_dir / "initdb"),
                f"--pgdata={data_dir}",
                f"--username={DB_USER}",
                f"--pwfile={pw_file}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            timeout=INITDB_TIMEOUT,
            cwd=root,
            as_user=as_user,
        )
        pw_file.unlink()
        for attempt in range(1, START_ATTEMPTS + 1):
            port = free_port()
            write_settings(data_dir, port, socket_dir)
            try:
                started = True  # from here on, a half-started server is stopped below
                run(
                    [
                        pg_ctl,
                        f"--pgdata={data_dir}",
                        f"--log={log_file}",
                        *wait(START_TIMEOUT),
                        "start",
                    ],
                    timeout=START_TIMEOUT,
                    cwd=root,
                    as_user=as_user,
                )
                break
            except ServerUnavailable as error:
                log = log_file.read_text(errors="replace") if log_file.exists() else ""
                if attempt == START_ATTEMPTS or "could not bind" not in log:
                    reason = first_fatal_line(log) if log.strip() else str(error)
                    raise ServerUnavailable(f"the server did not start: {reason}") from None
                stop(pg_ctl, data_dir, root, as_user)
                log_file.unlink(missing_ok=True)
        yield PostgresServer(port=port, user=DB_USER, password=password)
    finally:
        if started:
            stop(pg_ctl, data_dir, root, as_user)
        shutil.rmtree(root, ignore_errors=True)


def stop(pg_ctl: str, data_dir: Path, root: Path, as_user: str | None) -> None:
    """Stops the server at once; kills its postmaster if pg_ctl cannot. Never raises."""
    try:
        run(
            [pg_ctl, f"--pgdata={data_dir}", "--mode=immediate", *wait(STOP_TIMEOUT), "stop"],
            timeout=STOP_TIMEOUT,
            cwd=root,
            as_user=as_user,
        )
        return
    except ServerUnavailable:
        pass
    # pg_ctl failed (or there was no server). A postmaster still running for this data directory
    # (its command line names it, so a recycled pid is never hit) is killed; its children follow.
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        if str(data_dir).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """The running server of this pytest process (this xdist worker); skips where there is none."""
    try:
        with start_postgres_server() as server:
            yield server
    except ServerUnavailable as error:
        pytest.skip(f"no PostgreSQL server for this test: {error} (install: {INSTALL_HINT})")


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """postgresql+psycopg://thrifty:PASSWORD@127.0.0.1:PORT/postgres: the server's maintenance
    database, shared by every test of this process. Tests that write should take `postgres_db`."""
    return postgres_server.url(MAINTENANCE_DB)


@pytest.fixture
def postgres_db(postgres_server: PostgresServer, request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a new, empty database for this test alone, dropped after it (connections the
    test left open are closed by the drop)."""
    psycopg = pytest.importorskip("psycopg", reason="psycopg 3 is needed to create the database")
    from psycopg import sql

    server = postgres_server
    readable = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower()).strip("_")[:40]
    name = f"t_{readable}_{uuid.uuid4().hex[:8]}"
    maintenance = server.conninfo(MAINTENANCE_DB)
    with psycopg.connect(**maintenance, autocommit=True) as connection:
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield server.url(name)
    finally:
        with psycopg.connect(**maintenance, autocommit=True) as connection:
            connection.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
