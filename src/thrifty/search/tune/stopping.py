"""Stopping a tune: SIGTERM (a scheduler's stop) and SIGINT (Ctrl-C) end the running trial, then
the tune, with one line and exit code 75 (thrifty's EXIT_PREEMPTED): the same command resumes.

The signal handler only notes the signal; the trial runner sees it within a poll (0.1 s), kills
the trial's process group and waits for it, and the search ends between trials. A trial runs in
a session of its own, so a signal to the tune's process group reaches the tune only.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType

from thrifty.errors import ThriftyError
from thrifty.records.stop_signals import EXIT_PREEMPTED

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class TuneStopped(ThriftyError):
    """A signal stopped the tune; the finished trials are kept in --out and the same command
    resumes it. Exit code 75 (EXIT_PREEMPTED)."""

    exit_code = EXIT_PREEMPTED


class StopSignals:
    """While entered (in the main thread: Python's signals go there only), SIGTERM and SIGINT
    are noted in `received` instead of ending the process; the handlers before are restored at
    exit."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._previous: dict[signal.Signals, object] = {}

    def requested(self) -> bool:
        return self.received is not None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _note(self, signum: int, frame: FrameType | None) -> None:
        self.received = signal.Signals(signum)


def stopped_line(
    received: signal.Signals | None,
    trial: str | None,
    kept: int,
    out: Path,
    again: str,
    runs: int = 0,
) -> str:
    """The one line a stopped tune ends with (`kept` trials and `runs` comparison runs)."""
    by = received.name if received is not None else "a signal"
    ended = f"trial {trial} was ended and runs again on resume; " if trial else ""
    return f"stopped by {by}: {ended}{finished(kept, runs)} kept in {out}: {again} to resume"


def finished(trials: int, runs: int) -> str:
    """ "2 finished trials" (", 3 comparison runs" when there are any)."""
    text = f"{trials} finished trial{'s' if trials != 1 else ''}"
    return text + (f" and {runs} comparison run{'s' if runs != 1 else ''}" if runs else "")
