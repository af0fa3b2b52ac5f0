"""The search's end of a trial's pipes (`thrifty tune`, `thrifty sweep`): the one loop that
reads what a trial reports (`thrifty.callbacks.trial_report`, which describes the lines) and
answers its evaluations.

`TrialPipe` makes the pipes; the trial's process gets `argument()` on its command line and
`child_fds` to inherit. `serve` then reads the trial's lines until its process ends: `ready`
(when it was ready to train), `steps` (the steps it reported), and each evaluation handed to
`judge` for the word to answer. Between reads, every `POLL_SECONDS`, it calls `turn()`, where
the search does its own part (a deadline, a stop passed on): `turn()` returning True ends the
serving (the search has ended the trial).
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from thrifty.callbacks.trial_report import GO

POLL_SECONDS = 0.1


class Process(Protocol):
    """What `serve` needs of a trial: a process of its own (`thrifty.children.Child`) or a
    trial in a warm worker (`thrifty.search.engine.TrialSession`)."""

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass(frozen=True, slots=True)
class Evaluation:
    """An evaluation a trial reported: its validation loss `value` at `step`, and the step its
    budget ends at (`end`, None when the budget is not in steps)."""

    step: int
    value: float
    end: int | None = None


class TrialPipe:
    """The pipes of one trial: its reports, and with `answers` the answers to its
    evaluations. `ready`: when it said it was ready to train (time.monotonic seconds), or None;
    `steps`: the step lines read; `step`: the last step reported (None before one)."""

    def __init__(self, answers: bool = False) -> None:
        self.fd, self._report_end = os.pipe()  # (read, write): the trial writes its reports
        os.set_blocking(self.fd, False)
        self._answer_end, self.answer_fd = os.pipe() if answers else (-1, -1)  # it reads these
        self.ready: float | None = None
        self.steps = 0
        self.step: int | None = None
        self.done: int | None = None  # a warm worker's word that the trial ended: its exit code
        self.leaving = False  # ... and that the worker exits after it (a stop signal)
        self._buffer = b""
        self._open = True  # the trial's end is open: nothing read says otherwise yet
        self._answering = threading.Lock()  # an answer is never written to a descriptor closed

    @property
    def child_fds(self) -> tuple[int, ...]:
        """The descriptors the trial's process inherits (with their numbers)."""
        return tuple(fd for fd in (self._report_end, self._answer_end) if fd >= 0)

    def argument(self) -> str:
        """The trial's command-line word for its pipes: "REPORTS" or "REPORTS,ANSWERS"."""
        return ",".join(str(fd) for fd in self.child_fds)

    def begin(self) -> None:
        """A new trial on the same pipes (a warm worker's next): nothing heard of it yet."""
        self.ready, self.steps, self.step, self.done = None, 0, None, None
        self.leaving = False

    def started(self) -> None:
        """The trial holds its ends now: this process's copies would keep the pipes open."""
        for fd in self.child_fds:
            os.close(fd)
        self._report_end = self._answer_end = -1

    def serve(
        self,
        child: Process,
        turn: Callable[[], bool],
        judge: Callable[[Evaluation], str] | None = None,
    ) -> int | None:
        """Read the trial's lines until its process exits, and return its exit code; None
        once `turn()` said True. `judge(evaluation)` gives the answer to each evaluation
        (GO without one)."""
        while True:
            code = child.poll()
            if code is not None:
                child.wait()
                self.read(None)  # its last lines; an evaluation it no longer waits on is left
                return code
            if turn():
                return None
            if self._open:
                select.select([self.fd], [], [], POLL_SECONDS)
            else:  # the trial closed its end: its exit comes soon
                time.sleep(POLL_SECONDS)
            self.read(judge or (lambda _: GO))

    def read(self, judge: Callable[[Evaluation], str] | None) -> None:
        """Take every line waiting; answer each evaluation with `judge` (None: left)."""
        if self.fd < 0:  # closed: everything was read
            return
        try:
            while chunk := os.read(self.fd, 1 << 16):
                self._buffer += chunk
            self._open = False  # the end of the pipe: the trial closed its end
        except BlockingIOError:
            pass
        *lines, self._buffer = self._buffer.split(b"\n")
        for raw in lines:
            self._heard(raw, judge)

    def _heard(self, raw: bytes, judge: Callable[[Evaluation], str] | None) -> None:
        try:
            report = json.loads(raw)
        except ValueError:  # not a line of the protocol: nothing to act on
            return
        if not isinstance(report, dict):
            return
        done = report.get("done")
        if isinstance(done, int) and not isinstance(done, bool):
            self.done, self.leaving = done, report.get("leaving") is True
            return
        if report.get("ready") is True:
            if self.ready is None:
                self.ready = time.monotonic()
            return
        step = report.get("step")
        if not isinstance(step, int):
            return
        if "value" not in report:
            self.steps += 1
            self.step = step
            return
        if judge is None:
            return
        value, end = report["value"], report.get("end")
        if not isinstance(value, int | float):  # nothing to judge: the trial must not wait
            self._answer(GO)
            return
        self._answer(judge(Evaluation(step, float(value), end if isinstance(end, int) else None)))

    def _answer(self, word: str) -> None:
        self.send((word + "\n").encode())

    def send(self, data: bytes) -> bool:
        """Write `data` on the answers pipe (all of it, waiting for room); False when the
        other end is gone or this end closed."""
        with self._answering:
            try:
                while data and self.answer_fd >= 0:
                    data = data[os.write(self.answer_fd, data) :]
            except OSError:  # the trial is gone
                return False
            return self.answer_fd >= 0

    def close_answers(self) -> None:
        """Close this end of the answers pipe: a warm worker reads it as "no more trials"."""
        with self._answering:
            if self.answer_fd >= 0:
                os.close(self.answer_fd)
                self.answer_fd = -1

    def close(self) -> None:
        """Read what is left (progress only) and close this process's ends."""
        self.started()
        if self.fd >= 0:
            self.read(None)
            os.close(self.fd)
            self.fd = -1
        self.close_answers()
