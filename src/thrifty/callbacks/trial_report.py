"""A trial's reports to the search that started it (`thrifty tune`, `thrifty sweep`), as a
callback: one protocol for every trial, served by `thrifty.callbacks.trial_pipe`.

The trial's process (a warm worker, `thrifty.worker`) holds its pipes: REPORTS, or
REPORTS,ANSWERS (descriptor numbers). On REPORTS it writes JSON lines:

- `{"ready": true}` once torch and the Trainer are imported (what a budget too small is spent
  on: a trial ready to train that completes no step is hung);
- `{"step": N}` after every optimizer step N;
- `{"step": S, "value": V, "end": E}` after an evaluation past step 0 (V the validation loss,
  E the step the run's budget ends at, or null), only with ANSWERS: the trial then waits for
  one line back, "go", "prune" (the run stops as pruned) or "pause" (it saves a checkpoint and
  exits 75 as after a preemption, to be resumed once its Hyperband bracket has caught up:
  `thrifty.search.sweep.hyperband`).

Progress never blocks the run: a line that finds the pipe full is dropped (the search reads it
often). A search that is gone (its end of a pipe closed) means "go": the trial is tethered to
it and ends with it anyway. One process only asks: a run of several processes would need every
rank to agree, and a search's trials run as one process each, so with several the evaluation
is not reported.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from thrifty.callbacks.base import Callback, StepEnd
from thrifty.errors import ThriftyError
from thrifty.records.stop import StopReason

log = logging.getLogger("thrifty")

GO, PRUNE, PAUSE = "go", "prune", "pause"


class TrialReport(Callback):
    """The trial's end of its pipes: `reports` (written), `answers` (read; None: the search
    answers nothing and no evaluation is reported)."""

    def __init__(self, reports: int, answers: int | None = None) -> None:
        self.reports, self.answers = reports, answers
        os.set_blocking(reports, False)
        self.gone = False  # the search closed its end: every verdict is "go"
        self.paused = False  # the search answered "pause": the run stops as preempted
        self.run: Any = None

    @classmethod
    def from_argument(cls, word: str) -> TrialReport:
        """The report `word` names: "REPORTS" or "REPORTS,ANSWERS" (descriptor numbers)."""
        try:
            fds = [int(part) for part in word.split(",")]
        except ValueError:
            fds = []
        if not 1 <= len(fds) <= 2 or min(fds) < 0:
            raise ThriftyError(
                f"the trial's pipes are {word!r}: give REPORTS or REPORTS,ANSWERS, the "
                "descriptor numbers the search passed (python -m thrifty.worker 5,6)"
            )
        return cls(fds[0], fds[1] if len(fds) == 2 else None)

    def ready(self) -> None:
        """Say that torch and the Trainer are imported: the trial is ready to train."""
        self._say({"ready": True})

    def on_fit_start(self, run: Any) -> None:
        self.run = run

    def on_step_end(self, step_info: StepEnd) -> None:
        self._say({"step": step_info.step})

    def on_evaluation_end(self, step: int, val_loss: float | None) -> StopReason | None:
        """Past step 0, ask the search whether the run goes on: PRUNED, PREEMPTED (paused) or
        None (go)."""
        run = self.run
        if step <= 0 or val_loss is None or self.answers is None or self.gone or run is None:
            return None
        if run.dist.world_size > 1:
            return None
        end = run.budget.end_step(run.state)
        word = self._ask({"step": step, "value": val_loss, "end": end})
        if word == PRUNE:
            log.warning("pruned by the sweep at step %d", step)
            return StopReason.PRUNED
        if word == PAUSE:
            self.paused = True
            log.warning("paused by the sweep at step %d: its bracket has not caught up", step)
            return StopReason.PREEMPTED
        return None

    def _say(self, report: dict[str, Any]) -> None:
        """Write one line without blocking: a full pipe drops it, a gone search too."""
        try:
            os.write(self.reports, line(report))
        except OSError:
            pass

    def _ask(self, report: dict[str, Any]) -> str:
        """Write one line, waiting for room (the search reads often), and read the answer:
        GO, PRUNE or PAUSE; GO once the search is gone."""
        assert self.answers is not None
        try:
            os.set_blocking(self.reports, True)
            try:
                os.write(self.reports, line(report))
            finally:
                os.set_blocking(self.reports, False)
            answer = read_line(self.answers)
        except OSError:
            answer = ""
        if not answer:
            self.gone = True
            return GO
        word = answer.strip()
        return word if word in (PRUNE, PAUSE) else GO


def line(report: dict[str, Any]) -> bytes:
    """One report as the pipe carries it: a JSON line (under the pipe's atomic write size)."""
    return (json.dumps(report) + "\n").encode()


def read_line(fd: int) -> str:
    """One whole line from `fd` (byte by byte: nothing past it is taken), or "" once the other
    end is closed before a line ends."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            return ""
        data += chunk
    return data.decode(errors="replace")
