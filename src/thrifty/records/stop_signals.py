"""Stop signals outside the training loop: from the start of `thrifty train` to its exit.

Inside the loop the `PreemptionWatcher` answers a stop signal with an emergency checkpoint.
Before it (reading the config, building the model, measuring the loader's workers, opening the
run directory and loading its checkpoint) no step has been trained: a stop signal then ends the
command with EXIT_PREEMPTED and one line, "nothing to save yet", so that an engine relaunching
on that exit code starts or resumes the run again. After the loop (the summary, the report) the
run has its outcome already, and a stop changes nothing but the line saying it came.

The handler records the request and does nothing else, except inside a section marked
`interruptible()` (the user's factories, building the model, measuring the data: nothing of
the run is half-written there), where it raises StopRequested at once. Elsewhere `check()`
raises it at the next safe point. A second Ctrl-C during set-up raises it wherever the command
is (nothing is lost: no step was trained); after set-up it raises KeyboardInterrupt, as Python's
own handler does.

A forked child (a DataLoader worker measuring its speed) inherits the handler: there it gives
the signal its previous action, as if thrifty had never handled it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, NoReturn

from thrifty.errors import ConfigError

__all__ = [
    "DEFAULT_SIGNALS",
    "EXIT_PREEMPTED",
    "StopRequested",
    "StopSignals",
    "active_stop_signals",
    "parse_signals",
    "stopping",
]

# sysexits.h EX_TEMPFAIL: "temporary failure, try again": preempted, resume from the checkpoint.
EXIT_PREEMPTED = 75
# The termination signals of schedulers and launchers: SIGTERM (Kubernetes, torchrun, spot
# shutdown), SIGINT (Ctrl-C), SIGUSR1 (Slurm's `--signal=USR1@<seconds>` warning).
DEFAULT_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def parse_signals(names: Sequence[str], where: str = "spot.signals") -> tuple[signal.Signals, ...]:
    """The signals named (like "SIGTERM", "SIGUSR1"); one line naming `where` for a bad name."""

    def fail(why: str) -> NoReturn:
        raise ConfigError(
            f"{where} = {list(names)!r} is invalid: {why}; use names like SIGTERM, SIGUSR1"
        )

    if isinstance(names, str) or not isinstance(names, Sequence):
        fail("give a list of signal names")
    parsed: list[signal.Signals] = []
    for name in names:
        if not isinstance(name, str) or name not in signal.Signals.__members__:
            fail(f"{name!r} is not a signal on this system")
        if name in _UNCATCHABLE:
            fail(f"{name} cannot be caught")
        if signal.Signals[name] not in parsed:
            parsed.append(signal.Signals[name])
    return tuple(parsed)


class StopRequested(BaseException):
    """A stop signal before the first step: nothing to save. A BaseException, as
    KeyboardInterrupt is, so that an `except Exception` in a user's factory lets it through."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StopSignals:
    """Records the stop signals (`install(names)`) until `uninstall()`; see the module."""

    def __init__(self) -> None:
        self.requested = False
        self.reason = ""  # "received SIGTERM"
        self.resume_step: int | None = None  # the step the run resumes from, once known
        self.past_set_up = False  # the loop began: a second Ctrl-C is a plain KeyboardInterrupt
        self._previous: dict[int, Any] = {}
        self._interruptible = False
        self._pid = os.getpid()

    def install(self, names: Sequence[str] = DEFAULT_SIGNALS) -> StopSignals:
        """Watch `names` (a ConfigError names spot.signals for a bad one); signals watched
        before and not now get their previous handler back. Main thread only (Python allows
        no other); elsewhere nothing is installed."""
        global _active
        wanted = parse_signals(names)
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in [s for s in self._previous if s not in wanted]:
            self._restore(signum)
        for signum in wanted:
            previous = signal.getsignal(signum)
            if signum in self._previous or previous is signal.SIG_IGN:
                continue  # ours already, or ignored on purpose (nohup): left as it is
            self._previous[signum] = signal.SIG_DFL if previous is None else previous
            signal.signal(signum, self._on_signal)
        _active = self
        return self

    def uninstall(self) -> None:
        """Give every watched signal its previous handler back."""
        global _active
        if threading.current_thread() is threading.main_thread():
            for signum in list(self._previous):
                self._restore(signum)
        if _active is self:
            _active = None

    def _restore(self, signum: int) -> None:
        previous = self._previous.pop(signum)
        if signal.getsignal(signum) == self._on_signal:  # not replaced since (torch's launcher)
            signal.signal(signum, previous)

    def check(self, agree: Callable[[bool], bool] | None = None) -> None:
        """Raise StopRequested if a stop signal came. `agree(flag)`: whether any rank got one
        (a collective: every rank calls it at the same point, and all stop together)."""
        requested = self.requested if agree is None else agree(self.requested)
        if requested:
            raise StopRequested(self.reason or "a stop signal to another rank")

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A section a stop signal ends at once (StopRequested): nothing is half-written in it."""
        self.check()
        outer, self._interruptible = self._interruptible, True
        try:
            yield
        finally:
            self._interruptible = outer

    def line(self, cause: BaseException | None = None) -> str:
        """The one line a stop before the first step ends the command with."""
        if self.resume_step:
            goal = f"resume from step {self.resume_step}"
        else:
            goal = "start the run" if self.resume_step == 0 else "start or resume the run"
        ended = ""
        if cause is not None:  # what the stop broke on its way (a worker it killed)
            first = (str(cause).strip().splitlines() or [""])[0][:160]
            ended = f" (which ended it with {type(cause).__name__}: {first})"
        return (
            f"thrifty: {self.reason or 'stopped'} during set-up{ended}: nothing to save yet; "
            f"run the same command to {goal} (exit code {EXIT_PREEMPTED})"
        )

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs between two bytecodes of the main thread: record, raise at most.
        if os.getpid() != self._pid:
            _pass_on(signum, frame, self._previous.get(signum, signal.SIG_DFL))
            return
        again = self.requested
        if not again:
            self.reason = f"received {signal.Signals(signum).name}"  # before the flag
            self.requested = True
        if again and signum == signal.SIGINT:  # Ctrl-C twice: now, wherever we are
            if self.past_set_up:
                signal.signal(signum, self._previous.pop(signum, signal.default_int_handler))
                raise KeyboardInterrupt
            self._interruptible = False
            raise StopRequested(self.reason)
        if self._interruptible:
            self._interruptible = False  # once: not again while it unwinds
            raise StopRequested(self.reason)


def _pass_on(signum: int, frame: FrameType | None, previous: Any) -> None:
    """In a forked child: the action the signal had before thrifty handled it."""
    if callable(previous):
        signal.signal(signum, previous)
        previous(signum, frame)
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


_active: StopSignals | None = None


def active_stop_signals() -> StopSignals:
    """The StopSignals a command installed, or one that never hears a signal (the Python API:
    a Trainer used from a script leaves the signals outside `fit()` to the script)."""
    return _active or StopSignals()


@contextlib.contextmanager
def stopping(names: Sequence[str] = DEFAULT_SIGNALS) -> Iterator[StopSignals]:
    """The stop signals answered for the block: the ones a command installed already, or
    `names` installed until the block ends."""
    if _active is not None:
        yield _active
        return
    stops = StopSignals().install(names)
    try:
        yield stops
    finally:
        stops.uninstall()
