"""Child processes of a command (`thrifty chaos`, `thrifty scale`, `thrifty tune`), each with its
output in a log.

`launch` runs one to completion; `Child` starts one in its own process group, so that a SIGKILL
takes its data-loader workers too, and `Children` makes sure none outlives the command.

A child started with a `tether` (bytes: what it needs to start, a config with credentials in it)
reads it from its stdin with `tethered()`, and from then on ends with the command, however the
command ends: on Linux the kernel sends it SIGKILL when the thread that started it ends
(PR_SET_PDEATHSIG), and everywhere a thread of its own kills its process group once its stdin
(a pipe only the command holds open) reaches its end. The tether never touches the disk.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, TextIO

from thrifty.errors import ThriftyError
from thrifty.redact import redact_text

_RANK_PREFIX = re.compile(r"^\[[\w-]+\]:\s*")  # "[rank1]: ", "[default0]: "
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def launch(command: Sequence[str], env: Mapping[str, str], log: Path) -> int:
    """Run `command` to its end, stdout and stderr to `log`; its exit code. On Linux it ends
    with the command, however the command ends (SIGKILL too): the kernel sends it SIGKILL when
    the thread that started it ends."""
    with open(log, "w") as f:
        return subprocess.run(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=parent_death_signal(signal.SIGKILL),
        ).returncode


def parent_death_signal(signum: int) -> Callable[[], None] | None:
    """On Linux, a call that asks the kernel to send `signum` to the calling process when the
    thread that started it ends (PR_SET_PDEATHSIG, kept across exec): a child's `preexec_fn`,
    or a process's own. None elsewhere. libc is found here: after a fork the child only calls
    it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, int(signum), 0, 0, 0)  # 1: PR_SET_PDEATHSIG


def first_error_line(log: Path, start: int = 0) -> str:
    """The first error in a log (from byte `start`: one session's part of a log several
    append to): a `thrifty: error:` line or the last line of a traceback. With several
    processes the first is the cause; the others are ranks losing their peer. A log without
    one gives its last line."""
    lines = _lines(log, start)
    if lines is None:
        return "(no output)"
    found = _first_error(lines)
    return found or next((line for line in reversed(lines) if line), "(no output)")


def error_in(log: Path, start: int = 0) -> str | None:
    """The first error in a log from byte `start` (as `first_error_line`), None when it shows
    none."""
    return _first_error(_lines(log, start) or [])


