"""The warm trial engine of `thrifty tune` and `thrifty sweep`: trials run one after another in
long-lived worker processes (`thrifty.worker`), one per device, instead of a process each.

A worker imports torch and thrifty once. Each trial is `thrifty train` in the worker's main
thread: it builds its model, optimizer and data from its config, seeded as a fresh run is, and
releases them when it ends. What a worker shares between trials: the imported packages, the
CUDA context, torch.compile's compiled code (a compiled arm is compiled once per worker: a
later trial whose model and settings pass the same guards reuses it) and the data-loading
libraries' caches. What it never shares: the random generators (each run seeds its own from its
config, and the worker puts back the state it started with), torch's global switches
(deterministic algorithms, TF32, matmul precision, cuDNN's benchmark, the default dtype, the
thread count), the environment, the working directory, the import path, the loggers, the
warning filters, the signal handlers, and the user's own modules (imported afresh by each
trial); memory is collected and the CUDA cache emptied after each (`thrifty.worker.CleanState`).
A trial's run is otherwise the run `thrifty train` makes in a process of its own: its run
directory, its checkpoints, its lock, its budget.

A trial that ends its worker costs a new worker, never the search: a worker SIGKILLed (the
out-of-memory killer, an operator), a crash in native code (SIGSEGV, SIGABRT), a hang the
search ends. `TrialSession.worker_died` says so, `signal_name()` with what, and the next trial
on that device starts a fresh worker. An out-of-memory error the run raises (torch's
OutOfMemoryError, a CPU allocation refused) is the trial's failure only: the worker frees what
the run held and goes on.

THRIFTY_COLD_TRIALS=1 in the search's environment starts a new worker for every trial, as
trials ran before the engine: what `benchmarks/tune.py` and `benchmarks/sweep.py` measure the
engine against.

Each trial's output goes to its own log (the worker marks where a trial begins and ends in its
output), redacted; the worker's own lines between trials go to `workers/worker-N.log`.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from thrifty.callbacks.trial_pipe import TrialPipe
from thrifty.children import Child, Children, error_in, first_error_line

WORKER_MODULE = "thrifty.worker"
# A worker ended by one of these crashed in the trial's own code: running the trial again would
# crash again.
CRASH_SIGNALS = frozenset(
    getattr(signal, name)
    for name in ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE")
    if hasattr(signal, name)
)
COLD = "THRIFTY_COLD_TRIALS"  # "1": a new worker for every trial (the engine's benchmarks)
LOG_SECONDS = 30.0  # how long a finished trial's last lines may take to reach its log


class TrialSession:
    """One trial in a warm worker, as its search sees it: `poll()` its exit code (None while it
    runs), `wait()`, `kill()` (ends its worker), `terminate()` (SIGTERM: the run saves and
    exits 75), `error_line()`. `log` is the trial's log; `session_start` where this session's
    lines begin in it; `elapsed` the seconds since the search ordered it (for a worker's first
    trial, since the worker started: the trial paid for it)."""

    def __init__(self, worker: Worker, log: Path, label: str, append: bool) -> None:
        self.worker, self.log, self.label, self.append = worker, log, label, append
        self.proc = worker.proc
        first = worker.trials == 0
        self.started = worker.started if first else time.monotonic()
        self.started_wall = worker.started_wall if first else time.time()
        self.session_start = 0
        self.began = False  # the worker marked its beginning: its lines go to `log`
        self.file: IO[str] | None = None
        self.write_error: OSError | None = None
        self.logged = threading.Event()  # its last line is in its log
        self.code: int | None = None
        self.worker_died = False
        self.ended_by: str | None = None  # why the search ended it ("hung"), if it did

    @property
    def pipe(self) -> TrialPipe:
        return self.worker.pipe

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def poll(self) -> int | None:
        if self.code is not None:
            return self.code
        if self.worker.pipe.done is not None:
            self.code = self.worker.pipe.done
            return self.code
        code = self.worker.poll()
        if code is not None:
            self.worker.pipe.read(None)  # its last lines: a trial that ended as the worker did
            if self.worker.pipe.done is not None:
                self.code = self.worker.pipe.done
            else:
                self.code, self.worker_died = code, True
        return self.code

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code once its output is all in its log; wait for its end (`timeout`:
        `subprocess.TimeoutExpired`, as a process's wait)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.label, timeout or 0.0)
            self.worker.pipe.read(None)
            time.sleep(0.02)
        if self.worker_died:
            self.worker.wait(LOG_SECONDS)
        else:
            self.logged.wait(LOG_SECONDS)
        assert self.code is not None
        return self.code

    def kill(self) -> None:
        """End the trial now: SIGKILL to its worker's whole process group (a new worker takes
        the next trial)."""
        self.worker.kill()
        self.poll()

    def terminate(self) -> None:
        """SIGTERM to its worker's process group: the run saves and exits 75 (a stop)."""
        if self.worker.proc.returncode is None:
            try:
                os.killpg(self.worker.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    def signal_name(self) -> str:
        """The signal that ended its worker ("SIGSEGV"), for a worker that died."""
        number = -(self.code or 0)
        try:
            return signal.Signals(number).name
        except ValueError:
            return f"signal {number}"

    def crashed(self) -> bool:
        """Its worker died of a crash in native code (SIGSEGV, SIGABRT, ...)."""
        return self.worker_died and self.code is not None and -self.code in CRASH_SIGNALS

    def error_line(self) -> str:
        """What its log says went wrong; the worker's log when it never began."""
        if not self.began:
            return self.worker.error_line()
        return first_error_line(self.log, self.session_start)

    def error(self) -> str | None:
        """The first error its log shows in this session, None when it shows none."""
        if not self.began:
            return error_in(self.worker.log, self.worker.session_start)
        return error_in(self.log, self.session_start)

    # The worker's output thread calls these two.
    def _open(self) -> None:
        try:
            self.file = open(self.log, "a" if self.append else "w")  # noqa: SIM115
            if self.file.tell():
                stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
                self.file.write(f"\n--- {self.label}: a new session, {stamp} ---\n")
                self.file.flush()
            self.session_start = self.file.tell()
        except OSError as exc:
            self.write_error, self.file = exc, None
        self.began = True

    def _close(self) -> None:
        if self.file is not None:
            try:
                self.file.close()
            except OSError as exc:  # a full disk seen at the last flush
                self.write_error = self.write_error or exc
            self.file = None
        self.logged.set()


class Worker(Child):
    """One warm worker process (`thrifty.worker`), its own output in `log`, its pipes in
    `pipe`; `trials` the trials ordered of it so far."""

    def __init__(self, env: Mapping[str, str], log: Path, label: str) -> None:
        self.pipe = TrialPipe(answers=True)
        marker = secrets.token_hex(8)
        self._begin, self._end = f"{marker} begin\n", f"{marker} end\n"
        self._next: TrialSession | None = None
        self._current: TrialSession | None = None
        self.trials = 0
        try:
            super().__init__(
                [sys.executable, "-m", WORKER_MODULE, self.pipe.argument()],
                env,
                log,
                label,
                tether=json.dumps({"marker": marker}).encode(),
                pass_fds=self.pipe.child_fds,
                redact=True,
                append=True,
            )
        finally:
            self.pipe.started()

    def order(
        self, options: Sequence[str], config: bytes, log: Path, label: str, *, append: bool
    ) -> TrialSession:
        """Start a trial: `thrifty train CONFIG OPTIONS...` with the config's bytes, its output
        to `log` (after what earlier sessions wrote with `append`)."""
        session = TrialSession(self, log, label, append)
        self.pipe.begin()
        self._next = session
        order = {
            "command": "train",
            "options": list(options),
            "config": config.decode(),
            "answers": True,
        }
        self.trials += 1
        self.pipe.send((json.dumps(order) + "\n").encode())  # a worker gone: poll says how
        return session

    def _write(self, text: str) -> None:
        if text == self._begin:
            self._current, self._next = self._next, None
            if self._current is not None:
                self._current._open()
            return
        if text == self._end:
            if self._current is not None:
                self._current._close()
            self._current = None
            return
        current = self._current
        if current is not None and current.file is not None:
            try:
                current.file.write(text)
                current.file.flush()
            except OSError as exc:
                current.write_error = current.write_error or exc
            return
        super()._write(text)

    def _close(self) -> None:
        super()._close()
        for session in (self._current, self._next):
            if session is not None:
                session._close()
        self._current = self._next = None
        self.pipe.close()

    def end(self) -> None:
        """No more trials: the worker exits once its trial (if any) has ended (the end of its
        orders; a trial still asking about an evaluation hears "go")."""
        self.pipe.close_answers()


class Engine:
    """The warm workers of one search, one per slot (a device), each started on first use and
    again after one died; their own logs in `folder`. `workers_started` counts them."""

    def __init__(self, folder: Path, env: Mapping[str, str]) -> None:
        self.folder, self.env = folder, dict(env)
        self.children = Children()
        self.workers: dict[int, Worker] = {}
        self.workers_started = 0
        self.cold = os.environ.get(COLD) == "1"
        self._lock = threading.Lock()

    def start(
        self,
        options: Sequence[str],
        config: bytes,
        log: Path,
        label: str,
        *,
        slot: int = 0,
        device: Mapping[str, str] | None = None,
        append: bool = False,
    ) -> TrialSession:
        """Order a trial of the worker at `slot` (started with `device`'s environment added
        where it is not running)."""
        return self.worker(slot, device).order(options, config, log, label, append=append)

    def worker(self, slot: int = 0, device: Mapping[str, str] | None = None) -> Worker:
        with self._lock:
            worker = self.workers.get(slot)
            fresh = worker is not None and worker.trials == 0
            if worker is not None and worker.poll() is None and not worker.pipe.leaving:
                if fresh or not self.cold:
                    return worker
                worker.end()  # cold: it exits, and a new one takes the trial
            if worker is not None:
                try:
                    worker.wait(LOG_SECONDS)  # one leaving exits at once
                except subprocess.TimeoutExpired:
                    worker.kill()
            self.folder.mkdir(parents=True, exist_ok=True)
            worker = Worker(
                {**self.env, **(device or {})},
                self.folder / f"worker-{slot}.log",
                f"worker {slot}",
            )
            self.children.keep(worker)
            self.workers[slot] = worker
            self.workers_started += 1
            return worker

    def close(self, seconds: float = 30.0) -> None:
        """End every worker: idle ones exit at once, one still running a trial once the trial
        ends, within `seconds`; then whatever is left is killed."""
        deadline = time.monotonic() + seconds
        for worker in self.workers.values():
            worker.end()
        for child in self.children.started:
            try:
                child.wait(max(0.0, deadline - time.monotonic()))
            except Exception:
                pass
        self.children.kill_all()

    def kill_all(self) -> None:
        self.children.kill_all()
