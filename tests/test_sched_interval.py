"""A user's scheduler is stepped per optimizer step or per epoch, as `schedule.interval` says;
the set-up says which; a schedule that takes the rate to nearly nothing in the run's first tenth
is named once by the guard, with the interval as the likely fix; a run stopped mid-epoch and
resumed trains with the uninterrupted run's rates and weights, at either interval."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.optim.lr_scheduler import StepLR

from test_cli import run_cli
from test_user_scheduler import JOB as USER_SCHEDULER_JOB
from test_user_scheduler import LR, Regression, data, losses, newest_checkpoint, rates
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ConfigError
from thrifty.levers.scheduler_checks import CollapseWatch

EPOCH = 12  # optimizer steps in an epoch: 96 rows, micro-batch 8


def config(out, epochs: int = 3, **sections) -> TrainConfig:
    base = {
        "run": {
            "max_epochs": epochs,
            "device": "cpu",
            "out": str(out),
            "progress": "off",
            "log_every": 1,
            "deterministic": True,
        },
        "batch": {"micro": 8},
        "data": {"num_workers": 0},
        "optimizer": {"name": "sgd", "lr": LR},
        "checkpoint": {"every": "off"},
        "spot": {"provider": "none"},
        "eval": {"every": 7},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return TrainConfig.from_dict(base)


def halving_per_epoch(optimizer: torch.optim.Optimizer) -> StepLR:
    """StepLR as PyTorch's docs use it: halve the rate after each epoch."""
    return StepLR(optimizer, step_size=1, gamma=0.5)


def halving_every_five(optimizer: torch.optim.Optimizer) -> StepLR:
    """A schedule of optimizer steps: halve the rate every 5 steps."""
    return StepLR(optimizer, step_size=5, gamma=0.5)


