"""A sweep's say over a run: after each evaluation, the worker that started the run is asked
whether it goes on (`thrifty sweep`'s pruners, `thrifty.sweep.pruning`).

The worker passes the run two pipes and names them in THRIFTY_JUDGE_FDS ("READ,WRITE", the
run's ends). After an evaluation past step 0 the run writes one JSON line,
`{"step": S, "value": V, "end": E}` (E: the step its budget ends at, or null), and waits for
one line back: "go", "prune", or "pause" (the run saves a checkpoint and ends as after a
preemption, exit 75, to be resumed once the rest of its Hyperband bracket has caught up:
`thrifty.sweeps.hyperband`). A worker that is gone (the pipe at its end) means "go": the run
is tethered to it and ends with it anyway.

One process only: a distributed run would need every rank to agree, and a sweep's trials run as
one process each, so in a run of several processes the judge is not consulted.
"""

from __future__ import annotations

import json
import os

ENV = "THRIFTY_JUDGE_FDS"
GO, PRUNE, PAUSE = "go", "prune", "pause"


class Judge:
    """The run's end of the two pipes (`read_fd`, `write_fd`)."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd
        self.gone = False

    def verdict(self, step: int, value: float, end: int | None) -> str:
        """Ask whether the run goes on: GO, PRUNE or PAUSE."""
        if self.gone:
            return GO
        line = json.dumps({"step": step, "value": value, "end": end}) + "\n"
        try:
            os.write(self.write_fd, line.encode())
            answer = _read_line(self.read_fd)
        except OSError:
            answer = ""
        if not answer:
            self.gone = True
            return GO
        word = answer.strip()
        return word if word in (PRUNE, PAUSE) else GO


def _read_line(fd: int) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


def from_environment(world_size: int) -> Judge | None:
    """The judge THRIFTY_JUDGE_FDS names, or None (not a sweep's trial, or several processes)."""
    value = os.environ.get(ENV)
    if not value or world_size > 1:
        return None
    read, _, write = value.partition(",")
    try:
        return Judge(int(read), int(write))
    except ValueError:
        return None
