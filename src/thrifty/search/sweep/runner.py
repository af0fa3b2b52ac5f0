"""The sweep itself: K workers asking Optuna for trials and running them, within a budget.

Each worker is a thread of the sweep's process with a warm worker process of its own
(`thrifty.search.engine`) that runs its trials one after another
(`thrifty.search.sweep.trial`), so K workers run K trials at once, each with an equal share of the
machine's cores (OMP_NUM_THREADS, torch's intra-op threads; one you set is kept). A worker first
requeues the trials orphaned by a dead worker (`thrifty.search.sweep.study`), then asks: Optuna hands
out a waiting trial (preempted, orphaned) before it samples a new one, so an interrupted trial
resumes before the search goes on. It stops asking once the study holds --trials trials, or once
the budget cannot pay for one more (a trial in flight always finishes or is pruned: never cut
off unsaved).

A SIGTERM or SIGINT to the sweep is passed to every trial (each saves a checkpoint and goes back
in the queue); the sweep then exits 75, and the same command continues it.
"""

from __future__ import annotations

import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from thrifty.errors import ThriftyError
from thrifty.search.sweep import results
from thrifty.search.sweep.space import Space
from thrifty.search.sweep.study import PAUSED_KEY, requeue_orphans, storage_trouble
from thrifty.search.sweep.trial import SECONDS_KEY, Ended, TrialSetup, run_trial
from thrifty.search.sweep.verdicts import HYPERBAND_LIMIT_KEY, release_paused

STOP_GRACE_SECONDS = 120.0  # a trial's emergency checkpoint after the sweep's stop signal
STORAGE_RETRIES = (5.0, 10.0, 20.0, 40.0, 60.0)  # seconds between tries of a failing storage


REPEATED_FAILURES = 3  # trials in a row failed alike: the sweep starts no more


class SweepFailed(ThriftyError):
    """Every trial failed, or the same failure repeated: exit code 1 (the budget bought no
    result), with the failure named in one line."""

    exit_code = 1


class SweepStopped(ThriftyError):
    """The sweep was asked to stop: its trials saved and wait; the same command continues."""

    exit_code = 75


@dataclass(frozen=True, slots=True)
class Budget:
    """--budget: `seconds` of trial time (all workers' trials summed) or `usd`."""

    seconds: float | None = None
    usd: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> Budget:
        from thrifty.config import parse_duration

        if text is None:
            return cls()
        text = text.strip()
        if text.startswith("$"):
            try:
                usd = float(text[1:])
            except ValueError:
                usd = math.nan
            if not (math.isfinite(usd) and usd > 0):
                raise ThriftyError(f"--budget {text!r} is invalid: dollars above 0, e.g. $40")
            return cls(usd=usd)
        try:
            seconds = parse_duration(text, "--budget")
        except Exception:
            raise ThriftyError(
                f"--budget {text!r} is invalid: a time (90m, 2h) or dollars ($40)"
            ) from None
        if seconds <= 0:
            raise ThriftyError(f"--budget {text!r} is invalid: a time above 0, e.g. 2h")
        return cls(seconds=seconds)

    def describe(self) -> str:
        if self.usd is not None:
            return f"${self.usd:,.2f}"
        if self.seconds is not None:
            return f"{self.seconds / 3600:.2f} h of trial time"
        return "none"


@dataclass
class Sweep:
    """One sweep, ready to run (built by `thrifty.search.sweep.plan.make_sweep`)."""

    study: optuna.Study
    setup: TrialSetup
    space: Space
    trials: int | None
    budget: Budget
    workers: int
    say: Callable[[str], None]
    seed: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)
    signalled: threading.Event = field(default_factory=threading.Event)  # SIGTERM, SIGINT
    failure: str | None = None  # why the sweep ended before its end (one line)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ended: list[Ended] = field(default_factory=list)
    failed_in_a_row: list[str] = field(default_factory=list)  # reasons, since the last success
    repeated: str | None = None  # the failure that repeated REPEATED_FAILURES times in a row


