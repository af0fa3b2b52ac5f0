"""A user's own learning-rate scheduler is used or refused, never ignored: stepped once per
optimizer step in place of [schedule], taken back for skipped steps, checkpointed and resumed
bit for bit; one on another optimizer, one that needs a metric, or one no checkpoint can hold is
refused in one line."""

from __future__ import annotations

import logging
import math
import os
import signal

import pytest
import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR, LRScheduler, ReduceLROnPlateau, StepLR

from test_cli import run_cli
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ConfigError, ThriftyError
from thrifty.levers.user_scheduler import UserScheduler
from thrifty.measure.guard import rewind_schedule, scale_learning_rate
from thrifty.rundir.files import read_metrics

FEATURES = 6
LR = 0.1


def step_lr_rates(steps: int, lr: float = LR) -> list[float]:
    """What StepLR(step_size=3, gamma=0.5) sets at each optimizer step."""
    return [lr * 0.5 ** (i // 3) for i in range(steps)]


# --- the task: a small regression, as factories a config's [task] can name -------------------


class Regression(nn.Module):
    """A two-layer net returning its MSE loss; SIGTERMs this process on its `at`-th training
    forward (what a spot reclaim looks like from inside the loop)."""

    def __init__(self, at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))
        self.at, self.calls = at, 0

    def forward(self, x, y):
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
        return nn.functional.mse_loss(self.net(x), y)


def model() -> nn.Module:
    return Regression()


def data(n: int = 96, nan: range | None = None) -> torch.utils.data.TensorDataset:
    """y = x·w plus noise; rows in `nan` get a NaN feature (a broken record)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, FEATURES, generator=g)
    y = x @ torch.randn(FEATURES, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g)
    if nan is not None:
        x[nan.start : nan.stop, 0] = math.nan
    return torch.utils.data.TensorDataset(x, y)


def sgd(module: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(module.parameters(), lr=LR)


def step_lr(optimizer: torch.optim.Optimizer) -> StepLR:
    return StepLR(optimizer, step_size=3, gamma=0.5)


def config(out, steps: int = 8, **sections) -> TrainConfig:
    base = {
        "run": {
            "max_steps": steps,
            "device": "cpu",
            "out": str(out),
            "progress": "off",
            "log_every": 1,
            "deterministic": True,
        },
        "batch": {"micro": 8},
        "data": {"num_workers": 0},
        "checkpoint": {"every": "off"},
        "spot": {"provider": "none"},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return TrainConfig.from_dict(base)


def rates(out) -> dict[int, float]:
    """The learning rate each step of a run trained with, from its metrics.jsonl."""
    return {r["step"]: r["lr"] for r in read_metrics(out / "metrics.jsonl") if "lr" in r}


def losses(out) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


# --- used ---------------------------------------------------------------------------------------


def built_on_the_users_optimizer():
    m = Regression()
    optimizer = sgd(m)
    return m, {"optimizer": optimizer, "scheduler": step_lr(optimizer)}


def factory_on_thriftys_optimizer():
    return Regression(), {"scheduler": step_lr}


def factory_on_the_users_factory():
    return Regression(), {"optimizer": sgd, "scheduler": step_lr}


@pytest.mark.parametrize(
    "given",
    [built_on_the_users_optimizer, factory_on_thriftys_optimizer, factory_on_the_users_factory],
    ids=["object", "factory-thrifty-optimizer", "factory-user-optimizer"],
)
def test_a_users_step_lr_sets_the_rate_of_every_step_not_thriftys_cosine(tmp_path, given):
    m, arguments = given()
    cfg = config(tmp_path / "run", optimizer={"name": "sgd", "lr": LR})
    result = Trainer(m, data(), cfg, **arguments).fit()
    assert result.steps == 8
    assert list(rates(tmp_path / "run").values()) == step_lr_rates(8)


def halving_lambda(optimizer: torch.optim.Optimizer) -> LambdaLR:
    """StepLR(step_size=3, gamma=0.5) as a LambdaLR: rates from the base rates, not the last."""
    return LambdaLR(optimizer, lambda step: 0.5 ** (step // 3))


@pytest.mark.parametrize("build", [step_lr, halving_lambda], ids=["step-lr", "lambda-lr"])
@pytest.mark.parametrize("form", ["object", "factory"])
def test_the_linear_scaling_rule_scales_a_users_scheduler_alike(tmp_path, build, form):
    # reference_batch 4, effective batch 8: every rate twice the scheduler's.
    m = Regression()
    if form == "object":
        optimizer = sgd(m)
        arguments = {"optimizer": optimizer, "scheduler": build(optimizer)}
    else:
        arguments = {"optimizer": sgd, "scheduler": build}
    cfg = config(tmp_path / "run", steps=5, optimizer={"reference_batch": 4})
    Trainer(m, data(), cfg, **arguments).fit()
    assert list(rates(tmp_path / "run").values()) == step_lr_rates(5, 2 * LR)


def test_a_users_scheduler_needs_no_cosine_horizon(tmp_path):
    run = {"max_time": "1h", "device": "cpu", "out": str(tmp_path / "run")}
    cfg = TrainConfig.from_dict({"run": run, "data": {"num_workers": 0}})
    with pytest.raises(ConfigError, match="schedule.decay = 'cosine' needs a horizon"):
        Trainer(Regression(), data(), cfg).close()
    Trainer(Regression(), data(), cfg, scheduler=step_lr).close()  # StepLR has no horizon


JOB = """
[run]
max_steps = 7
log_every = 1
progress = "off"
device = "cpu"
[batch]
micro = 8
[data]
num_workers = 0
[optimizer]
name = "sgd"
lr = 0.1
[checkpoint]
every = "off"
[spot]
provider = "none"
[task]
model = "test_user_scheduler:model"
train_data = "test_user_scheduler:data"
scheduler = "torch.optim.lr_scheduler:StepLR"
scheduler_args = { step_size = 3, gamma = 0.5 }
"""


def test_thrifty_train_steps_the_scheduler_task_scheduler_names(tmp_path, capsys, caplog):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        code, _, err = run_cli(capsys, "train", str(job), "--out", str(tmp_path / "run"))
    assert code == 0, err
    assert list(rates(tmp_path / "run").values()) == step_lr_rates(7)
    assert "[schedule] is ignored" not in caplog.text  # no [schedule] settings: nothing to say


def test_with_schedule_settings_too_the_users_scheduler_wins_and_one_line_says_so(
    tmp_path, capsys, caplog
):
    job = tmp_path / "job.toml"
    job.write_text(JOB + '[schedule]\nwarmup_steps = 5\ndecay = "constant"\n')
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        code, _, err = run_cli(capsys, "train", str(job), "--out", str(tmp_path / "run"))
    assert code == 0, err
    lines = [r.getMessage() for r in caplog.records if "[schedule] is ignored" in r.getMessage()]
    assert lines == [
        "task.scheduler = 'torch.optim.lr_scheduler:StepLR' sets the learning rate; "
        "[schedule] is ignored: schedule.warmup_steps = 5, schedule.decay = 'constant' (remove "
        "those settings, or the scheduler to use them)"
    ]
    # No warmup: the rates are StepLR's from the first step.
    assert list(rates(tmp_path / "run").values()) == step_lr_rates(7)


def test_through_the_api_the_line_names_the_scheduler_and_the_ignored_settings(tmp_path, caplog):
    m, arguments = built_on_the_users_optimizer()
    cfg = config(tmp_path / "run", steps=4, schedule={"min_lr_ratio": 0.5, "total_steps": 100})
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        Trainer(m, data(), cfg, **arguments).fit()
    assert (
        "scheduler=StepLR sets the learning rate; [schedule] is ignored: "
        "schedule.min_lr_ratio = 0.5, schedule.total_steps = 100" in caplog.text
    )
    assert list(rates(tmp_path / "run").values()) == step_lr_rates(4)


# --- resumed exactly --------------------------------------------------------------------------


def train(out, at=None, steps=12, scheduler=step_lr, **sections):
    m = Regression(at)
    sections = {"optimizer": {"name": "sgd", "lr": LR}, "eval": {"every": 5}} | sections
    sections["optimizer"] = {"name": "sgd", **sections["optimizer"]}
    cfg = config(out, steps=steps, **sections)
    result = Trainer(m, data(), cfg, scheduler=scheduler, val_data=data(16)).fit()
    return m, result


@pytest.mark.parametrize("at", [5, 8], ids=["inside-a-step-size", "at-a-decay"])
def test_a_run_killed_and_resumed_follows_the_users_scheduler_bit_for_bit(tmp_path, at):
    reference, _ = train(tmp_path / "ref")
    _, first = train(tmp_path / "cut", at=at)
    assert first.stop_reason == "preempted" and first.steps < 12
    resumed, second = train(tmp_path / "cut")
    assert second.steps == 12 and second.stop_reason == "max_steps"
    assert rates(tmp_path / "cut") == rates(tmp_path / "ref")
    assert list(rates(tmp_path / "ref").values()) == step_lr_rates(12)
    assert losses(tmp_path / "cut") == losses(tmp_path / "ref")
    for a, b in zip(reference.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    # The final checkpoints hold the same scheduler state (StepLR's counters and rates).
    final = {run: newest_checkpoint(tmp_path / run) for run in ("ref", "cut")}
    assert final["cut"]["scheduler"] == final["ref"]["scheduler"]
    assert final["cut"]["scheduler"]["last_epoch"] == 12
    assert final["cut"]["scheduler_kind"] == "torch.optim.lr_scheduler.StepLR"


def newest_checkpoint(out) -> dict:
    from thrifty.checkpointing.store.loading import load_checkpoint

    return load_checkpoint(str(sorted((out / "checkpoints").glob("step-*"))[-1]))


def test_a_resume_with_another_scheduler_is_refused_in_one_line(tmp_path):
    train(tmp_path / "run", at=5, scheduler=None)  # thrifty's cosine wrote the checkpoint
    with pytest.raises(ConfigError) as error:
        train(tmp_path / "run", scheduler=step_lr)
    assert str(error.value).startswith(
        "the checkpoint's learning rate follows thrifty's [schedule] and this run's "
        "torch.optim.lr_scheduler.StepLR: resume with the scheduler that wrote it, or pass "
        "--allow-config-change (run.allow_config_change = true) to start this run's at the step "
        "the checkpoint reached"
    )
    assert "\n" not in str(error.value)


def test_with_allow_config_change_another_scheduler_starts_at_the_step_reached(tmp_path):
    train(tmp_path / "run", at=5, scheduler=None, schedule={"decay": "constant"})
    first = max(rates(tmp_path / "run"))
    _, result = train(tmp_path / "run", run={"allow_config_change": True})
    assert result.steps == 12
    after = [lr for step, lr in sorted(rates(tmp_path / "run").items()) if step > first]
    assert after == step_lr_rates(12)[first:]


def test_a_resume_with_another_lr_and_allow_config_change_scales_the_users_rates(tmp_path):
    train(tmp_path / "run", at=5)
    first = max(rates(tmp_path / "run"))
    _, result = train(tmp_path / "run", optimizer={"lr": 2 * LR}, run={"allow_config_change": True})
    assert result.steps == 12
    after = [lr for step, lr in sorted(rates(tmp_path / "run").items()) if step > first]
    assert after == pytest.approx(step_lr_rates(12, 2 * LR)[first:], rel=1e-12)


def test_other_scheduler_args_on_resume_are_refused_or_with_allow_start_at_the_step(
    tmp_path, capsys
):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    out = str(tmp_path / "run")
    assert run_cli(capsys, "train", str(job), "--out", out, "--steps", "4")[0] == 0
    other = ["--steps", "8", "--set", "task.scheduler_args.gamma=0.25"]
    code, _, err = run_cli(capsys, "train", str(job), "--out", out, *other)
    assert code == 2
    assert "task.scheduler_args.gamma 0.5 → 0.25" in err
    code, _, err = run_cli(capsys, "train", str(job), "--out", out, *other, "--allow-config-change")
    assert code == 0, err
    # StepLR(gamma=0.25) from its step 4 on, not the checkpoint's gamma = 0.5.
    assert list(rates(tmp_path / "run").values())[4:] == [
        LR * 0.25 ** (i // 3) for i in range(4, 8)
    ]


# --- skipped steps ------------------------------------------------------------------------------


def test_a_skipped_step_does_not_step_the_users_scheduler(tmp_path):
    # Window 4 (rows 24..31) holds a broken record: the guard leaves step 4 out. The run ends
    # with the weights of one whose data never held it: no update and no schedule step.
    broken = range(24, 32)
    cfg = config(tmp_path / "g", steps=9, data={"shuffle": False}, optimizer={"grad_clip": 0})
    guarded = Regression()
    result = Trainer(guarded, data(nan=broken), cfg, optimizer=sgd, scheduler=step_lr).fit()
    assert result.guard["skipped_steps"] == 1
    reference = Regression()
    kept = torch.utils.data.Subset(data(nan=broken), [i for i in range(96) if i not in broken])
    cfg = config(tmp_path / "r", steps=8, data={"shuffle": False}, optimizer={"grad_clip": 0})
    Trainer(reference, kept, cfg, optimizer=sgd, scheduler=step_lr).fit()
    for a, b in zip(guarded.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert rates(tmp_path / "g")[9] == rates(tmp_path / "r")[8] == step_lr_rates(8)[7]


def test_rewinding_replays_the_scheduler_to_the_steps_that_were_not_skipped():
    p = nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([p], lr=1.0)
    user = UserScheduler(StepLR(optimizer, step_size=2, gamma=0.5))
    for _ in range(3):
        optimizer.step()
        user.step()
    rewind_schedule(user, 0)  # a metrics flush: nothing skipped
    for _ in range(7):  # steps 4..10, two of them found skipped at the next flush
        optimizer.step()
        user.step()
    rewind_schedule(user, 2)
    assert user.last_epoch == 8
    assert optimizer.param_groups[0]["lr"] == user.get_last_lr()[0] == 0.5**4
    scale_learning_rate(user, 0.5)  # a rollback halves the rate, and the schedule goes on
    for _ in range(2):
        optimizer.step()
        user.step()
    assert optimizer.param_groups[0]["lr"] == 0.5**6


# --- refused --------------------------------------------------------------------------------


class HoldsAnObject(LRScheduler):
    def __init__(self, optimizer) -> None:
        self.owner = object()
        super().__init__(optimizer)

    def get_lr(self):
        return [group["lr"] for group in self.optimizer.param_groups]


def elsewhere() -> torch.optim.Optimizer:
    return torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            lambda: {"optimizer": sgd, "scheduler": step_lr(elsewhere())},
            "scheduler=StepLR is built on another optimizer than the one thrifty trains: pass "
            "that optimizer too (optimizer=...), or the scheduler as a factory "
            "(scheduler=lambda optimizer: StepLR(optimizer, ...))",
        ),
        (
            lambda: {"scheduler": step_lr(elsewhere())},
            "scheduler=StepLR is built on another optimizer than the one thrifty trains",
        ),
        (
            lambda: {"scheduler": lambda optimizer: step_lr(elsewhere())},
            "the scheduler factory returned a StepLR built on another optimizer: build it on "
            "the optimizer it is given",
        ),
        (
            lambda: {"scheduler": lambda optimizer: optimizer},
            "the scheduler factory returned an object of type AdamW, not a "
            "torch.optim.lr_scheduler.LRScheduler: return one built on the optimizer it is given",
        ),
        (
            lambda: {"scheduler": ReduceLROnPlateau},
            "the scheduler factory returned a ReduceLROnPlateau, which steps on a metric "
            "(step(metrics)), and thrifty steps the scheduler once per optimizer step, with "
            "none: use a scheduler of steps (StepLR, LambdaLR, OneCycleLR, SequentialLR, ...), "
            "or early_stopping.patience to stop on a plateau",
        ),
        (
            lambda: {"scheduler": HoldsAnObject},
            "the scheduler factory returned a HoldsAnObject, which cannot be checkpointed: its "
            "state_dict()'s state['owner'] is a builtins.object",
        ),
        (
            lambda: {"scheduler": 3},
            "scheduler= is an object of type int: pass a torch.optim.lr_scheduler.LRScheduler built on the "
            "optimizer, or a factory optimizer -> LRScheduler",
        ),
    ],
    ids=[
        "object-on-another",
        "object-without-optimizer",
        "factory-on-another",
        "not-a-scheduler",
        "plateau",
        "not-checkpointable",
        "not-callable",
    ],
)
def test_a_scheduler_thrifty_cannot_step_is_refused_in_one_line(tmp_path, arguments, message):
    with pytest.raises(ThriftyError) as error:
        Trainer(Regression(), data(), config(tmp_path / "run"), **arguments())
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_a_plateau_scheduler_built_on_the_optimizer_is_refused_too(tmp_path):
    m = Regression()
    optimizer = sgd(m)
    with pytest.raises(ThriftyError, match=r"^scheduler=ReduceLROnPlateau steps on a metric"):
        Trainer(
            m,
            data(),
            config(tmp_path / "run"),
            optimizer=optimizer,
            scheduler=ReduceLROnPlateau(optimizer),
        )


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            'scheduler = "torch.optim.lr_scheduler:ReduceLROnPlateau"\n',
            "thrifty: error: task.scheduler = 'torch.optim.lr_scheduler:ReduceLROnPlateau' "
            "returned a ReduceLROnPlateau, which steps on a metric",
        ),
        (
            'scheduler = "torch.optim.lr_scheduler:StepLR"\nscheduler_args = { step_size = 3, step = 3 }\n',
            "thrifty: error: task.scheduler_args does not fit task.scheduler = "
            "'torch.optim.lr_scheduler:StepLR': got an unexpected keyword argument 'step'; it "
            "takes (optimizer, step_size, gamma, last_epoch), the optimizer first",
        ),
        (
            "scheduler_args = { step_size = 3 }\n",
            "thrifty: error: task.scheduler_args = {'step_size': 3} is invalid: needs "
            "task.scheduler, the factory they are passed to",
        ),
        (
            'scheduler = "torch.optim.lr_scheduler:NoSuchLR"\n',
            "thrifty: error: task.scheduler = 'torch.optim.lr_scheduler:NoSuchLR' does not import",
        ),
    ],
    ids=["plateau", "wrong-argument", "arguments-without-scheduler", "not-importable"],
)
def test_a_bad_task_scheduler_exits_2_with_one_line(tmp_path, capsys, lines, message):
    job = tmp_path / "job.toml"
    task = JOB[JOB.index("[task]") :].splitlines()[:3]
    job.write_text(JOB[: JOB.index("[task]")] + "\n".join(task) + "\n" + lines)
    code, _, err = run_cli(capsys, "train", str(job), "--out", str(tmp_path / "run"))
    assert code == 2
    assert err.startswith(message), err
    assert len(err.strip().splitlines()) == 1


def test_a_users_lambda_lr_is_stepped_like_any_other(tmp_path):
    m = Regression()
    optimizer = sgd(m)
    warm = LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
    Trainer(m, data(), config(tmp_path / "run", steps=6), optimizer=optimizer, scheduler=warm).fit()
    assert list(rates(tmp_path / "run").values()) == pytest.approx(
        [LR * min(1.0, (s + 1) / 4) for s in range(6)], abs=0
    )
