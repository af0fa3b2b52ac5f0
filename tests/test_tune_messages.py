"""What `thrifty tune` says about a trial that fails without an error of its own: one that makes
no progress is called hung (not "the budget is too small"), and one killed by a signal names
the signal. Real trials of tiny models from this file, each in its own process."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from dist_task import Net
from test_tune import CONFIG, one_line_error
from thrifty.callbacks.trial_pipe import TrialPipe
from thrifty.search.tune import trials

TESTS = Path(__file__).resolve().parent


class Hangs(Net):
    """Every forward waits for something that never comes (a dead data server, a lock); it
    creates the file TUNE_TEST_HANGING names first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        Path(os.environ["TUNE_TEST_HANGING"]).touch()
        time.sleep(3600)
        return super().forward(x)


def hangs() -> torch.nn.Module:
    return Hangs()


class KilledBySigkill(Net):
    """Its process is killed in the first forward, as the out-of-memory killer does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        os.kill(os.getpid(), signal.SIGKILL)
        return super().forward(x)


def killed_by_sigkill() -> torch.nn.Module:
    return KilledBySigkill()


@pytest.fixture
def job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A config training `model` of this file; trial processes import it from tests/."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)

    def write(model: str) -> Path:
        config = tmp_path / "job.toml"
        config.write_text(CONFIG.format(model=f"test_tune_messages:{model}"))
        return config

    return write


def only_the_baseline(config: Path, out: Path, budget: str) -> list[str]:
    return [
        "tune", str(config), "--levers", "micro", "--micro", "8", "--steps", "2",
        "--budget", budget, "--out", str(out),
    ]  # fmt: skip


class BudgetWaitedOut:
    """`time` as thrifty.search.tune.trials sees it: the real clock until the tune has read the
    trial's "ready" and the trial sits in its hanging forward; from then on `jump` seconds
    later, past the deadline of a budget of `jump` seconds, as if it had been waited out."""

    def __init__(self, hanging: Path, jump: float) -> None:
        self.hanging, self.jump = hanging, jump
        self.ready = False  # the tune read the trial's "ready to train"

    def monotonic(self) -> float:
        waited = self.ready and self.hanging.exists()
        return time.monotonic() + (self.jump if waited else 0.0)

    def __getattr__(self, name: str):
        return getattr(time, name)


def wait_out_a_hang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The `hangs` model's trials waited out to a 40 s budget's deadline (`BudgetWaitedOut`)."""
    hanging = tmp_path / "hanging"
    monkeypatch.setenv("TUNE_TEST_HANGING", str(hanging))
    clock = BudgetWaitedOut(hanging, jump=40.0)
    monkeypatch.setattr(trials, "time", clock)
    read = TrialPipe.read

    def read_noting_ready(pipe: TrialPipe, judge) -> None:
        read(pipe, judge)
        clock.ready = clock.ready or pipe.ready is not None

    monkeypatch.setattr(TrialPipe, "read", read_noting_ready)


def test_a_trial_that_completes_no_step_is_called_hung_not_a_budget_too_small(
    job, tmp_path, capsys, monkeypatch
):
    # The budget ends the hanging trial at its deadline. Rather than wait out its 40 s (which
    # must leave a busy machine time to get the trial ready), the trials' clock jumps 40 s
    # once the trial is ready and hangs: the tune then ends it as its budget would have.
    wait_out_a_hang(tmp_path, monkeypatch)
    out = tmp_path / "tune"
    line = one_line_error(capsys, only_the_baseline(job("hangs"), out, "40s"))
    assert line.startswith(
        "thrifty: error: the baseline (the config as given) hung: no step completed in "
    )
    assert "s after it started (log: " in line and "find what it waits for" in line
    assert "too small" not in line
    (trial,) = json.loads((out / "tune.json").read_text())["trials"]
    assert (trial["status"], trial["failure"], trial["steps_completed"]) == ("failed", "hung", 0)


def test_a_compiled_trial_the_budget_ends_in_its_first_step_was_compiling_not_hung(
    job, tmp_path, capsys, monkeypatch
):
    # torch.compile's first step is its compiling (minutes in an autotuning mode): the same
    # wait with compile on is the budget ending a compile, not a hang.
    wait_out_a_hang(tmp_path, monkeypatch)
    config = job("hangs")
    config.write_text(config.read_text() + '\n[compile]\nmode = "default"\n')
    out = tmp_path / "tune"
    line = one_line_error(capsys, only_the_baseline(config, out, "40s"))
    assert line.startswith("thrifty: error: --budget 40s is too small for even one trial: ")
    assert ", still compiling (torch.compile's first step); give more time" in line
    assert "hung" not in line
    (trial,) = json.loads((out / "tune.json").read_text())["trials"]
    assert (trial["status"], trial["failure"], trial["steps_completed"]) == (
        "stopped",
        "compiling",
        0,
    )
    assert trial["error"].startswith("the budget ended it while compiling: default mode had ")


def test_a_trial_killed_by_a_signal_names_the_signal(job, tmp_path, capsys):
    out = tmp_path / "tune"
    line = one_line_error(capsys, only_the_baseline(job("killed_by_sigkill"), out, "10m"))
    assert line == (
        "thrifty: error: every trial failed; the first, 00-baseline: killed by SIGKILL (not by "
        "the tune: often the system's out-of-memory killer) (log: "
        f"{out}/trials/00-baseline/train.log)"
    )
    (trial,) = json.loads((out / "tune.json").read_text())["trials"]
    assert (trial["failure"], trial["exit_code"]) == ("killed", -9)
