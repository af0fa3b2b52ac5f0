"""What thrifty says when it stops: a second Ctrl-C during the emergency save says how many steps
stopping at once would lose and asks for a third; a single process never speaks of another
rank; a bad poll interval names the key a config sets (spot.poll_seconds)."""

from __future__ import annotations

import logging
import os
import signal

import pytest
import torch

from stop_probe import finish, job, lines_about, start, wait_for
from thrifty.checkpointing.saving.preemption import PreemptionWatcher, make_poller
from thrifty.cli import main
from thrifty.config import SpotConfig
from thrifty.errors import ConfigError
from thrifty.records.stop_signals import StopSignals


def test_ctrl_c_during_the_emergency_save_says_what_a_stop_loses_and_a_third_stops_at_once(
    tmp_path, capsys, caplog
):
    # Checkpoints every 3 steps; the first Ctrl-C (the model's own) comes in step 5, whose
    # emergency checkpoint then takes long to gather (the model holds in state_dict).
    command, marks = job(
        tmp_path, hold="save", send="SIGINT", send_at=5, every=3, steps=8, published=3
    )
    err = tmp_path / "stderr.txt"
    proc = start(command, err)
    try:
        wait_for(proc, (marks / "save").exists, "the emergency save")
        os.kill(proc.pid, signal.SIGINT)  # the second Ctrl-C: a warning, the save goes on
        wait_for(proc, lambda: "press Ctrl-C again" in err.read_text(), "the warning")
        assert proc.poll() is None
        os.kill(proc.pid, signal.SIGINT)  # the third: at once
    finally:
        code = finish(proc)
    stderr = err.read_text()
    assert code == 130, stderr
    assert lines_about(stderr, "Ctrl-C") == [
        "thrifty: the emergency checkpoint of step 5 is being written; stopping now loses the "
        "2 steps since the last checkpoint (step 3): press Ctrl-C again to stop at once"
    ]
    assert stderr.splitlines()[-1] == (
        "thrifty: interrupted: stopped at once: the 2 steps since the last checkpoint (step 3) "
        "are lost"
    )
    assert "Traceback" not in stderr
    published = sorted(p.parent.name for p in (tmp_path / "run").glob("checkpoints/*/manifest.*"))
    assert published == ["step-00000003"]

    # The lost steps are trained again from step 3 (the same command, in this process, whose
    # log capture takes thrifty's lines).
    capsys.readouterr()
    caplog.set_level(logging.INFO)
    code = main(command[3:])
    err = capsys.readouterr().err + caplog.text
    assert code == 0, err
    assert "resumed from step 3" in err


def test_a_second_ctrl_c_is_a_warning_and_only_a_third_raises_keyboard_interrupt(capfd):
    with PreemptionWatcher("none") as watcher:
        watcher.step, watcher.saved_step = 12, 10
        os.kill(os.getpid(), signal.SIGINT)
        assert watcher.requested and watcher.reason == "received SIGINT"
        watcher.saving = 12
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: the save goes on
        assert not watcher.forced
        with pytest.raises(KeyboardInterrupt) as stopped:
            os.kill(os.getpid(), signal.SIGINT)
    assert watcher.forced
    assert str(stopped.value) == (
        "stopped at once: the 2 steps since the last checkpoint (step 10) are lost"
    )
    assert capfd.readouterr().err == (
        "thrifty: the emergency checkpoint of step 12 is being written; stopping now loses the "
        "2 steps since the last checkpoint (step 10): press Ctrl-C again to stop at once\n"
    )


def test_a_checkpoint_still_being_written_is_not_counted_as_saved(tmp_path, monkeypatch):
    # Step 3's save was handed to the background writer, which has not finished: a stop at once
    # now would leave no step 3 on disk, so the count runs from the checkpoint that is.
    import threading

    from thrifty.checkpointing.store import manager as manager_module
    from thrifty.checkpointing.store.manager import CheckpointManager

    release, write = threading.Event(), manager_module.write_checkpoint

    def slow_write(*args, **kwargs):
        release.wait(30)
        return write(*args, **kwargs)

    monkeypatch.setattr(manager_module, "write_checkpoint", slow_write)
    watcher = PreemptionWatcher("none")
    with CheckpointManager(str(tmp_path)) as store:
        watcher.written = lambda: store.newest_written
        watcher.step = 5
        store.save(3, {"w": torch.zeros(2)})
        assert watcher._lost() == "the 5 steps since the start (there is no checkpoint yet)"
        release.set()
        store.wait()
        assert watcher._lost() == "the 2 steps since the last checkpoint (step 3)"


def test_a_second_ctrl_c_with_every_step_saved_stops_at_once():
    with PreemptionWatcher("none") as watcher:
        watcher.step = watcher.saved_step = 7
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_a_single_process_whose_data_fails_never_speaks_of_another_rank(
    tmp_path, monkeypatch, capsys, caplog
):
    # In this process: test_your_data.py's test_a_source_that_raises_mid_run_stops_with_its_
    # steps_saved_and_resumes runs the same job as a command of its own.
    from test_your_data import job, train

    config = job(tmp_path, "streams:failing_stream")
    monkeypatch.setenv("STREAM_FAIL_AT", "40")
    capsys.readouterr()
    caplog.set_level(logging.INFO)  # the log capture takes thrifty's lines
    code = main(train(config, tmp_path / "run")[3:])
    stderr = capsys.readouterr().err
    assert code == 1, stderr
    assert "another rank" not in stderr + caplog.text
    assert "checkpoint step 5 written" in caplog.text
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("thrifty: error: the training data raised OSError: the bucket went")


def test_a_bad_poll_interval_names_spot_poll_seconds_as_the_config_does():
    with pytest.raises(ConfigError) as from_the_api:
        make_poller("aws", poll_interval=0)
    with pytest.raises(ConfigError) as from_the_config:
        SpotConfig(poll_seconds=0)
    assert str(from_the_api.value) == "spot.poll_seconds = 0 is invalid: must be greater than 0"
    assert str(from_the_api.value) == str(from_the_config.value)


def test_the_commands_stop_signals_hand_over_to_the_watcher_and_back_without_a_gap():
    before = signal.getsignal(signal.SIGTERM)
    stops = StopSignals().install()
    try:
        with PreemptionWatcher("none") as watcher:
            os.kill(os.getpid(), signal.SIGTERM)
            assert watcher.requested and not stops.requested  # the loop's: a checkpoint
        os.kill(os.getpid(), signal.SIGTERM)  # the watcher gave the signal back
        assert stops.requested and stops.reason == "received SIGTERM"
    finally:
        stops.uninstall()
    assert signal.getsignal(signal.SIGTERM) is before
