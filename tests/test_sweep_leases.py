"""A trial put back in the queue drops its lease: the next worker to take it up is never seen,
before it writes its own lease, as running an orphan under the old one (which handed one
trial to two workers of a resumed `--workers 2` sweep and counted its seconds twice). A worker
whose lease lapsed finds, at its next renewal, that another took the trial up, and lets go
instead of writing its lease over the other's; a renewal that fails is said once."""

from __future__ import annotations

import time
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from thrifty.search.sweep.leases import Leases, requeue
from thrifty.search.sweep.study import LEASE_KEY, lease, requeue_orphans
from thrifty.search.sweep.trial import SECONDS_KEY

optuna.logging.set_verbosity(optuna.logging.WARNING)


def stale_lease() -> dict:
    """The lease of a session whose process is gone: a stopped sweep's."""
    held = lease(time.time() - 30.0)
    return {**held, "pid": 2**22 + 12345, "renewed": held["since"] + 10.0}


def test_a_trial_requeued_and_taken_up_again_is_no_orphan_before_its_new_lease():
    study = optuna.create_study()
    storage = study._storage
    trial = study.ask()
    storage.set_trial_user_attr(trial._trial_id, SECONDS_KEY, 10.0)  # its first session
    storage.set_trial_user_attr(trial._trial_id, LEASE_KEY, stale_lease())
    requeue(storage, trial._trial_id)  # the stop put it back
    again = study.ask()  # worker 1 takes it up; its lease is not written yet
    assert again.number == trial.number
    assert requeue_orphans(study, SECONDS_KEY) == []  # worker 2 leaves it to worker 1
    (frozen,) = study.get_trials(deepcopy=False)
    assert frozen.state is TrialState.RUNNING
    assert frozen.user_attrs[SECONDS_KEY] == 10.0  # counted once


def test_an_orphan_with_a_dead_holders_lease_is_still_requeued_and_its_session_counted():
    study = optuna.create_study()
    trial = study.ask()
    study._storage.set_trial_user_attr(trial._trial_id, LEASE_KEY, stale_lease())
    assert requeue_orphans(study, SECONDS_KEY) == [trial.number]
    (frozen,) = study.get_trials(deepcopy=False)
    assert frozen.state is TrialState.WAITING
    assert frozen.user_attrs[SECONDS_KEY] == 10.0 and frozen.user_attrs[LEASE_KEY] is None


def held_by(storage: Any, trial_id: int, leases: Leases) -> float:
    """The trial held by `leases` (its renewing thread left idle: the test renews); the
    session's start."""
    leases.stop.set()
    leases.hold(storage, trial_id, 0)
    return storage.get_trial(trial_id).user_attrs[LEASE_KEY]["since"]


def test_a_worker_whose_lease_lapsed_lets_go_of_the_trial_another_took_up(capsys):
    study = optuna.create_study()
    storage = study._storage
    trial = study.ask()
    mine = Leases()
    since = held_by(storage, trial._trial_id, mine)
    mine.renew(storage, trial._trial_id, since, 0)  # still this worker's: renewed
    assert mine.holds(trial._trial_id)
    assert storage.get_trial(trial._trial_id).user_attrs[LEASE_KEY]["since"] == since

    # Its renewals stalled past the lease; another worker requeued the trial and took it up.
    requeue(storage, trial._trial_id)
    assert study.ask().number == trial.number
    theirs = {**lease(time.time()), "pid": 2**22 + 777}
    storage.set_trial_user_attr(trial._trial_id, LEASE_KEY, theirs)

    mine.renew(storage, trial._trial_id, since, 0)
    assert not mine.holds(trial._trial_id)
    assert storage.get_trial(trial._trial_id).user_attrs[LEASE_KEY] == theirs  # not overwritten
    assert capsys.readouterr().err.count("trial 0: another worker took it up") == 1
    mine.renew(storage, trial._trial_id, since, 0)  # no longer renewed, nor said again
    assert storage.get_trial(trial._trial_id).user_attrs[LEASE_KEY] == theirs
    assert capsys.readouterr().err == ""
    assert mine.release(trial._trial_id) is False  # its run's outcome is the other's to tell


def test_a_trial_told_its_end_meanwhile_is_not_lost():
    study = optuna.create_study()
    storage = study._storage
    trial = study.ask()
    leases = Leases()
    since = held_by(storage, trial._trial_id, leases)
    assert leases.release(trial._trial_id) is True  # the run ended: released, then told
    study.tell(trial, 1.0)
    leases.renew(storage, trial._trial_id, since, 0)  # a renewal of the round before
    assert leases.holds(trial._trial_id)


class Unanswering:
    """A storage that fails while `down` (a database gone for a minute)."""

    def __init__(self, storage: Any) -> None:
        self.storage, self.down = storage, False

    def __getattr__(self, name: str) -> Any:
        if self.down:
            raise ConnectionError("could not connect to server: postgresql://u:hunter2@db/x")
        return getattr(self.storage, name)


def test_a_failing_renewal_is_said_once_without_the_storages_words_and_so_is_its_return(
    capsys: pytest.CaptureFixture[str],
):
    study = optuna.create_study()
    storage = Unanswering(study._storage)
    trial = study.ask()
    leases = Leases()
    since = held_by(storage, trial._trial_id, leases)
    storage.down = True
    for _ in range(3):
        leases.renew(storage, trial._trial_id, since, 0)
    err = capsys.readouterr().err
    assert err.count("trial 0: its lease could not be renewed (ConnectionError)") == 1
    assert "another worker may take the trial up" in err and "hunter2" not in err
    storage.down = False
    leases.renew(storage, trial._trial_id, since, 0)
    assert capsys.readouterr().err.count("trial 0: its lease renewed again") == 1
    assert leases.holds(trial._trial_id)
