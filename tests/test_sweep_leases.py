"""A trial put back in the queue drops its lease: the next worker to take it up is never seen,
before it writes its own lease, as running an orphan under the old one (which handed one
trial to two workers of a resumed `--workers 2` sweep and counted its seconds twice)."""

from __future__ import annotations

import time

import optuna
from optuna.trial import TrialState

from thrifty.sweeps.study import LEASE_KEY, lease, requeue_orphans
from thrifty.sweeps.trial import SECONDS_KEY, requeue

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
