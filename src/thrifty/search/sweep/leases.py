"""The leases a sweep's worker holds on the trials it runs (`thrifty.search.sweep.study`), renewed
by one thread, and a trial put back in the queue.

A worker whose lease lapsed (the study's storage unanswered for a lease's length) and whose
trial another worker then took up stops its run and tells Optuna nothing: the trial is the
other worker's. Each renewal checks the lease is still this worker's first, so the two run it
together for a renewal's interval at most; a renewal that fails is said once, and so is the
renewal that works again.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from optuna.trial import TrialState

from thrifty.console import say
from thrifty.search.sweep.study import LEASE_KEY, lease


class Leases:
    """The leases this process holds (see `thrifty.search.sweep.study`), renewed by one thread."""

    def __init__(self) -> None:
        self.held: dict[int, tuple[float, int]] = {}  # trial id -> (session began, number)
        self.lost: set[int] = set()  # trial ids another worker took up: their runs stop
        self.failing: set[int] = set()  # trial ids whose last renewal failed
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()

    def hold(self, storage: Any, trial_id: int, number: int) -> None:
        since = time.time()
        storage.set_trial_user_attr(trial_id, LEASE_KEY, lease(since))
        with self.lock:
            self.held[trial_id] = (since, number)
            if self.thread is None:
                self.thread = threading.Thread(target=self._renew, args=(storage,), daemon=True)
                self.thread.start()

    def holds(self, trial_id: int) -> bool:
        """Whether the trial is still this worker's: no other worker took it up."""
        with self.lock:
            return trial_id not in self.lost

    def release(self, trial_id: int) -> bool:
        """Stop renewing; whether the lease was this worker's to the end."""
        with self.lock:
            self.held.pop(trial_id, None)
            self.failing.discard(trial_id)
            kept = trial_id not in self.lost
            self.lost.discard(trial_id)
            return kept

    def _renew(self, storage: Any) -> None:
        from thrifty.search.sweep.study import LEASE_SECONDS

        while not self.stop.wait(LEASE_SECONDS / 6):
            with self.lock:
                held = list(self.held.items())
            for trial_id, (since, number) in held:
                self.renew(storage, trial_id, since, number)

    def renew(self, storage: Any, trial_id: int, since: float, number: int) -> None:
        """Renew one lease, once it is checked to be still this worker's (a trial put back in
        the queue, or leased by another, is lost: its run stops)."""
        from thrifty.search.sweep.study import LEASE_SECONDS

        try:
            frozen = storage.get_trial(trial_id)
            mine = _is_mine(frozen.user_attrs.get(LEASE_KEY), since)
            if frozen.state != TrialState.RUNNING or not mine:
                with self.lock:
                    lost = self.held.pop(trial_id, None) is not None  # not released meanwhile
                    if lost:
                        self.lost.add(trial_id)
                if lost:
                    say("sweep", f"trial {number}: another worker took it up after its lease "
                        "lapsed: its run here stops")  # fmt: skip
                return
            storage.set_trial_user_attr(trial_id, LEASE_KEY, lease(since))
        except Exception as exc:  # a storage blip: said once, the next round retries
            with self.lock:
                first = trial_id in self.held and trial_id not in self.failing
                self.failing.add(trial_id)
            if first:
                say("sweep", f"trial {number}: its lease could not be renewed "
                    f"({type(exc).__name__}): the study's storage is not answering; "
                    f"{LEASE_SECONDS:.0f} s after the last renewal another worker may take "
                    "the trial up")  # fmt: skip
            return
        with self.lock:
            recovered = trial_id in self.failing
            self.failing.discard(trial_id)
        if recovered:
            say("sweep", f"trial {number}: its lease renewed again")


def _is_mine(held: Any, since: float) -> bool:
    """Whether `held` is the lease this process wrote for the session that began at `since`."""
    if not isinstance(held, dict):
        return False
    mine = lease(since)
    return all(held.get(key) == mine[key] for key in ("host", "pid", "started", "since"))


def requeue(storage: Any, trial_id: int) -> None:
    """Back in the queue (WAITING) to resume from its checkpoint, its lease dropped first: a
    worker that takes it up again is not seen, before it writes its own lease, as running an
    orphan under the old one (which would hand it to a second worker, its seconds counted
    twice)."""
    storage.set_trial_user_attr(trial_id, LEASE_KEY, None)
    storage.set_trial_state_values(trial_id, TrialState.WAITING)
