"""SPACE.toml: each table a config key with a range or choices, checked against the config
before any trial runs; every mistake is one line naming the key and the fix."""

from __future__ import annotations

import optuna
import pytest

from thrifty.errors import ConfigError
from thrifty.search.sweep.space import parse_space

BASE = {"run": {"max_steps": 10, "device": "cpu"}, "batch": {"micro": 8, "effective": 16}}


def test_a_space_gives_each_trial_a_value_of_the_type_the_config_takes() -> None:
    space = parse_space(
        {
            "optimizer.lr": {"low": 1e-4, "high": 3e-2, "log": True},
            "batch.effective": {"choices": [16, 32, 64]},
            "batch.micro": {"low": 4, "high": 16, "step": 4},
            "precision.mode": {"choices": ["fp32", "bf16"]},
        },
        BASE,
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        values = space.suggest(study.ask())
        assert 1e-4 <= values["optimizer.lr"] <= 3e-2 and isinstance(values["optimizer.lr"], float)
        assert values["batch.effective"] in (16, 32, 64)
        assert values["batch.micro"] in (4, 8, 12, 16) and isinstance(values["batch.micro"], int)
        assert values["precision.mode"] in ("fp32", "bf16")


def test_a_resumed_trial_keeps_the_values_it_had() -> None:
    space = parse_space({"optimizer.lr": {"low": 1e-4, "high": 1e-1, "log": True}}, BASE)
    study = optuna.create_study()
    trial = study.ask()
    first = space.suggest(trial)
    again = optuna.Trial(study, trial._trial_id)  # what a worker resuming it holds
    assert space.suggest(again) == first


@pytest.mark.parametrize(
    ("table", "words"),
    [
        ({"optimizer.lrr": {"low": 0.1, "high": 1.0}}, "unknown key optimizer.lrr"),
        ({"lr": {"low": 0.1, "high": 1.0}}, "is not a config key; use section.key"),
        ({"optimizer.lr": {"low": 0.1, "high": 0.1}}, "is empty: low must be below high"),
        ({"optimizer.lr": {"low": 0.5, "high": 0.1}}, "is inverted: low must be below high"),
        ({"optimizer.lr": {"low": 0.0, "high": 0.1, "log": True}}, "needs low above 0"),
        ({"batch.micro": {"choices": [8, "sixteen"]}}, "of one kind"),
        ({"batch.micro": {"choices": [8.5, 16.0]}}, "batch.micro = 8.5 is invalid"),
        ({"batch.micro": {"choices": []}}, "non-empty list"),
        ({"precision.mode": {"choices": ["fp32", "fp7"]}}, "'fp7'"),
        ({"optimizer.lr": {"low": 0.1}}, "needs numbers low and high"),
        ({"optimizer.lr": {"low": 0.1, "high": 1.0, "scale": "log"}}, "unknown field scale"),
        ({"optimizer.lr": 0.1}, "must be a table"),
        ({}, "is empty"),
    ],
)
def test_a_bad_space_is_one_line_naming_the_key(table: dict, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_space(table, BASE, "--space s.toml")
    message = str(caught.value)
    assert words in message and "\n" not in message
    assert message.startswith("--space s.toml")


def test_a_factory_argument_the_config_sets_is_searched_and_one_it_does_not_is_refused() -> None:
    base = {**BASE, "task": {"model": "m:build", "model_args": {"n_embd": 64}}}
    space = parse_space({"task.model_args.n_embd": {"choices": [64, 96]}}, base)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    assert {space.suggest(study.ask())["task.model_args.n_embd"] for _ in range(20)} == {64, 96}
    with pytest.raises(ConfigError, match=r"task\.model_args\.width\"\] is not in the config"):
        parse_space({"task.model_args.width": {"choices": [64, 96]}}, base)


def test_a_key_a_factory_takes_over_is_refused_and_one_that_still_applies_is_searched() -> None:
    # Once, a sweep of optimizer.lr beside an optimizer factory ran every trial alike.
    base = {**BASE, "task": {"optimizer": "pkg:sgd", "scheduler": "torch.optim.lr_scheduler:X"}}
    for key in ("optimizer.lr", "optimizer.weight_decay", "schedule.warmup_steps"):
        with pytest.raises(ConfigError) as caught:
            parse_space({key: {"low": 1, "high": 4}}, base, "--space s.toml")
        assert f'["{key}"] would change nothing: task.' in str(caught.value)
    space = parse_space({"optimizer.grad_clip": {"low": 0.5, "high": 1.0}}, base)
    assert [p.key for p in space.params] == ["optimizer.grad_clip"]
    assert parse_space({"optimizer.lr": {"low": 0.01, "high": 0.1}}, BASE).params
