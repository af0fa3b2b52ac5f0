"""A relaunch resumes at once: when a machine dies without notice, the engine's next attempt of
the same job takes over the checkpoint location's lease at once; another job is refused while the
lease lives and gets it within a ttl (a minute) of the holder's death."""

from __future__ import annotations

import json
import logging
import os
import time

import pytest

import thrifty.rundir.lock as lock
from lock_holders import (
    BUCKET,
    HOST,
    holders,
    lease_of,
    no_engine_job,
    refusal,
    s3_options_for,
    s3_server,
    try_acquire,
    wait_until,
)
from thrifty.rundir.holder import Holder, engine_job
from thrifty.rundir.lock import LOCK_FILE, RunLock

OTHER_MACHINE = "gpu-box-7"


@pytest.fixture(autouse=True)
def _outside_any_engine_job(monkeypatch):
    no_engine_job(monkeypatch)


@pytest.fixture
def holding():
    with holders() as start:
        yield start


@pytest.fixture(scope="module")
def s3_endpoint():
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint, monkeypatch, tmp_path, request):
    """A fresh location in the loopback bucket, and the options that reach it."""
    return f"s3://{BUCKET}/{request.node.name}", s3_options_for(s3_endpoint, monkeypatch, tmp_path)


def in_job(monkeypatch, env: dict[str, str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)


# (the dead attempt's environment, the relaunch's environment, the job, the reason logged)
RELAUNCHES = {
    "slurm requeue": (
        {"SLURM_JOB_ID": "4242", "SLURM_CLUSTER_NAME": "c1"},
        {"SLURM_JOB_ID": "4242", "SLURM_CLUSTER_NAME": "c1", "SLURM_RESTART_COUNT": "1"},
        "Slurm job 4242 on c1",
        "(Slurm restart 0; this is Slurm restart 1)",
    ),
    "skypilot recovery": (
        {"SKYPILOT_TASK_ID": "sky-managed-2026-01-01-00-00-00-000000_train_7"},
        {"SKYPILOT_TASK_ID": "sky-managed-2026-01-01-00-00-00-000000_train_7"},
        "SkyPilot task sky-managed-2026-01-01-00-00-00-000000_train_7",
        f"(machine {OTHER_MACHINE} boot ",
    ),
    "torchrun restart": (
        {"TORCHELASTIC_RUN_ID": "job-7", "TORCHELASTIC_RESTART_COUNT": "0"},
        {"TORCHELASTIC_RUN_ID": "job-7", "TORCHELASTIC_RESTART_COUNT": "1"},
        "torchrun run job-7",
        "(torchrun restart 0; this is torchrun restart 1)",
    ),
}


@pytest.mark.parametrize("engine", list(RELAUNCHES))
def test_a_relaunch_of_the_same_engine_job_takes_over_the_lease_of_its_sigkilled_attempt_at_once(
    tmp_path, holding, s3, monkeypatch, caplog, engine
):
    url, options = s3
    before, after, job, why = RELAUNCHES[engine]
    # The first attempt ran on a machine that is gone now: nobody here can see its pid.
    first = holding(
        run_dir=str(tmp_path / "a"), location=url, options=options, host=OTHER_MACHINE, env=before
    )
    first.kill()
    dead = lease_of(url, options)
    assert dead is not None and dead.job == job and dead.host == OTHER_MACHINE
    in_job(monkeypatch, after)
    with (
        caplog.at_level(logging.WARNING, logger="thrifty.rundir.lock"),
        RunLock(tmp_path / "b", url, options, settle_seconds=0.05),
    ):
        assert time.time() < dead.expires - 30  # no waiting for the dead attempt's lease
        mine = lease_of(url, options)
        assert mine.pid == os.getpid() and mine.job == job and mine.attempt != dead.attempt
    assert (
        f"took over the lease on checkpoint location {url} from {dead.describe()}, an earlier "
        f"attempt of {job} {why}"
    ) in caplog.text


def test_another_job_is_refused_while_the_lease_lives_naming_the_holder_and_its_job(
    tmp_path, holding, s3, monkeypatch
):
    url, options = s3
    first = holding(
        run_dir=str(tmp_path / "a"),
        location=url,
        options=options,
        host=OTHER_MACHINE,
        env={"SLURM_JOB_ID": "4242"},
    )
    held = lease_of(url, options)
    until = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(held.expires))
    expected = (
        f"checkpoint location {url} is in use by pid {first.pid} on host {OTHER_MACHINE} since "
        f"{held.started} (Slurm job 4242) (lease until {until}): wait for it to end, or use "
        "another checkpoint.location"
    )
    in_job(monkeypatch, {"SLURM_JOB_ID": "99", "SLURM_RESTART_COUNT": "3"})
    assert refusal(tmp_path / "b", checkpoint_location=url, storage_options=options) == expected
    no_engine_job(monkeypatch)  # outside any job: refused all the same
    assert refusal(tmp_path / "b", checkpoint_location=url, storage_options=options) == expected
    assert lease_of(url, options).token == held.token
    assert not (tmp_path / "b" / LOCK_FILE).exists()  # all or nothing: its own lock let go