def run_sweep(sweep: Sweep) -> dict[str, Any]:
    """Run the sweep's workers to the end; returns the sweep's record (sweep.json). Raises
    SweepStopped after a stop signal, once every trial has saved."""
    gpus = visible_gpus()
    threads = [
        threading.Thread(
            target=_worker, args=(sweep, i, _device_env(gpus, i)), name=f"sweep-worker-{i}"
        )
        for i in range(sweep.workers)
    ]
    with _stop_signals(sweep):
        for thread in threads:
            thread.start()
        try:
            while any(t.is_alive() for t in threads):
                for thread in threads:
                    thread.join(0.2)
        finally:
            sweep.stopping.set()  # a running trial is told to save (SIGTERM) and ends
            sweep.setup.workers().close(STOP_GRACE_SECONDS)  # the workers too, or are killed
            for thread in threads:
                thread.join()
            sweep.setup.leases.stop.set()
    record = results.write(sweep.study, sweep.setup.out, sweep.budget)
    if sweep.failure is not None:
        raise ThriftyError(sweep.failure)
    if sweep.signalled.is_set():
        waiting = sum(1 for e in sweep.ended if e.state == "requeued")
        raise SweepStopped(
            f"sweep stopped: {waiting} trial(s) saved and waiting; run the same command to "
            "continue it (exit code 75)"
        )
    _check_failures(sweep, record)
    return record


def _check_failures(sweep: Sweep, record: dict[str, Any]) -> None:
    """Raise SweepFailed when the sweep stopped for a repeated failure, or when every trial of
    the study failed (no best, no best.toml: the budget bought nothing)."""
    trials = record.get("trials") or []
    failed = [t for t in trials if t.get("state") == "failed"]
    if sweep.repeated is not None:
        everyone = "every trial failed" if len(failed) == len(trials) else "the sweep stopped"
        raise SweepFailed(
            f"{everyone}: {REPEATED_FAILURES} trials in a row failed alike, so no more "
            f"were started: {sweep.repeated}; fix that, then run the same command"
        )
    if trials and len(failed) == len(trials):
        reasons = [str(t.get("error") or "no reason recorded") for t in failed]
        kinds = [_kind(r) for r in reasons]
        common = max(sorted(set(kinds)), key=kinds.count)
        shown = reasons[kinds.index(common)]
        alike = "alike" if kinds.count(common) == len(kinds) else f"{kinds.count(common)} alike"
        raise SweepFailed(
            f"every trial failed ({len(failed)} of {len(trials)}, {alike}): {shown}; no best "
            "and no best.toml: fix that, then run the same command"
        )


