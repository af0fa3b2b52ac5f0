"""The Python API ends a preempted run as `thrifty train` does: `FitResult.exit_code` is the
exit code (75) a requeue wrapper relaunches on, and the line printed says to end the script
with it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from helpers import stop_group_after
from thrifty.records.state import FitResult
from thrifty.records.stop import StopReason
from thrifty.records.stop_signals import EXIT_PREEMPTED
from thrifty.reporting.end_of_run import stop_line

TESTS = Path(__file__).parent

SCRIPT = """
import logging, sys
from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig

if {configure_logging}:
    logging.basicConfig(level=logging.WARNING, format="log: %(message)s")
config = TrainConfig.from_dict({{
    "run": {{"max_steps": 100000, "device": "cpu", "out": {out!r}, "progress": "off",
             "log_every": 1}},
    "batch": {{"micro": 2}},
    "data": {{"num_workers": 0}},
    "schedule": {{"decay": "constant"}},
    "checkpoint": {{"every": "off"}},
    "spot": {{"provider": "none"}},
    "measure": {{"breakdown": False}},
}})
result = Trainer(tiny_gpt(n_layer=1), TokenDataset(n=4096), config).fit()
print(f"stop_reason={{result.stop_reason}} exit_code={{result.exit_code}}", flush=True)
sys.exit(result.exit_code)
"""


@pytest.mark.parametrize("configure_logging", [False, True], ids=["thrifty-speaks", "own-logging"])
def test_a_script_preempted_by_sigterm_to_its_group_exits_75_with_result_exit_code(
    tmp_path, configure_logging
):
    script = tmp_path / "train.py"
    out = tmp_path / "run"
    script.write_text(SCRIPT.format(out=str(out), configure_logging=configure_logging))
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    done = stop_group_after([sys.executable, str(script)], out / "metrics.jsonl", 3, env)
    assert "stop_reason=preempted exit_code=75" in done.stdout, done.stderr
    assert done.returncode == EXIT_PREEMPTED, done.stderr
    said = done.stdout + done.stderr
    assert (
        "end the script with sys.exit(result.exit_code) (exit code 75) so a requeue wrapper "
        "relaunches it, and run it again to resume"
    ) in said, said
    assert "run the same command" not in said  # the command line's advice, not a script's
    assert "Traceback" not in done.stderr


def result_stopped_by(reason: str) -> FitResult:
    return FitResult(
        steps=3,
        samples=6,
        tokens=0,
        train_loss=1.0,
        val_loss=None,
        initial_val_loss=None,
        best_val_loss=None,
        tokens_per_second=0.0,
        samples_per_second=1.0,
        stop_reason=reason,
        wall_seconds=1.0,
        precision="fp32",
        num_workers=0,
    )


def test_exit_code_is_75_preempted_1_diverged_and_0_for_every_finished_stop():
    codes = {reason.value: result_stopped_by(reason).exit_code for reason in StopReason}
    assert codes == {
        "data_error": 1,
        "diverged": 1,
        "preempted": 75,
        "max_steps": 0,
        "max_tokens": 0,
        "max_time": 0,
        "early_stopping": 0,
        "forecast": 0,
        "pruned": 0,
        "callback": 0,
        "data_exhausted": 0,
    }


def test_the_stop_line_tells_a_script_to_end_with_the_code_the_command_line_exits_with():
    preempted = result_stopped_by(StopReason.PREEMPTED)
    assert stop_line(preempted) == (
        "preempted at step 3; checkpoint saved, run the same command to resume (exit code 75)"
    )
    assert stop_line(preempted, from_script=True) == (
        "preempted at step 3; checkpoint saved: end the script with sys.exit(result.exit_code) "
        "(exit code 75) so a requeue wrapper relaunches it, and run it again to resume"
    )
    finished = result_stopped_by(StopReason.MAX_STEPS)
    assert stop_line(finished) == stop_line(finished, from_script=True) == ""