def test_per_epoch_the_scheduler_steps_once_when_an_epoch_of_steps_completes(tmp_path, caplog):
    cfg = config(tmp_path / "run", schedule={"interval": "epoch"})
    with caplog.at_level(logging.INFO, logger="thrifty"):
        result = Trainer(Regression(), data(), cfg, scheduler=halving_per_epoch).fit()
    assert result.steps == 3 * EPOCH
    assert list(rates(tmp_path / "run").values()) == [LR * 0.5 ** (i // EPOCH) for i in range(36)]
    assert (
        "learning rate: the scheduler factory's StepLR, stepped once per epoch of 12 optimizer "
        "steps (schedule.interval = 'epoch')" in caplog.messages
    )
    assert not [m for m in caplog.messages if m.startswith("guard:")]


def test_per_epoch_a_skipped_step_still_ends_its_epoch_on_time(tmp_path):
    # Window 4 of each epoch holds a broken record: the guard leaves steps 4 and 16 out, but
    # their data was seen, so each epoch still ends after 12 steps and the rate halves there.
    cfg = config(tmp_path / "run", 2, schedule={"interval": "epoch"}, data={"shuffle": False})
    result = Trainer(Regression(), data(nan=range(24, 32)), cfg, scheduler=halving_per_epoch).fit()
    assert result.guard["skipped_steps"] == 2
    assert list(rates(tmp_path / "run").values()) == [LR * 0.5 ** (i // EPOCH) for i in range(24)]


def test_per_step_by_default_and_the_set_up_line_says_so(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="thrifty"):
        Trainer(
            Regression(), data(), config(tmp_path / "run", 1), scheduler=halving_every_five
        ).fit()
    assert list(rates(tmp_path / "run").values()) == [LR * 0.5 ** (i // 5) for i in range(EPOCH)]
    assert (
        "learning rate: the scheduler factory's StepLR, stepped once per optimizer step "
        "(schedule.interval = 'step')" in caplog.messages
    )


def test_per_epoch_for_thriftys_own_schedule_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        Trainer(Regression(), data(), config(tmp_path / "run", schedule={"interval": "epoch"}))
    assert str(error.value) == (
        "schedule.interval = 'epoch' is invalid without a scheduler of your own: thrifty's "
        "[schedule] counts optimizer steps (schedule.warmup_steps, schedule.total_steps); name "
        "one with task.scheduler (or Trainer(scheduler=...)), or remove schedule.interval"
    )


class Rows(torch.utils.data.IterableDataset):
    """The regression's rows as a stream: no length, so no epoch to count."""

    def __iter__(self):
        rows = data()
        return (rows[i] for i in range(len(rows)))


def test_per_epoch_on_a_stream_is_refused_in_one_line(tmp_path):
    cfg = config(tmp_path / "run", None, run={"max_steps": 4}, schedule={"interval": "epoch"})
    with pytest.raises(ConfigError) as error:
        Trainer(Regression(), Rows(), cfg, scheduler=halving_per_epoch)
    assert str(error.value) == (
        "schedule.interval = 'epoch' needs the optimizer steps of an epoch, which this run "
        "does not know: give data of known length and run.max_epochs, or step the scheduler "
        "per optimizer step (schedule.interval = 'step')"
    )


def test_an_interval_that_is_neither_is_refused_in_python_too():
    from thrifty.config import ScheduleConfig

    with pytest.raises(ConfigError, match=r"^schedule.interval = 'batch' is invalid: use 'step'"):
        ScheduleConfig(interval="batch")


# --- the guard names a schedule that collapsed early --------------------------------------------

# test_user_scheduler's job, over 4 epochs with a StepLR that collapses within the first tenth.
JOB = USER_SCHEDULER_JOB.replace("max_steps = 7", "max_epochs = 4").replace(
    "step_size = 3, gamma = 0.5", "step_size = 2, gamma = 0.01"
)


def test_a_step_lr_written_per_epoch_and_stepped_per_step_is_named_once(tmp_path, capsys, caplog):
    # 48 steps: StepLR(step_size=2, gamma=0.01) per step is at 1e-5 of 0.1 by step 4, the
    # first tenth of the run, and at 1e-48 by its end.
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        code, _, err = run_cli(capsys, "train", str(job), "--out", str(tmp_path / "run"))
    assert code == 0, err
    named = [m for m in caplog.messages if m.startswith("guard:")]
    assert named == [
        "guard: task.scheduler = 'torch.optim.lr_scheduler:StepLR' took the learning rate from "
        "0.1 to 1e-05 by optimizer step 4, below 0.001 of its start within the first tenth of "
        "the run's 48 steps: it is stepped once per optimizer step (schedule.interval = "
        "'step'); a scheduler written per epoch, as PyTorch's StepLR, MultiStepLR and "
        "ExponentialLR are, needs schedule.interval = 'epoch' (or check task.scheduler_args)"
    ]


def test_the_same_step_lr_per_epoch_trains_and_nothing_is_named(tmp_path, capsys, caplog):
    job = tmp_path / "job.toml"
    job.write_text(JOB + '[schedule]\ninterval = "epoch"\n')
    with caplog.at_level(logging.INFO, logger="thrifty"):
        code, _, err = run_cli(capsys, "train", str(job), "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert not [m for m in caplog.messages if m.startswith("guard:")]
    assert "stepped once per epoch of 12 optimizer steps (schedule.interval = 'epoch')" in (
        caplog.text
    )
    lrs = list(rates(tmp_path / "run").values())
    assert lrs == pytest.approx([0.1 * 0.01 ** (i // 24) for i in range(48)], rel=1e-12)


def test_with_the_guard_off_nothing_is_named(tmp_path, capsys, caplog):
    job = tmp_path / "job.toml"
    job.write_text(JOB + "[guard]\nenabled = false\n")
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        code, _, err = run_cli(capsys, "train", str(job), "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert not [m for m in caplog.messages if m.startswith("guard:")]


def watched(planned, start: float = 1.0):
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=start)
    return optimizer, CollapseWatch.of("scheduler=StepLR", optimizer, planned, "FIX")


def test_with_no_horizon_in_steps_the_first_thousand_steps_are_watched(caplog):
    optimizer, watch = watched(None)
    optimizer.param_groups[0]["lr"] = 1e-4
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        watch.at_flush(999, optimizer)
        watch.at_flush(1000, optimizer)  # said once
    assert caplog.messages == [
        "guard: scheduler=StepLR took the learning rate from 1 to 0.0001 by optimizer step 999, "
        "below 0.001 of its start within the first 1000 steps watched (the run's length in "
        "steps is not known): FIX"
    ]


def test_a_rate_that_falls_after_the_first_tenth_is_not_named(caplog):
    optimizer, watch = watched(100)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        watch.at_flush(10, optimizer)
        optimizer.param_groups[0]["lr"] = 1e-6
        watch.at_flush(20, optimizer)
    assert caplog.messages == []


def test_a_first_flush_after_the_first_tenth_is_judged(caplog):
    # run.log_every longer than the tenth: the first flush is the only look there is.
    optimizer, watch = watched(100)
    optimizer.param_groups[0]["lr"] = 1e-6
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        watch.at_flush(50, optimizer)
    assert len(caplog.messages) == 1
    assert " to 1e-06 by optimizer step 50, below 0.001 of its start " in caplog.messages[0]


# --- resumed exactly, mid-epoch ----------------------------------------------------------------


def train(out, interval: str, at: int | None = None):
    scheduler = halving_per_epoch if interval == "epoch" else halving_every_five
    m = Regression(at)
    cfg = config(out, schedule={"interval": interval})
    result = Trainer(m, data(), cfg, scheduler=scheduler, val_data=data(16)).fit()
    return m, result


@pytest.mark.parametrize("interval", ["epoch", "step"])
def test_a_run_stopped_mid_epoch_and_resumed_trains_as_the_uninterrupted_one(tmp_path, interval):
    reference, _ = train(tmp_path / "ref", interval)
    _, first = train(tmp_path / "cut", interval, at=EPOCH + 5)  # a SIGTERM in the second epoch
    assert first.stop_reason == "preempted" and EPOCH < first.steps < 2 * EPOCH
    resumed, second = train(tmp_path / "cut", interval)
    assert second.steps == 3 * EPOCH
    assert rates(tmp_path / "cut") == rates(tmp_path / "ref")
    every = EPOCH if interval == "epoch" else 5
    assert list(rates(tmp_path / "ref").values()) == [LR * 0.5 ** (i // every) for i in range(36)]
    assert losses(tmp_path / "cut") == losses(tmp_path / "ref")
    for a, b in zip(reference.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    final = {run: newest_checkpoint(tmp_path / run)["scheduler"] for run in ("ref", "cut")}
    assert final["cut"] == final["ref"]
    assert final["cut"]["thrifty_optimizer_steps"] == 36
    assert final["cut"]["last_epoch"] == (3 if interval == "epoch" else 36)


def test_a_resume_at_another_interval_is_refused_as_a_change_of_the_optimization(tmp_path):
    train(tmp_path / "run", "step", at=EPOCH + 5)
    with pytest.raises(ConfigError, match=r"schedule.interval 'step' → 'epoch'"):
        train(tmp_path / "run", "epoch")