def _kind(reason: str) -> str:
    """A failure's kind: its text with the numbers left out (a shape error names the shapes
    each trial's values gave: the same failure all the same)."""
    return re.sub(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", "#", reason)


def _count_failure(sweep: Sweep, ended: Ended) -> None:
    """Stop starting trials once REPEATED_FAILURES trials in a row failed alike (of any kind
    of failure: the config refused, a shape error, a diverged run); a trial that finishes or
    is pruned clears the count."""
    if ended.state in ("complete", "pruned"):
        sweep.failed_in_a_row.clear()
    if ended.state != "failed":
        return
    sweep.failed_in_a_row.append(ended.detail)
    last = sweep.failed_in_a_row[-REPEATED_FAILURES:]
    if len(last) == REPEATED_FAILURES and len({_kind(r) for r in last}) == 1:
        if sweep.repeated is None:
            sweep.repeated = ended.detail
            sweep.say(
                f"{REPEATED_FAILURES} trials in a row failed alike ({ended.detail}): no more "
                "trials start"
            )


@contextmanager
def _stop_signals(sweep: Sweep) -> Iterator[None]:
    """SIGTERM and SIGINT stop the sweep (the workers pass the stop on to their trials)."""
    previous = {}

    def handler(signum: int, _frame: Any) -> None:
        sweep.signalled.set()
        sweep.stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _worker(sweep: Sweep, slot: int, device: dict[str, str]) -> None:
    """Take up trials until none may start; a storage that fails (a database gone for a
    while) is retried with a back-off, and ends the sweep with one line if it stays down."""
    failures = 0
    while not sweep.stopping.is_set():
        try:
            if not _next_trial(sweep, slot, device):
                return
            failures = 0
        except Exception as exc:  # the storage: a lost connection, a locked journal
            failures += 1
            why = storage_trouble(exc)
            if failures > len(STORAGE_RETRIES):
                sweep.failure = (
                    f"{why}, and still after {sum(STORAGE_RETRIES):.0f} s: the trials are saved; "
                    "run the same command to continue once it is back"
                )
                sweep.stopping.set()
                return
            wait = STORAGE_RETRIES[failures - 1]
            sweep.say(f"{why}; trying again in {wait:.0f} s")
            sweep.stopping.wait(wait)


def _next_trial(sweep: Sweep, slot: int, device: dict[str, str]) -> bool:
    """Run (or resume) one trial; False when no trial may start any more."""
    with sweep.lock, _asking(sweep.setup.out):
        requeue_orphans(sweep.study, SECONDS_KEY)
        for number, what in release_paused(sweep.setup, sweep.study):
            sweep.say(f"trial {number}: its bracket caught up: {what}")
        if not _may_start(sweep):
            waiting = _paused_behind_running(sweep.study)  # a trial in flight may release them
            trial = None
        else:
            waiting = False
            # The sampler is seeded by the trial's number: a sweep stopped and continued
            # samples what it would have sampled without the stop (TPE keeps no other state).
            count = len(sweep.study.get_trials(deepcopy=False))
            sweep.study.sampler = optuna.samplers.TPESampler(seed=sweep.seed + count)
            trial = sweep.study.ask()
            params = sweep.space.suggest(trial)
    if trial is None:
        if waiting:
            time.sleep(1.0)
        return waiting
    resumed = SECONDS_KEY in sweep.setup.storage.get_trial(trial._trial_id).user_attrs
    sweep.say(
        f"trial {trial.number}: {'resumed' if resumed else 'started'} "
        + " ".join(f"{k}={_show(v)}" for k, v in params.items())
    )
    ended = run_trial(sweep.setup, sweep.study, trial, params, sweep.stopping, slot, device)
    sweep.ended.append(ended)
    detail = f" ({ended.detail})" if ended.detail else ""
    sweep.say(f"trial {ended.number}: {ended.state}{detail}")
    with sweep.lock:
        _count_failure(sweep, ended)
    if ended.state == "failed" and "No space left" in ended.detail:
        sweep.failure = (
            f"trial {ended.number}: {ended.detail}: free some space, then run the same command"
        )
        sweep.stopping.set()
    return True


@contextmanager
def _asking(out: Path) -> Iterator[None]:
    """One process of this machine at a time counts the trials and asks for one (an advisory
    lock on --out), so that two sweeps sharing a folder never start more than --trials."""
    try:
        import fcntl
    except ImportError:  # no advisory locks here
        yield
        return
    fd = os.open(out, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without locks: counted per process only
            pass
        yield
    finally:
        os.close(fd)  # releases the lock


def _paused_behind_running(study: optuna.Study) -> bool:
    """Trials wait at a rung while others of the study still run."""
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    paused = [t for t in running if isinstance(t.user_attrs.get(PAUSED_KEY), int)]
    return bool(paused) and len(paused) < len(running)


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _may_start(sweep: Sweep) -> bool:
    """Whether one more trial may start: a waiting one always may (it was paid for when it
    started); a new one while the study holds fewer than --trials and the budget can pay for it."""
    if sweep.repeated is not None:  # the same failure again and again: no trial starts
        return False
    trials = sweep.study.get_trials(deepcopy=False)
    if any(t.state == TrialState.WAITING for t in trials):
        return True
    if sweep.trials is not None and len(trials) >= sweep.trials:
        return False
    if results.budget_allows(trials, sweep.budget, sweep.say):
        return True
    if sweep.setup.brackets is not None and HYPERBAND_LIMIT_KEY not in sweep.study.user_attrs:
        # No trial starts any more: the brackets decide among the trials they have.
        sweep.study.set_user_attr(HYPERBAND_LIMIT_KEY, len(trials))
    return False


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (the variable when
    set, else every GPU torch sees; none on a machine without CUDA)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [d.strip() for d in given.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())]


def _device_env(gpus: list[str], worker: int) -> dict[str, str]:
    """Worker `worker`'s trials see one GPU of their own (shared round-robin when there are
    more workers than GPUs); nothing changes on a machine without one."""
    return {"CUDA_VISIBLE_DEVICES": gpus[worker % len(gpus)]} if gpus else {}


def threads_per_trial(workers: int) -> int:
    """Each trial's share of the cores: OMP_NUM_THREADS for K trials at once."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // workers)


def trial_env(workers: int) -> dict[str, str]:
    """The trials' environment: OMP_NUM_THREADS and MKL_NUM_THREADS set to each trial's share
    of the cores, unless set already (yours are kept, as `--nprocs` keeps them)."""
    threads = os.environ.get("OMP_NUM_THREADS") or str(threads_per_trial(workers))
    mkl = os.environ.get("MKL_NUM_THREADS") or threads
    return {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": mkl}
