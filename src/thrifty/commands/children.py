"""Child processes of a command (`thrifty chaos`, `thrifty scale`), each with its output in a log.

`launch` runs one to completion; `Child` starts one in its own process group, so that a SIGKILL
takes its data-loader workers too, and `Children` makes sure none outlives the command.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from thrifty.errors import ThriftyError

_RANK_PREFIX = re.compile(r"^\[[\w-]+\]:\s*")  # "[rank1]: ", "[default0]: "
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*")


def launch(command: Sequence[str], env: Mapping[str, str], log: Path) -> int:
    """Run `command` to its end, stdout and stderr to `log`; its exit code."""
    with open(log, "w") as f:
        return subprocess.run(
            list(command), stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env
        ).returncode


def first_error_line(log: Path) -> str:
    """The first error in a log: a `thrifty: error:` line or the last line of a traceback.
    With several processes the first is the cause; the others are ranks losing their peer."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no output)"
    lines = [_RANK_PREFIX.sub("", line).strip() for line in text.splitlines()]
    for line in lines:
        if line.startswith("thrifty: error:") or _EXCEPTION.fullmatch(line):
            return line.removeprefix("thrifty: error: ")
    return next((line for line in reversed(lines) if line), "(no output)")


class Child:
    """`command` in its own process group (a new session), its output to `log`. `label` names
    it in messages ("the reference run")."""

    def __init__(
        self, command: Sequence[str], env: Mapping[str, str], log: Path, label: str
    ) -> None:
        self.label = label
        self.log = log
        self._file: TextIO = open(log, "w")  # noqa: SIM115 (closed in wait())
        self.started_wall = time.time()
        self.started = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                list(command),
                stdin=subprocess.DEVNULL,
                stdout=self._file,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        except OSError as exc:
            self._file.close()
            raise ThriftyError(f"cannot start {command[0]}: {exc.strerror}") from exc

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
            if self.proc.returncode is not None and not self._file.closed:
                self._file.close()

    def error_line(self) -> str:
        """What its log says went wrong."""
        return first_error_line(self.log)


class Children:
    """Every child started, so that none outlives the command, whatever happens."""

    def __init__(self) -> None:
        self.started: list[Child] = []

    def start(self, command: Sequence[str], env: Mapping[str, str], log: Path, label: str) -> Child:
        child = Child(command, env, log, label)
        self.started.append(child)
        return child

    def kill_all(self) -> None:
        for child in self.started:
            if child.proc.returncode is None:
                child.kill()
