"""A user's scheduler that fails is one line and exit code 2, before training wherever the run's
steps are known: a factory that raises, a OneCycleLR shorter than the run, a CosineAnnealingLR
with T_max = 0, a step_size given as text. Where a time budget leaves the steps unknown, a
failure found in the rehearsal is said at set-up, and one met mid-run is one line too."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, OneCycleLR

from test_cli import run_cli
from test_user_scheduler import JOB, Regression, data
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ConfigError, ThriftyError


def raising_factory(optimizer: torch.optim.Optimizer, warmup: int = 0) -> OneCycleLR:
    """A user's scheduler factory with a bug."""
    raise ValueError(f"warmup must be given\n(got {warmup})")


def job_with(tmp_path, task: str, run: str = "max_steps = 8") -> str:
    """test_user_scheduler's job with another task.scheduler and run budget."""
    text = JOB.replace("max_steps = 7", run)
    text = text[: text.index('scheduler = "')] + task
    (tmp_path / "job.toml").write_text(text)
    return str(tmp_path / "job.toml")


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (
            'scheduler = "test_sched_failures:raising_factory"\nscheduler_args = { warmup = 3 }\n',
            "thrifty: error: task.scheduler = 'test_sched_failures:raising_factory' raised "
            "ValueError: warmup must be given (got 3) when called on the optimizer: fix the "
            "factory or task.scheduler_args",
        ),
        (
            'scheduler = "torch.optim.lr_scheduler:OneCycleLR"\n'
            "scheduler_args = { max_lr = 0.1, total_steps = 5 }\n",
            "thrifty: error: task.scheduler = 'torch.optim.lr_scheduler:OneCycleLR' has "
            "total_steps = 5, fewer than the 8 optimizer steps this run steps it (run.max_steps "
            "= 8), and would fail at its step 6: give it total_steps = 8 (task.scheduler_args), "
            "or a smaller budget",
        ),
        (
            'scheduler = "torch.optim.lr_scheduler:CosineAnnealingLR"\n'
            "scheduler_args = { T_max = 0 }\n",
            "thrifty: error: task.scheduler = 'torch.optim.lr_scheduler:CosineAnnealingLR' "
            "fails at its step 1 of the 8 optimizer steps this run takes (run.max_steps = 8), "
            "found before training: ZeroDivisionError: integer modulo by zero; fix "
            "task.scheduler_args",
        ),
        (
            'scheduler = "torch.optim.lr_scheduler:StepLR"\nscheduler_args = { step_size = "2" }\n',
            "thrifty: error: task.scheduler = 'torch.optim.lr_scheduler:StepLR' fails at its "
            "step 1 of the 8 optimizer steps this run takes (run.max_steps = 8), found before "
            "training: TypeError: unsupported operand type(s) for %: 'int' and 'str'; fix "
            "task.scheduler_args",
        ),
    ],
    ids=["factory-raises", "one-cycle-too-short", "cosine-t-max-0", "step-size-text"],
)
def test_a_scheduler_that_would_fail_exits_2_with_one_line_before_training(
    tmp_path, capsys, task, message
):
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", job_with(tmp_path, task), "--out", str(out))
    assert (code, err) == (2, message + "\n")
    assert not (out / "metrics.jsonl").exists()  # not one step paid for


def test_per_epoch_a_one_cycle_lr_is_counted_in_epochs(tmp_path, capsys):
    task = (
        'scheduler = "torch.optim.lr_scheduler:OneCycleLR"\n'
        "scheduler_args = { max_lr = 0.1, total_steps = 3 }\n[schedule]\ninterval = 'epoch'\n"
    )
    job = job_with(tmp_path, task, run="max_epochs = 4")
    code, _, err = run_cli(capsys, "train", job, "--out", str(tmp_path / "run"))
    assert code == 2
    assert "has total_steps = 3, fewer than the 4 epochs this run steps it (run.max_epochs = " in (
        err
    )
    # Enough for 4 epochs (of 12 steps): it trains.
    job = job_with(tmp_path, task.replace("total_steps = 3", "total_steps = 4"), "max_epochs = 4")
    assert run_cli(capsys, "train", job, "--out", str(tmp_path / "ok"))[0] == 0


