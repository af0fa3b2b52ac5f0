from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ThriftyError
from thrifty.rundir.files import read_metrics


def cfg(tmp_path, **sections) -> TrainConfig:
    base = {
        "run": {
            "max_steps": 4,
            "device": "cpu",
            "out": str(tmp_path / "run"),
            "progress": "off",
            "log_every": 2,
        },
        "batch": {"micro": 4},
        "data": {"num_workers": 0},
        "schedule": {"decay": "constant"},
        "eval": {"every": 2},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return TrainConfig.from_dict(base)


class HFStyle(nn.Module):
    """Returns an object with .loss, like Hugging Face models."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_gpt()

    def forward(self, input_ids, targets):
        return SimpleNamespace(loss=self.inner(input_ids, targets), logits=None)


class LogitsOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = tiny_gpt()

    def forward(self, input_ids, targets):
        return self.inner(input_ids)


def lm_loss(output, batch):
    return F.cross_entropy(output.flatten(0, 1), batch["targets"].flatten())


@pytest.mark.parametrize(
    ("model", "loss_fn"),
    [(tiny_gpt, None), (HFStyle, None), (LogitsOnly, lm_loss)],
    ids=["returns-loss", "returns-.loss", "logits+loss_fn"],
)
def test_fit_learns_with_each_way_of_returning_the_loss(tmp_path, model, loss_fn):
    data = TokenDataset(n=64)
    result = Trainer(
        model(), data, cfg(tmp_path, run={"max_steps": 8}), val_data=data, loss_fn=loss_fn
    ).fit()
    assert result.steps == 8 and result.samples == 32 and result.tokens == 32 * 32
    assert result.val_loss < result.initial_val_loss
    assert result.stop_reason == "max_steps"
    assert result.tokens_per_second > 0


def test_a_model_that_returns_no_loss_is_a_clear_error(tmp_path):
    with pytest.raises(
        ThriftyError, match=r"returned a tensor of shape \(4, 32, 256\), not a loss"
    ):
        Trainer(LogitsOnly(), TokenDataset(), cfg(tmp_path)).fit()


def test_run_directory_holds_config_metrics_and_summary(tmp_path):
    data = TokenDataset(n=64)
    Trainer(tiny_gpt(), data, cfg(tmp_path), val_data=data).fit()
    run = tmp_path / "run"
    assert "[batch]" in (run / "config.toml").read_text()
    steps = [r for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    assert all(isinstance(r["loss"], float) and r["grad_norm"] > 0 for r in steps)
    summary = json.loads((run / "summary.json").read_text())
    for key in (
        "steps",
        "initial_val_loss",
        "final_val_loss",
        "tokens_per_second",
        "precision",
        "stop_reason",
        "wall_seconds",
    ):
        assert key in summary


def test_a_directory_with_a_run_is_not_overwritten_unless_asked(tmp_path):
    data = TokenDataset(n=32)
    Trainer(tiny_gpt(), data, cfg(tmp_path)).fit()
    # Written for the Python API: no CLI flags in the way out.
    with pytest.raises(ThriftyError) as caught:
        Trainer(tiny_gpt(), data, cfg(tmp_path)).fit()
    message = str(caught.value)
    assert "holds a finished run" in message and "RunConfig(overwrite=True)" in message
    assert "--" not in message
    Trainer(tiny_gpt(), data, cfg(tmp_path, run={"overwrite": True})).fit()


def test_a_second_fit_on_one_trainer_says_to_build_a_new_one(tmp_path):
    trainer = Trainer(tiny_gpt(), TokenDataset(n=32), cfg(tmp_path))
    trainer.fit()
    with pytest.raises(ThriftyError, match="fit\\(\\) already ran on this Trainer"):
        trainer.fit()


def test_early_stopping_ends_a_run_that_stopped_improving(tmp_path):
    data = TokenDataset(n=64)
    # lr 0: the validation loss never improves, so patience 2 stops after 3 evaluations.
    config = cfg(
        tmp_path,
        run={"max_steps": 100},
        optimizer={"name": "sgd", "lr": 1e-12},
        early_stopping={"patience": 2, "min_delta": 0.01},
        eval={"every": 1},
    )
    result = Trainer(tiny_gpt(), data, config, val_data=data).fit()
    assert result.stop_reason == "early_stopping"
    assert result.steps == 3


def test_token_budget_stops_the_run(tmp_path):
    result = Trainer(
        tiny_gpt(), TokenDataset(n=64), cfg(tmp_path, run={"max_steps": None, "max_tokens": 500})
    ).fit()
    assert result.stop_reason == "max_tokens"
    assert result.tokens == 512  # 4 steps of 4 × 32 tokens


def test_epoch_budget_ends_with_the_data(tmp_path):
    result = Trainer(
        tiny_gpt(), TokenDataset(n=40), cfg(tmp_path, run={"max_steps": None, "max_epochs": 2})
    ).fit()
    assert result.stop_reason == "data_exhausted"
    assert result.steps == 20  # 10 full micro-batches per epoch


def test_linear_scaling_rule_sets_the_optimizer_lr(tmp_path):
    trainer = Trainer(
        tiny_gpt(),
        TokenDataset(n=64),
        cfg(
            tmp_path,
            run={"max_steps": 1},
            batch={"micro": 4, "effective": 16},
            optimizer={"lr": 1e-3, "reference_batch": 8},
        ),
    )
    trainer.fit()
    first = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert first["lr"] == pytest.approx(2e-3)
    assert trainer.accumulation == 4


def test_an_lr_the_config_sets_beside_an_optimizer_of_your_own_is_said_unused(tmp_path, caplog):
    def sgd(model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=0.05)

    config = cfg(tmp_path, run={"max_steps": 1}, optimizer={"lr": 1e-3, "grad_clip": 0.5})
    with caplog.at_level("WARNING", logger="thrifty"):
        trainer = Trainer(tiny_gpt(), TokenDataset(n=16), config, optimizer=sgd)
    assert trainer.optimizer.param_groups[0]["lr"] == 0.05  # the factory's, as said
    (line,) = [m for m in caplog.messages if "not used" in m]
    assert line.startswith("optimizer.lr = 0.001 not used: the optimizer is yours")
    assert "a SGD with lr 0.05" in line and "grad_clip" not in line
    caplog.clear()
    with caplog.at_level("WARNING", logger="thrifty"):
        Trainer(tiny_gpt(), TokenDataset(n=16), cfg(tmp_path, run={"max_steps": 1}), optimizer=sgd)
    assert not [m for m in caplog.messages if "not used" in m]  # nothing set: nothing to say


def test_zero_grad_frees_gradients_after_each_step(tmp_path):
    model = tiny_gpt()
    Trainer(model, TokenDataset(n=32), cfg(tmp_path, run={"max_steps": 1})).fit()
    assert all(p.grad is None for p in model.parameters())


def test_activation_checkpointing_from_config_wraps_blocks(tmp_path):
    result = Trainer(
        tiny_gpt(),
        TokenDataset(n=32),
        cfg(tmp_path, run={"max_steps": 1}, activation_checkpointing={"policy": "every_other"}),
    ).fit()
    assert result.checkpointed_blocks == ["blocks.0", "blocks.2"]


def test_a_dataloader_whose_batch_size_is_not_the_micro_batch_is_one_line(tmp_path):
    loader = torch.utils.data.DataLoader(TokenDataset())
    with pytest.raises(ThriftyError) as error:
        Trainer(tiny_gpt(), loader, cfg(tmp_path))
    assert str(error.value) == (
        "train_data is a DataLoader with batch_size 1 and batch.micro = 4: set batch.micro = 1, "
        "or build the DataLoader with batch_size=4"
    )
