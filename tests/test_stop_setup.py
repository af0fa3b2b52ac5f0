"""A stop signal during set-up (building the model, measuring the loader's workers, loading the
checkpoint to resume from) ends `thrifty train` with exit code 75 and one line, "nothing to
save yet", and the same command then starts or resumes the run as if nothing had happened.
Without this the process died of the signal (exit -15, no line), and an engine that relaunches
on 75 gave the job up."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from stop_probe import (
    job,
    lines_about,
    signal_at,
    sigterm_not_for_thrifty,  # noqa: F401 (a fixture)
)
from thrifty.checkpointing.saving.checkpointer import RunCheckpointer
from thrifty.cli import main
from thrifty.errors import ConfigError
from thrifty.records.stop_signals import EXIT_PREEMPTED

NOTHING_YET = "during set-up: nothing to save yet; run the same command to"


def again(command: list[str], capsys, caplog) -> tuple[int, str]:
    """The same `thrifty train` command run again, in this process (what the stopped run left
    behind is what it meets, not how it is started): its exit code, and its stderr followed by
    what it logged (here the test's log capture takes thrifty's lines)."""
    capsys.readouterr()
    caplog.clear()
    caplog.set_level(logging.INFO)
    code = main(command[3:])
    return code, capsys.readouterr().err + caplog.text


def test_sigterm_while_the_model_is_built_exits_75_and_the_same_command_then_trains(
    tmp_path, capsys, caplog
):
    command, marks = job(tmp_path, hold="model")
    code, stderr = signal_at(command, marks / "model-0")
    assert code == EXIT_PREEMPTED, stderr
    assert lines_about(stderr, "SIGTERM") == [
        f"thrifty: received SIGTERM {NOTHING_YET} start or resume the run (exit code 75)"
    ]
    assert "Traceback" not in stderr
    assert not (tmp_path / "run").exists()  # nothing of the run was written yet

    code, err = again(command, capsys, caplog)
    assert code == 0, err
    assert (tmp_path / "run" / "summary.json").exists()


def test_sigterm_to_the_group_while_loader_workers_are_measured_exits_75(tmp_path, capsys, caplog):
    # The whole process group: the measuring workers get the signal too, and die of it.
    command, marks = job(tmp_path, hold="workers", workers="auto")
    code, stderr = signal_at(command, marks / "workers", group=True)
    assert code == EXIT_PREEMPTED, stderr
    (line,) = lines_about(stderr, "SIGTERM")
    assert line.startswith("thrifty: received SIGTERM during set-up")
    assert line.endswith(f"{NOTHING_YET} start or resume the run (exit code 75)")
    assert "Traceback" not in stderr

    code, err = again(command, capsys, caplog)
    assert code == 0, err
    assert "data: num_workers = " in err  # measured this time


def test_sigterm_during_the_first_evaluation_leaves_a_run_directory_the_same_command_restarts(
    tmp_path, capsys, caplog
):
    # The run directory is claimed and its config written; no step is trained.
    command, marks = job(tmp_path, hold="eval")
    code, stderr = signal_at(command, marks / "eval")
    assert code == EXIT_PREEMPTED, stderr
    assert lines_about(stderr, "SIGTERM") == [
        f"thrifty: received SIGTERM {NOTHING_YET} start the run (exit code 75)"
    ]
    assert (tmp_path / "run" / "config.toml").exists()

    code, err = again(command, capsys, caplog)  # neither the lock nor the directory is in the way
    assert code == 0, err
    assert (tmp_path / "run" / "summary.json").exists()


def test_sigterm_while_the_checkpoint_loads_exits_75_and_the_same_command_resumes(
    tmp_path, capsys, caplog
):
    # First run, in this process: preempted at step 2 (its own SIGTERM), an emergency
    # checkpoint of step 2.
    command, marks = job(tmp_path, hold="load", send_at=2)
    code, first = again(command, capsys, caplog)
    assert code == EXIT_PREEMPTED, first
    assert "saving an emergency checkpoint at step 2" in first

    # Second run: stopped while it loads that checkpoint. The checkpoint is all there is.
    code, stderr = signal_at(command, marks / "load")
    assert code == EXIT_PREEMPTED, stderr
    assert lines_about(stderr, "SIGTERM") == [
        f"thrifty: received SIGTERM {NOTHING_YET} resume from step 2 (exit code 75)"
    ]
    assert "Traceback" not in stderr and "saving an emergency checkpoint" not in stderr

    # Third: no stale lock, no run directory in the way; it resumes where the first stopped.
    code, err = again(command, capsys, caplog)
    assert code == 0, err
    assert "resumed from step 2" in err
    assert (tmp_path / "run" / "summary.json").exists()


def test_sigusr1_to_the_nprocs_launcher_while_its_ranks_build_the_model_exits_75(tmp_path):
    command, marks = job(tmp_path, hold="model")
    command = [*command, "--nprocs", "2"]
    err = tmp_path / "stderr.txt"
    from stop_probe import finish, start, wait_for

    proc = start(command, err)
    try:
        both = [marks / "model-0", marks / "model-1"]
        wait_for(proc, lambda: all(m.exists() for m in both), "both ranks building the model")
        proc.send_signal(signal.SIGUSR1)  # Slurm's warning, to the launcher alone
    finally:
        code = finish(proc)
    stderr = err.read_text()
    assert code == EXIT_PREEMPTED, stderr
    assert lines_about(stderr, NOTHING_YET) == [
        f"thrifty: received SIGUSR1 {NOTHING_YET} start or resume the run (exit code 75)"
    ]
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("error", "code", "line"),
    [
        (
            RuntimeError("DataLoader worker (pid 7) is killed by signal: Terminated."),
            EXIT_PREEMPTED,
            "thrifty: received SIGTERM during set-up (which ended it with RuntimeError: "
            f"DataLoader worker (pid 7) is killed by signal: Terminated.){NOTHING_YET[13:]} "
            "start or resume the run (exit code 75)",
        ),
        (
            ConfigError("checkpoint.location = 'x' is invalid: give a directory"),
            2,
            "thrifty: error: checkpoint.location = 'x' is invalid: give a directory",
        ),
    ],
    ids=["what-the-stop-broke", "bad-input"],
)
@pytest.mark.usefixtures("sigterm_not_for_thrifty")
def test_an_error_after_a_stop_during_set_up_is_the_stop_unless_it_is_bad_input(
    tmp_path, monkeypatch, capsys, error, code, line
):
    def broken_by_the_stop(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)  # recorded: opening the run is no place to stop
        raise error

    monkeypatch.setattr(RunCheckpointer, "open", broken_by_the_stop)
    command, _ = job(tmp_path)
    assert main(command[3:]) == code
    assert capsys.readouterr().err.strip().splitlines()[-1] == line
