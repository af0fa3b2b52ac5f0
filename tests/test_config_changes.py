"""A changed config on resume is never silent: safe changes are listed, optimization changes
refused unless allowed, a larger budget keeps the schedule's horizon."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch

from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig, load_config
from thrifty.errors import ConfigError
from thrifty.levers.schedule import build_scheduler, lr_multiplier
from thrifty.rundir.config_changes import (
    KINDS,
    OPTIMIZATION,
    SAFE,
    UNSET,
    Change,
    budget_grew,
    check_resume_changes,
    classify,
    diff_configs,
    format_applied,
    optimizer_settings,
    read_history,
    reapply_optimizer_settings,
    resume_horizon,
    write_run_config,
)
from thrifty.rundir.files import read_metrics


def saved(**sections) -> dict:
    sections.setdefault("run", {"max_steps": 100})
    return TrainConfig.from_dict(sections).to_dict(secrets=False)


def test_diff_lists_dotted_keys_with_old_and_new_values():
    old = saved(optimizer={"lr": 3e-4}, task={"model_args": {"width": 3}})
    new = saved(
        run={"max_steps": 200}, optimizer={"lr": 0.01}, task={"model_args": {"width": 3, "d": 1}}
    )
    assert diff_configs(old, new) == [
        Change("optimizer.lr", 3e-4, 0.01),
        Change("run.max_steps", 100, 200),
        Change("task.model_args.d", UNSET, 1),
    ]


def test_a_key_the_checkpoint_predates_compares_as_its_default():
    old = saved()
    del old["run"]["log_every"], old["spot"]  # written before these settings existed
    assert diff_configs(old, saved()) == []


def test_how_to_resume_is_not_a_change():
    old = saved(checkpoint={"resume": "auto", "storage_options": {"key": "k"}})
    new = saved(run={"max_steps": 100, "allow_config_change": True}, checkpoint={"resume": "/x"})
    assert diff_configs(old, new) == []


def every_key() -> list[str]:
    config = TrainConfig.from_dict({"run": {"max_steps": 1}})
    return [
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(config)
        for f in dataclasses.fields(getattr(config, section.name))
    ]


def test_every_config_key_is_classified_by_a_rule_not_by_the_fallback():
    for key in every_key():
        assert key.split(".")[0] in KINDS, key


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("run.max_steps", SAFE),
        ("run.max_time", SAFE),
        ("run.log_every", SAFE),
        ("run.device", SAFE),
        ("eval.every", SAFE),
        ("checkpoint.every", SAFE),
        ("checkpoint.location", SAFE),
        ("data.num_workers", SAFE),
        ("activation_checkpointing.policy", SAFE),
        ("distributed.timeout", SAFE),
        ("optimizer.lr", OPTIMIZATION),
        ("schedule.total_steps", OPTIMIZATION),
        ("optimizer.name", OPTIMIZATION),
        ("run.seed", OPTIMIZATION),
        ("precision.mode", OPTIMIZATION),
        ("batch.micro", OPTIMIZATION),
        ("data.shuffle", OPTIMIZATION),
        ("task.model_args.n_layer", OPTIMIZATION),
        ("newsection.setting", OPTIMIZATION),  # unknown: never applied without a word
    ],
)
def test_each_key_is_safe_or_changes_the_optimization(key, kind):
    assert classify(key) == kind


def test_safe_changes_pass_and_are_listed_in_one_line():
    old = saved(eval={"every": 100})
    changes = check_resume_changes(
        old, saved(run={"max_steps": 200}, eval={"every": 10}), allow=False
    )
    assert [c.key for c in changes.safe] == ["eval.every", "run.max_steps"]
    assert format_applied(changes, kept_horizon=100) == (
        "config changed on resume, applied: eval.every 100 → 10, run.max_steps 100 → 200; "
        "the learning-rate schedule keeps its horizon of 100 steps "
        "(set schedule.total_steps to change it)"
    )
    assert format_applied(check_resume_changes(old, old, allow=False)) is None


def test_optimization_changes_are_refused_with_the_list_and_the_fix():
    old = saved()
    new = saved(
        run={"max_steps": 100, "seed": 7}, optimizer={"lr": 0.01}, precision={"mode": "fp32"}
    )
    with pytest.raises(ConfigError) as err:
        check_resume_changes(old, new, allow=False)
    assert str(err.value) == (
        "the config changes the optimization of the checkpoint it resumes: "
        "optimizer.lr 0.0003 → 0.01, precision.mode 'auto' → 'fp32', run.seed 0 → 7; "
        "resume with the config that wrote the checkpoint, or pass --allow-config-change "
        "(run.allow_config_change = true) to apply the changes"
    )


def test_allowed_optimization_changes_are_applied_and_recorded():
    changes = check_resume_changes(saved(), saved(optimizer={"lr": 0.01}), allow=True)
    assert [c.key for c in changes.optimization] == ["optimizer.lr"]
    assert changes.keeps_optimizer_state
    assert changes.event() == {
        "event": "config_changed",
        "changes": [{"setting": "optimizer.lr", "kind": "optimization", "old": 3e-4, "new": 0.01}],
    }
    assert "optimizer.lr 0.0003 → 0.01 (allowed)" in format_applied(changes)
    other = check_resume_changes(saved(), saved(optimizer={"name": "sgd"}), allow=True)
    assert not other.keeps_optimizer_state


def test_giving_the_horizon_the_run_already_had_is_no_change():
    old = saved(run={"max_steps": 100})
    new = saved(run={"max_steps": 300}, schedule={"total_steps": 100})
    assert [c.key for c in check_resume_changes(old, new, allow=False).changes] == ["run.max_steps"]


def test_a_checkpoint_without_a_config_has_nothing_to_compare():
    assert check_resume_changes(None, saved(), allow=False).changes == ()


def test_a_larger_budget_keeps_the_horizon_unless_total_steps_is_given():
    old = saved(run={"max_steps": 100})
    assert resume_horizon(old, saved(run={"max_steps": 300}), steps_per_epoch=10) == 100
    given = saved(run={"max_steps": 300}, schedule={"total_steps": 300})
    assert resume_horizon(old, given, steps_per_epoch=10) == 300
    by_epochs = saved(run={"max_epochs": 2})
    assert resume_horizon(by_epochs, saved(run={"max_epochs": 5}), steps_per_epoch=10) == 20
    no_horizon = saved(run={"max_time": "1h"}, schedule={"decay": "constant"})
    assert resume_horizon(no_horizon, saved(run={"max_steps": 9}), steps_per_epoch=10) == 9


def test_budget_grew_says_when_a_finished_run_may_go_on():
    old = saved(run={"max_steps": 100, "max_time": "30m"})
    assert [c.key for c in budget_grew(old, saved(run={"max_steps": 200, "max_time": "30m"}))] == [
        "run.max_steps"
    ]
    assert [c.key for c in budget_grew(old, saved(run={"max_steps": 100, "max_time": "1h"}))] == [
        "run.max_time"
    ]
    assert budget_grew(old, saved(run={"max_steps": 50, "max_time": "30m"})) == []
    assert budget_grew(old, old) == []


def test_config_toml_keeps_the_current_config_and_every_earlier_value(tmp_path):
    path = tmp_path / "config.toml"
    first = saved(optimizer={"lr": 3e-4})
    write_run_config(path, first)
    assert read_history(path) == []
    second = saved(optimizer={"lr": 0.01})
    changes = check_resume_changes(first, second, allow=True)
    write_run_config(path, second, step=40, changes=changes.changes, resumed=True)
    third = saved(optimizer={"lr": 0.02}, eval={"every": 5})
    changes = check_resume_changes(second, third, allow=True)
    write_run_config(path, third, step=80, changes=changes.changes, resumed=True)
    assert load_config(path) == TrainConfig.from_dict(third)  # the run as it is now
    assert read_history(path) == [
        {"step": 40, "setting": "optimizer.lr", "kind": "optimization", "old": 3e-4, "new": 0.01},
        {"step": 80, "setting": "eval.every", "kind": "safe", "old": 100, "new": 5},
        {"step": 80, "setting": "optimizer.lr", "kind": "optimization", "old": 0.01, "new": 0.02},
    ]
    # Resuming again from the checkpoint at step 80 replays that resume, not adds to it.
    write_run_config(path, third, step=80, changes=changes.changes, resumed=True)
    assert len(read_history(path)) == 3
    write_run_config(path, third)  # a fresh start has no history
    assert read_history(path) == []


def test_reapplied_settings_give_the_new_rate_at_the_step_the_schedule_reached():
    def build(lr):
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
        for group in optimizer.param_groups:
            group["initial_lr"] = group["lr"]
        scheduler = build_scheduler(
            optimizer, warmup_steps=2, decay="cosine", total_steps=10, min_lr_ratio=0.1
        )
        return model, optimizer, scheduler

    model, optimizer, scheduler = build(3e-4)
    for _ in range(4):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
    state = (optimizer.state_dict(), scheduler.state_dict())

    _, resumed, resumed_scheduler = build(0.01)
    resumed.param_groups[0]["weight_decay"] = 0.5  # another changed setting
    settings = optimizer_settings(resumed)
    resumed.load_state_dict(state[0])
    resumed_scheduler.load_state_dict(state[1])
    assert resumed.param_groups[0]["lr"] == pytest.approx(3e-4 * factor(4))  # the old rate
    reapply_optimizer_settings(resumed, resumed_scheduler, settings)
    group = resumed.param_groups[0]
    assert group["lr"] == pytest.approx(0.01 * factor(4))
    assert group["weight_decay"] == 0.5 and group["initial_lr"] == 0.01
    assert len(resumed.state) == 2  # the moments were kept
    resumed_scheduler.step()
    assert group["lr"] == pytest.approx(0.01 * factor(5))


def factor(step: int) -> float:
    return lr_multiplier(step, warmup_steps=2, decay="cosine", total_steps=10, min_lr_ratio=0.1)


# --------------------------------------------------------------------------------------------
# With a Trainer


def run_config(out, steps, **extra) -> TrainConfig:
    sections = {
        "run": {"max_steps": steps, "device": "cpu", "out": str(out), "progress": "off"},
        "batch": {"micro": 4},
        "data": {"num_workers": 0},
        "optimizer": {"lr": 1e-2},
        "schedule": {"warmup_steps": 0, "decay": "cosine", "min_lr_ratio": 0.1},
        "checkpoint": {"every": "off"},
        "spot": {"provider": "none"},
    }
    for name, value in extra.items():  # optimizer__lr=0.05 sets optimizer.lr
        section, key = name.split("__")
        sections.setdefault(section, {})[key] = value
    return TrainConfig.from_dict(sections)


def fit(out, steps, **extra):
    model = tiny_gpt()
    return Trainer(model, TokenDataset(n=64), run_config(out, steps, **extra)).fit()


def extend(out, steps, **extra):
    """Go on from the final checkpoint of a finished run (summary.json moved away)."""
    (out / "summary.json").unlink()
    return fit(out, steps, **extra)


def lrs(out) -> dict[int, float]:
    return {r["step"]: r["lr"] for r in read_metrics(out / "metrics.jsonl") if "lr" in r}


def test_a_larger_max_steps_keeps_the_schedule_so_the_rate_does_not_jump(tmp_path, caplog):
    out = tmp_path / "run"
    fit(out, 4)
    with caplog.at_level(logging.INFO, logger="thrifty"):
        result = extend(out, 8)
    assert result.steps == 8
    rates = lrs(out)
    assert all(rates[step] == pytest.approx(1e-2 * 0.1) for step in range(5, 9))
    assert "config changed on resume, applied: run.max_steps 4 → 8" in caplog.text
    assert "keeps its horizon of 4 steps" in caplog.text


def test_a_changed_learning_rate_is_refused_then_applied_when_allowed(tmp_path):
    out = tmp_path / "run"
    fit(out, 4)
    (out / "summary.json").rename(out / "summary.kept")
    with pytest.raises(ConfigError, match=r"optimizer\.lr 0\.01 → 0\.05; resume with the config"):
        fit(out, 8, optimizer__lr=0.05)
    (out / "summary.kept").rename(out / "summary.json")
    extend(out, 8, optimizer__lr=0.05, run__allow_config_change=True)
    rates = lrs(out)
    assert all(rates[step] == pytest.approx(0.05 * 0.1) for step in range(5, 9))
    events = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "config_changed"]
    assert events == [
        {
            "step": 4,
            "event": "config_changed",
            "changes": [
                {"setting": "optimizer.lr", "kind": "optimization", "old": 0.01, "new": 0.05},
                {"setting": "run.max_steps", "kind": "safe", "old": 4, "new": 8},
            ],
        }
    ]
    assert load_config(out / "config.toml").optimizer.lr == 0.05
    assert [e["setting"] for e in read_history(out / "config.toml")] == [
        "optimizer.lr",
        "run.max_steps",
    ]