def config(out, **run) -> TrainConfig:
    run = {"device": "cpu", "out": str(out), "progress": "off", "log_every": 1} | run
    return TrainConfig.from_dict(
        {
            "run": run,
            "batch": {"micro": 8},
            "data": {"num_workers": 0},
            "checkpoint": {"every": "off"},
            "spot": {"provider": "none"},
        }
    )


def test_in_python_a_factory_that_raises_is_one_line_naming_it(tmp_path):
    with pytest.raises(ThriftyError) as error:
        Trainer(
            Regression(), data(), config(tmp_path / "run", max_steps=4), scheduler=raising_factory
        )
    assert str(error.value) == (
        "the scheduler factory raised ValueError: warmup must be given (got 0) when called on "
        "the optimizer: fix the factory or the scheduler's arguments"
    )


def test_in_python_a_scheduler_object_that_would_fail_is_refused_before_fit(tmp_path):
    m = Regression()
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(ConfigError) as error:
        Trainer(
            m,
            data(),
            config(tmp_path / "run", max_steps=4),
            optimizer=optimizer,
            scheduler=CosineAnnealingLR(optimizer, T_max=0),
        )
    assert str(error.value) == (
        "scheduler=CosineAnnealingLR fails at its step 1 of the 4 optimizer steps this run "
        "takes (run.max_steps = 4), found before training: ZeroDivisionError: integer modulo "
        "by zero; fix the scheduler's arguments"
    )
    # The rehearsal left the optimizer as it was.
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_with_a_time_budget_a_later_failure_is_said_at_set_up_and_met_in_one_line(tmp_path, caplog):
    # Steps unknown (run.max_time): the rehearsal finds OneCycleLR's end at its step 7; the
    # run trains, and at step 7 stops with one line, not a traceback.
    cfg = config(tmp_path / "run", max_time="1h")
    trainer = None
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        trainer = Trainer(
            Regression(),
            data(),
            cfg,
            scheduler=lambda optimizer: OneCycleLR(optimizer, max_lr=0.1, total_steps=6),
        )
    assert (
        "the scheduler factory's OneCycleLR fails at its step 7 (ValueError: Tried to step 7 "
        "times. The specified number of total steps is 6), found before training; this run's "
        "budget is not in steps, so it trains, and stops there with one line if it gets that "
        "far: fix the scheduler's arguments, or set run.max_steps" in caplog.messages
    )
    with pytest.raises(ThriftyError) as error:
        trainer.fit()
    assert str(error.value) == (
        "the scheduler factory's OneCycleLR failed at optimizer step 7 (ValueError: Tried to "
        "step 7 times. The specified number of total steps is 6): fix the scheduler's "
        "arguments, or give the run a budget in steps or epochs (run.max_steps, "
        "run.max_epochs) so that this is found before training"
    )


def test_with_a_time_budget_a_scheduler_failing_at_once_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"fails at its first step, found before training: Zero"):
        Trainer(
            Regression(),
            data(),
            config(tmp_path / "run", max_time="1h"),
            scheduler=lambda optimizer: CosineAnnealingLR(optimizer, T_max=0),
        )


def test_the_rehearsal_leaves_the_scheduler_its_optimizer_and_the_parameters_as_they_were():
    from torch.optim.lr_scheduler import ExponentialLR, LinearLR, SequentialLR

    from thrifty.levers.scheduler_checks import rehearse

    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    one_cycle = OneCycleLR(optimizer, max_lr=0.1, total_steps=50)  # moves betas too
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    state = one_cycle.state_dict()
    assert rehearse(one_cycle, 50) is None
    failed = rehearse(one_cycle, 60)
    assert failed is not None and failed[0] == 51
    assert one_cycle.state_dict() == state
    assert [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups] == groups
    assert optimizer.param_groups[0]["params"][0] is model.weight
    chained = SequentialLR(
        optimizer, [LinearLR(optimizer), ExponentialLR(optimizer, 0.9)], milestones=[5]
    )
    lr = optimizer.param_groups[0]["lr"]
    assert rehearse(chained, 100) is None
    assert optimizer.param_groups[0]["lr"] == lr and chained.last_epoch == 0
