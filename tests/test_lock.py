"""One writer per run: a second process on the same run directory or checkpoint location is
refused with a message naming the first; a lock whose holder died is taken over."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

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
    wait_until,
)
from thrifty.checkpointing.store.storage import open_storage
from thrifty.errors import ThriftyError
from thrifty.rundir.lease import Lease
from thrifty.rundir.lock import LEASE_FILE, LOCK_FILE, Holder, RunInUseError, RunLock


@pytest.fixture(autouse=True)
def _outside_any_engine_job(monkeypatch):
    no_engine_job(monkeypatch)


@pytest.fixture
def holding():
    with holders() as start:
        yield start


@pytest.fixture
def no_flock(monkeypatch):
    """This process, like the children started with no_flock=True, finds no flock."""
    monkeypatch.setattr(lock._LocalLock, "_flock", lambda self: False)


# --- local run directory, flock ------------------------------------------------------------------


def test_a_second_process_is_refused_naming_the_holder_then_takes_over_after_sigkill(
    tmp_path, holding, caplog
):
    run = tmp_path / "run"
    first = holding(run_dir=str(run))
    message = refusal(run)
    assert message.startswith(f"run directory {run} is in use by pid {first.pid} on host {HOST}")
    assert message.endswith(": wait for it to end, or use another --out")
    first.kill()
    with caplog.at_level(logging.WARNING, logger="thrifty.rundir.lock"), RunLock(run):
        holder = Holder.parse((run / LOCK_FILE).read_bytes())
        assert holder is not None and holder.pid == os.getpid()
    assert f"took over the lock on run directory {run} from pid {first.pid}" in caplog.text
    assert not (run / LOCK_FILE).exists()  # released: nothing left behind


def test_a_second_lock_in_the_same_process_is_refused_as_this_process(tmp_path):
    with RunLock(tmp_path):
        message = refusal(tmp_path)
    assert f"pid {os.getpid()} on host {HOST}" in message
    assert "(this process: another run in it still holds the lock)" in message
    with RunLock(tmp_path):  # released: the next run gets it
        pass


def test_the_lock_file_records_host_pid_start_time_and_process_start(tmp_path):
    with RunLock(tmp_path / "new" / "run"):
        record = json.loads((tmp_path / "new" / "run" / LOCK_FILE).read_text())
    assert record["host"] == HOST and record["pid"] == os.getpid()
    assert record["started"].endswith("+00:00")
    with open(f"/proc/{os.getpid()}/stat") as f:
        assert record["process_start"] == int(f.read().rsplit(")", 1)[1].split()[19])


def test_forked_children_of_a_killed_holder_keep_the_lock_until_they_exit(
    tmp_path, holding, monkeypatch
):
    # The kernel keeps a flock while any process shares the descriptor: a dead run's data
    # loader workers hold it until they notice and exit. The next run waits for them...
    first = holding(run_dir=str(tmp_path), fork_for=1.0)
    first.kill()
    with RunLock(tmp_path):
        pass
    # ...but not for ever, and then says who to stop.
    second = holding(run_dir=str(tmp_path), fork_for=300.0)
    second.kill()
    monkeypatch.setattr(lock, "STALE_WAIT_SECONDS", 0.3)
    message = refusal(tmp_path)
    assert f"still locked by child processes of pid {second.pid} on host {HOST}" in message
    assert "stop those processes" in message


def test_a_local_checkpoint_location_shared_by_two_runs_is_refused(tmp_path, holding):
    shared = tmp_path / "ckpt"
    first = holding(run_dir=str(tmp_path / "a"), location=str(shared))
    message = refusal(tmp_path / "b", checkpoint_location=str(shared))
    assert message.startswith(f"checkpoint location {shared} is in use by pid {first.pid}")
    assert message.endswith("or use another checkpoint.location")
    assert not (tmp_path / "b" / LOCK_FILE).exists()  # all or nothing: b's own lock let go


# --- local run directory, no flock (network file systems) ----------------------------------------


def test_without_flock_a_live_holder_is_refused_and_a_killed_one_is_taken_over(
    tmp_path, holding, no_flock, caplog
):
    first = holding(run_dir=str(tmp_path), no_flock=True)
    assert f"in use by pid {first.pid} on host {HOST}" in refusal(tmp_path)
    first.kill()
    with caplog.at_level(logging.WARNING, logger="thrifty.rundir.lock"), RunLock(tmp_path):
        assert Holder.parse((tmp_path / LOCK_FILE).read_bytes()).pid == os.getpid()
    assert f"took over the stale lock on run directory {tmp_path} from pid {first.pid}" in (
        caplog.text
    )
    assert not (tmp_path / LOCK_FILE).exists()


def write_lock(path: Path, age_seconds: float = 0.0, **fields: object) -> None:
    holder = Holder(**{**vars_of(Holder.me()), **fields})
    (path / LOCK_FILE).write_bytes(holder.to_bytes())
    then = time.time() - age_seconds
    os.utime(path / LOCK_FILE, (then, then))


def vars_of(holder: Holder) -> dict:
    return json.loads(holder.to_bytes())


def test_without_flock_a_reused_pid_is_told_apart_by_its_start_time(tmp_path, no_flock):
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert wait_until(lambda: lock.process_start(alive.pid) is not None)
        real_start = lock.process_start(alive.pid)
        write_lock(tmp_path, pid=alive.pid, process_start=real_start)
        assert f"in use by pid {alive.pid}" in refusal(tmp_path)
        write_lock(tmp_path, pid=alive.pid, process_start=real_start - 1)  # the pid was reused
        with RunLock(tmp_path):
            pass
    finally:
        alive.kill()
        alive.wait()


def test_without_flock_another_hosts_lock_is_refused_until_untouched_for_a_ttl(
    tmp_path, no_flock, caplog
):
    write_lock(tmp_path, age_seconds=50.0, host="gpu-box-7", pid=4242)
    message = refusal(tmp_path, ttl_seconds=60.0)
    assert "in use by pid 4242 on host gpu-box-7" in message
    write_lock(tmp_path, age_seconds=70.0, host="gpu-box-7", pid=4242)
    with (
        caplog.at_level(logging.WARNING, logger="thrifty.rundir.lock"),
        RunLock(tmp_path, ttl_seconds=60),
    ):
        pass
    assert "took over the stale lock" in caplog.text and "pid 4242 on host gpu-box-7" in caplog.text


def test_without_flock_the_holder_touches_its_lock_file_so_other_hosts_see_it_alive(
    tmp_path, no_flock
):
    with RunLock(tmp_path, ttl_seconds=0.6) as held:
        path = tmp_path / LOCK_FILE
        past = time.time() - 100
        os.utime(path, (past, past))
        assert wait_until(lambda: path.stat().st_mtime > past + 50, timeout=10)
        assert held.lost is None


def test_without_flock_a_lock_taken_over_meanwhile_is_reported_lost_and_left_alone(
    tmp_path, no_flock, caplog
):
    held = RunLock(tmp_path, ttl_seconds=0.6).acquire()
    try:
        write_lock(tmp_path, host="gpu-box-7", pid=4242, token="someone-else")
        with caplog.at_level(logging.ERROR, logger="thrifty.rundir.lock"):
            assert wait_until(lambda: held.lost is not None, timeout=10)
        assert held.lost == (
            f"lost the lock on run directory {tmp_path}: it is now held by pid 4242 on host "
            f"gpu-box-7 since {Holder.parse((tmp_path / LOCK_FILE).read_bytes()).started}"
        )
    finally:
        held.release()
    assert Holder.parse((tmp_path / LOCK_FILE).read_bytes()).token == "someone-else"


# --- object stores: a lease ----------------------------------------------------------------------


@pytest.fixture
def memory_location(request):
    url = f"memory://lock-tests/{request.node.name}"
    yield url
    open_storage(url).delete("")


def test_a_lease_refuses_a_second_run_and_is_deleted_on_release(tmp_path, memory_location):
    with RunLock(tmp_path / "a", memory_location, settle_seconds=0.05):
        lease = lease_of(memory_location)
        assert lease is not None and lease.pid == os.getpid()
        assert lease.expires == pytest.approx(time.time() + lock.DEFAULT_TTL_SECONDS, abs=10)
        message = refusal(tmp_path / "b", checkpoint_location=memory_location, settle_seconds=0)
    assert message.startswith(f"checkpoint location {memory_location} is in use by pid ")
    assert "(lease until " in message and message.endswith("or use another checkpoint.location")
    assert lease_of(memory_location) is None
    assert not (tmp_path / "b" / LOCK_FILE).exists()
    with RunLock(tmp_path / "b", memory_location, settle_seconds=0.05):
        pass


def test_an_expired_lease_is_taken_over_with_a_warning(tmp_path, memory_location, caplog):
    dead = Holder(
        host="gpu-box-7",
        pid=4242,
        started="2026-01-01T00:00:00+00:00",
        token="x",
        expires=time.time() - 1,
    )
    open_storage(memory_location).write_bytes(LEASE_FILE, dead.to_bytes())
    with (
        caplog.at_level(logging.WARNING, logger="thrifty.rundir.lock"),
        RunLock(tmp_path, memory_location, settle_seconds=0.05),
    ):
        assert lease_of(memory_location).pid == os.getpid()
    assert (
        f"took over the expired lease on checkpoint location {memory_location} from pid 4242 on "
        "host gpu-box-7 since 2026-01-01T00:00:00+00:00"
    ) in caplog.text


def test_the_lease_is_renewed_by_a_background_thread_while_the_run_lives(
    tmp_path, memory_location, monkeypatch
):
    renewed_on: list[threading.Thread] = []
    renew = Lease.renew

    def recorded(self) -> None:
        renewed_on.append(threading.current_thread())
        renew(self)

    monkeypatch.setattr(Lease, "renew", recorded)
    with RunLock(tmp_path / "a", memory_location, ttl_seconds=1.0, settle_seconds=0.05):
        first = lease_of(memory_location).expires
        # This thread only waits (a training step never calls into the lock), yet it is renewed.
        assert wait_until(lambda: lease_of(memory_location).expires > first + 0.5, timeout=10)
        refusal(tmp_path / "b", checkpoint_location=memory_location, ttl_seconds=1.0)
    assert renewed_on and {t.name for t in renewed_on} == {"thrifty-lock-renewal"}
    assert all(t.daemon for t in renewed_on)


def test_a_lease_overwritten_while_settling_is_lost_and_names_the_winner(tmp_path, memory_location):
    rival = Holder(
        host="gpu-box-7",
        pid=4242,
        started="2026-01-01T00:00:00+00:00",
        token="r",
        expires=time.time() + 600,
    )
    storage = open_storage(memory_location)
    # The other writer's put lands just after ours: both read "no lease" before writing.
    timer = threading.Timer(0.2, storage.write_bytes, (LEASE_FILE, rival.to_bytes()))
    timer.start()
    message = refusal(tmp_path, checkpoint_location=memory_location, settle_seconds=1.0)
    timer.join()
    assert "in use by pid 4242 on host gpu-box-7" in message
    assert lease_of(memory_location).token == "r"  # the winner's lease is left alone


def test_a_lease_taken_over_meanwhile_is_reported_lost_and_not_deleted(
    tmp_path, memory_location, caplog
):
    held = RunLock(tmp_path, memory_location, ttl_seconds=0.6, settle_seconds=0.05).acquire()
    try:
        rival = Holder(
            host="gpu-box-7",
            pid=4242,
            started="2026-01-01T00:00:00+00:00",
            token="r",
            expires=time.time() + 600,
        )
        open_storage(memory_location).write_bytes(LEASE_FILE, rival.to_bytes())
        with caplog.at_level(logging.ERROR, logger="thrifty.rundir.lock"):
            assert wait_until(lambda: held.lost is not None, timeout=10)
        assert "lost the lease on checkpoint location" in held.lost
        assert "two runs may now write there" in caplog.text
    finally:
        held.release()
    assert lease_of(memory_location).token == "r"


def test_a_ttl_that_is_not_positive_is_refused():
    with pytest.raises(ThriftyError, match=r"the lock's ttl_seconds = 0 must be greater than 0"):
        RunLock("run", ttl_seconds=0)


# --- object stores: S3 through a real S3 API on loopback -----------------------------------------


@pytest.fixture(scope="module")
def s3_endpoint():
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture
def s3_options(s3_endpoint, monkeypatch, tmp_path):
    return s3_options_for(s3_endpoint, monkeypatch, tmp_path)


def test_an_s3_lease_of_a_run_sigkilled_on_this_host_is_taken_over_at_once(
    tmp_path, holding, s3_options, caplog
):
    url = f"s3://{BUCKET}/run"
    first = holding(run_dir=str(tmp_path / "a"), location=url, options=s3_options)
    lease = lease_of(url, s3_options)
    assert lease is not None and lease.pid == first.pid
    message = refusal(tmp_path / "b", checkpoint_location=url, storage_options=s3_options)
    assert message.startswith(f"checkpoint location {url} is in use by pid {first.pid} on host")
    first.kill()
    # Nobody renews it now; on this host its pid says it is gone, long before the lease lapses.
    with (
        caplog.at_level(logging.WARNING, logger="thrifty.rundir.lock"),
        RunLock(tmp_path / "b", url, s3_options, settle_seconds=0.05),
    ):
        assert time.time() < lease.expires - 30
        assert lease_of(url, s3_options).pid == os.getpid()
    assert (
        f"took over the lease on checkpoint location {url} from {lease.describe()}, which ended"
    ) in caplog.text
    assert lease_of(url, s3_options) is None


# --- the command line ----------------------------------------------------------------------------


def slow_job(tmp_path: Path) -> Path:
    """A tiny job that checkpoints every 2 steps and would run for a long time."""
    config = tmp_path / "job.toml"
    config.write_text(
        '[run]\nmax_steps = 100000\nlog_every = 1\nprogress = "off"\n'
        '[batch]\nmicro = 4\n[data]\nnum_workers = 0\n[schedule]\ndecay = "constant"\n'
        '[checkpoint]\nevery = 2\n[spot]\nprovider = "none"\n'
        '[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "thrifty.demo:train_dataset"\n'
        "model_args = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 16 }\n"
        "data_args = { block_size = 16, max_bytes = 100000 }\n"
    )
    return config


def test_a_second_thrifty_train_on_the_same_out_exits_2_and_a_restart_takes_over_after_sigkill(
    tmp_path, capsys, caplog
):
    # The holder is a process of its own, killed outright; the second and third commands run
    # in this process, which already holds torch: what they meet on disk is the same.
    from thrifty.cli import main

    run = tmp_path / "run"
    command = [sys.executable, "-m", "thrifty", "train", str(slow_job(tmp_path)), "--out", str(run)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        assert wait_until(
            lambda: first.poll() is not None or any(run.glob("checkpoints/step-*/manifest.json")),
            timeout=120,
        )
        assert first.poll() is None, first.stderr.read()
        capsys.readouterr()
        assert main([*command[3:], "--steps", "1"]) == 2
        second = capsys.readouterr().err
        errors = [line for line in second.splitlines() if "error" in line]
        assert errors == [
            f"thrifty: error: run directory {run} is in use by pid {first.pid} on host {HOST} "
            f"since {Holder.parse((run / LOCK_FILE).read_bytes()).started}: wait for it to end, "
            "or use another --out"
        ]
    finally:
        first.kill()
        first.wait(timeout=30)
        first.stderr.close()
    step = max(
        int(p.parent.name.split("-")[1]) for p in run.glob("checkpoints/step-*/manifest.json")
    )
    caplog.set_level(logging.INFO)  # the log capture takes thrifty's lines
    code = main([*command[3:], "--steps", str(step + 2)])
    third = capsys.readouterr().err + caplog.text
    assert code == 0, third
    assert f"took over the lock on run directory {run} from pid {first.pid}" in third
    assert f"resumed from step {step}" in third
    assert not (run / LOCK_FILE).exists()


def test_trainer_fit_refuses_a_run_dir_in_use_in_this_process_and_lets_go_when_it_ends(tmp_path):
    from helpers import TokenDataset, tiny_gpt
    from thrifty import Trainer
    from thrifty.config import TrainConfig

    def trainer() -> Trainer:
        run = {"max_steps": 2, "device": "cpu", "out": str(tmp_path), "progress": "off"}
        config = {"run": run, "batch": {"micro": 4}, "spot": {"provider": "none"}}
        return Trainer(tiny_gpt(n_layer=1), TokenDataset(n=16), TrainConfig.from_dict(config))

    with RunLock(tmp_path), pytest.raises(RunInUseError) as info:
        trainer().fit()
    assert f"pid {os.getpid()} on host {HOST}" in str(info.value)
    assert "(this process: another run in it still holds the lock)" in str(info.value)
    assert not (tmp_path / "metrics.jsonl").exists()  # refused before writing anything
    assert trainer().fit().steps == 2
    assert not (tmp_path / LOCK_FILE).exists()  # released when fit() ends


@pytest.fixture
def nothing_loads(monkeypatch):
    """`thrifty train`'s steps after the run directory check, each recorded instead of run."""
    from thrifty.commands import training
    from thrifty.strategies import launcher

    called: list[str] = []
    monkeypatch.setattr(training, "load_torch", lambda: called.append("load_torch"))
    monkeypatch.setattr(training, "_train", lambda *a: called.append("train") or 0)
    monkeypatch.setattr(launcher, "launch", lambda *a, **k: called.append("launch") or 0)
    return called