def _lines(log: Path, start: int = 0) -> list[str] | None:
    try:
        with open(log, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return [_RANK_PREFIX.sub("", line).strip() for line in text.splitlines()]


def _first_error(lines: list[str]) -> str | None:
    for line in lines:
        if line.startswith("thrifty: error:") or _EXCEPTION.fullmatch(line):
            return line.removeprefix("thrifty: error: ")
    return next((line for line in lines if line.startswith("Fatal Python error:")), None)


class Child:
    """`command` in its own process group (a new session), its output to `log`. `label` names
    it in messages ("the reference run").

    `tether`: bytes sent on the child's stdin, a pipe kept open until the child ends (see
    `tethered`). `pass_fds`: descriptors the child inherits. `redact`: its output passes
    through `redact_text` on its way to the log, so that no credential it prints (a traceback
    quoting a URL) is written; a failed write to the log is kept in `write_error`. `append`:
    the log keeps what earlier sessions of the same work wrote (a sweep's trial resumed), this
    session's lines after a line that says so; `error_line` reads this session's only.
    """

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        label: str,
        *,
        tether: bytes | None = None,
        pass_fds: Sequence[int] = (),
        redact: bool = False,
        append: bool = False,
    ) -> None:
        self.label = label
        self.log = log
        self.write_error: OSError | None = None
        self._file: TextIO = open(log, "a" if append else "w")  # noqa: SIM115 (closed in wait())
        if self._file.tell():
            stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
            self._file.write(f"\n--- {label}: a new session, {stamp} ---\n")
            self._file.flush()
        self._start = self._file.tell()  # where this session's lines begin
        self._threads: list[threading.Thread] = []
        self.started_wall = time.time()
        self.started = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL if tether is None else subprocess.PIPE,
                stdout=subprocess.PIPE if redact else self._file,
                stderr=subprocess.STDOUT,
                env=dict(env),
                pass_fds=tuple(pass_fds),
                start_new_session=True,
            )
        except OSError as exc:
            self._file.close()
            raise ThriftyError(f"cannot start {command[0]}: {exc.strerror}") from exc
        if tether is not None:
            self._thread(_send, self.proc.stdin, tether)
        if redact:
            self._thread(self._pump, self.proc.stdout)

    def _thread(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _pump(self, source: IO[bytes]) -> None:
        """Copy the child's output to the log line by line, redacted; after a failed write
        (a full disk) keep reading, so that the child never blocks on a full pipe."""
        with source:
            for raw in iter(source.readline, b""):
                if self.write_error is not None or self._file.closed:
                    continue
                try:
                    self._write(redact_text(raw.decode(errors="replace")))
                except OSError as exc:
                    self.write_error = exc
                except ValueError:  # closed by wait() while a straggler still wrote
                    return

    def _write(self, text: str) -> None:
        """Write one line of the child's output (redacted) where it belongs: its log."""
        self._file.write(text)
        self._file.flush()

    @property
    def elapsed(self) -> float:
        """Seconds since it started."""
        return time.monotonic() - self.started

    def poll(self) -> int | None:
        return self.proc.poll()

    def kill(self) -> None:
        """SIGKILL the whole process group (data-loader workers too) and reap it."""
        if self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.wait(30)

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code; `subprocess.TimeoutExpired` after `timeout` seconds."""
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.returncode is not None:
                self._close()

    def _close(self) -> None:
        for thread in self._threads:
            thread.join(5)  # the log's last lines; a straggler holding the pipe is not waited for
        self._threads = []
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:  # the tether's last bytes found no reader
                pass
        if not self._file.closed:
            try:
                self._file.close()
            except OSError as exc:  # a full disk seen at the last flush
                self.write_error = self.write_error or exc

    @property
    def session_start(self) -> int:
        """Where this session's lines begin in the log (bytes)."""
        return self._start

    def error_line(self) -> str:
        """What its log says went wrong (its last line when it shows no error)."""
        return first_error_line(self.log, self._start)


def _send(pipe: IO[bytes], data: bytes) -> None:
    """The tether: its length on a line, then the bytes; the pipe stays open."""
    try:
        pipe.write(b"%d\n" % len(data) + data)
        pipe.flush()
    except (OSError, ValueError):  # the child ended (or was ended) before reading it
        pass


# Exit code of a tethered child whose command ended before the tether reached it.
EXIT_ORPHANED = 1


def tethered() -> bytes:
    """In a child started with `tether`: the bytes sent. From here on the child ends when the
    command that started it ends, even by SIGKILL: see the module's docstring."""
    # SIGKILL from the kernel when the parent *thread* ends: the command starts and waits for
    # its child from one thread, which outlives the child unless the whole command dies. The
    # stdin watch covers the moment before this call and other systems.
    ask = parent_death_signal(signal.SIGKILL)
    if ask is not None:
        ask()
    # The descriptor itself, not sys.stdin: a thread blocked in a buffered read holds a lock
    # that the interpreter's shutdown would wait for.
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(header) > 20:  # the command ended before it sent anything
            os._exit(EXIT_ORPHANED)
        header += byte
    size = int(header)
    data = b""
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            os._exit(EXIT_ORPHANED)
        data += chunk
    threading.Thread(target=_end_with_parent, daemon=True).start()
    return data


def _end_with_parent() -> None:
    """Wait for the end of stdin: the command is gone. Take this process group with it (the
    data-loader workers too)."""
    try:
        while os.read(0, 1 << 16):
            pass
    except OSError:
        pass
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class Children:
    """Every child started, so that none outlives the command, whatever happens."""

    def __init__(self) -> None:
        self.started: list[Child] = []

    def keep(self, child: Child) -> Child:
        """`child`, just started, kept so that `kill_all` reaches it:
        `children.keep(Child(command, env, log, label))`."""
        self.started.append(child)
        return child

    def kill_all(self) -> None:
        for child in self.started:
            if child.proc.returncode is None:
                child.kill()