@pytest.mark.parametrize("host", [HOST, OTHER_MACHINE])
def test_a_second_training_in_the_same_attempt_of_a_job_is_refused_while_the_first_lives(
    tmp_path, holding, s3, monkeypatch, host
):
    url, options = s3
    env = {"SLURM_JOB_ID": "4242", "TORCHELASTIC_RUN_ID": "none"}
    first = holding(run_dir=str(tmp_path / "a"), location=url, options=options, host=host, env=env)
    in_job(monkeypatch, env)
    message = refusal(tmp_path / "b", checkpoint_location=url, storage_options=options)
    assert f"in use by pid {first.pid} on host {host} since " in message
    assert "(Slurm job 4242)" in message


def test_a_lease_of_another_job_killed_on_another_machine_lapses_after_its_ttl(
    tmp_path, holding, s3, monkeypatch, caplog
):
    url, options = s3
    first = holding(
        run_dir=str(tmp_path / "a"),
        location=url,
        options=options,
        host=OTHER_MACHINE,
        env={"SKYPILOT_TASK_ID": "sky-1"},
        ttl=6.0,  # short for the test; DEFAULT_TTL_SECONDS in a run
    )
    first.kill()
    dead = lease_of(url, options)
    in_job(monkeypatch, {"SKYPILOT_TASK_ID": "sky-2"})
    # Another job cannot tell a dead holder from a slow one: it waits for the lease to lapse
    # (on a machine too busy to ask before the lapse, there is nothing left to refuse).
    if time.time() < dead.expires - 1.0:
        refusal(tmp_path / "b", checkpoint_location=url, storage_options=options)
    taker = RunLock(tmp_path / "b", url, options, settle_seconds=0.05)
    with caplog.at_level(logging.WARNING, logger="thrifty.rundir.lock"):
        assert wait_until(lambda: try_acquire(taker), timeout=30)
    try:
        assert time.time() > dead.expires
        assert lease_of(url, options).job == "SkyPilot task sky-2"
    finally:
        taker.release()
    assert (
        f"took over the expired lease on checkpoint location {url} from {dead.describe()}"
    ) in caplog.text


def test_a_lease_lapses_within_about_a_minute_and_is_renewed_several_times_before():
    run_lock = RunLock("run")
    assert run_lock.ttl_seconds == lock.DEFAULT_TTL_SECONDS <= 90
    # Two renewals in a row may fail (a bucket's hiccup) before the lease lapses.
    assert run_lock.renew_seconds * 3 < run_lock.ttl_seconds
    assert RunLock("run", ttl_seconds=2.0).renew_seconds == 0.5


# --- without flock: the lock file on a network file system ---------------------------------------


def test_without_flock_a_relaunch_of_the_same_job_takes_over_the_lock_file_at_once(
    tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr(lock._LocalLock, "_flock", lambda self: False)
    dead = Holder(
        host=OTHER_MACHINE,
        pid=4242,
        started="2026-01-01T00:00:00+00:00",
        token="x",
        job="Slurm job 7",
        attempt="Slurm restart 0",
    )
    (tmp_path / LOCK_FILE).write_bytes(dead.to_bytes())  # touched just now: not stale by age
    in_job(monkeypatch, {"SLURM_JOB_ID": "8"})
    assert "in use by pid 4242 on host gpu-box-7" in refusal(tmp_path)
    in_job(monkeypatch, {"SLURM_JOB_ID": "7"})
    assert "in use by pid 4242" in refusal(tmp_path)  # the same attempt: it may still run
    in_job(monkeypatch, {"SLURM_RESTART_COUNT": "1"})
    with caplog.at_level(logging.WARNING, logger="thrifty.rundir.lock"), RunLock(tmp_path):
        assert json.loads((tmp_path / LOCK_FILE).read_bytes())["pid"] == os.getpid()
    assert (
        f"took over the stale lock on run directory {tmp_path} from {dead.describe()}, an earlier "
        "attempt of Slurm job 7 (Slurm restart 0; this is Slurm restart 1)"
    ) in caplog.text


# --- which job and attempt a process is ----------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, None),
        ({"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "2"}, None),
        ({"SLURM_JOB_ID": "12"}, ("Slurm job 12", "Slurm restart 0")),
        (
            {"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "12"},
            ("Slurm job 12", "Slurm restart 2, torchrun restart 0"),
        ),
        (
            {"SKYPILOT_TASK_ID": "sky-9", "TORCHELASTIC_RUN_ID": "sky-9"},
            ("SkyPilot task sky-9", "machine h1 boot b1, torchrun restart 0"),
        ),
        (
            {"TORCHELASTIC_RUN_ID": "3f2a", "TORCHELASTIC_RESTART_COUNT": "4"},
            ("torchrun run 3f2a", "torchrun restart 4"),
        ),
    ],
)
def test_the_job_is_the_outermost_engines_id_and_the_attempt_each_restart_count(env, expected):
    assert engine_job(env, "h1", "b1") == expected