@pytest.mark.parametrize("nprocs", [[], ["--nprocs", "2"]])
def test_thrifty_train_on_a_run_dir_in_use_says_so_before_it_loads_anything(
    tmp_path, holding, capsys, nothing_loads, nprocs
):
    run = tmp_path / "run"
    first = holding(run_dir=str(run))
    from thrifty import cli

    assert cli.main(["train", str(slow_job(tmp_path)), "--out", str(run), *nprocs]) == 2
    assert nothing_loads == []  # neither the compiler, the model and data, nor a rank
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line]
    assert line.startswith(
        f"thrifty: error: run directory {run} is in use by pid {first.pid} on host {HOST}"
    )
    assert line.endswith(": wait for it to end, or use another --out")
    assert Holder.parse((run / LOCK_FILE).read_bytes()).pid == first.pid  # left as it was


def test_the_early_check_lets_a_dead_holders_run_dir_and_other_ranks_through(
    tmp_path, holding, nothing_loads, monkeypatch
):
    from thrifty import cli

    run = tmp_path / "run"
    argv = ["train", str(slow_job(tmp_path)), "--out", str(run)]
    first = holding(run_dir=str(run))
    monkeypatch.setenv("RANK", "1")  # a rank other than 0: its own job's rank 0 holds it
    assert cli.main(argv) == 0
    monkeypatch.delenv("RANK")
    first.kill()  # its lock file stays behind, its flock went with it: training takes it over
    assert cli.main(argv) == 0
    assert nothing_loads == ["load_torch", "train", "load_torch", "train"]
    assert (run / LOCK_FILE).exists()  # not touched by the check
