"""The guard inside real runs: a non-finite step is left out as if its batch had never been
there, a diverging run stops and never writes NaN to disk, a loss spike is rolled back to the
run that never saw it, and a forecast stops a run that cannot reach its target."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import TokenDataset, tiny_gpt
from test_cli import run_cli
from thrifty import Trainer
from thrifty.checkpointing.store.loading import load_checkpoint
from thrifty.config import TrainConfig
from thrifty.errors import ConfigError
from thrifty.rundir.files import read_metrics

FEATURES = 6


def regression(
    n: int,
    poison: range | None = None,
    nan: range | None = None,
    seed: int = 0,
    noise: float = 0.1,
):
    """y = x·w plus noise (one w for every set); rows in `poison` get targets 1000× too large
    (a corrupt shard), rows in `nan` a NaN feature (a broken record)."""
    w = torch.randn(FEATURES, 1, generator=torch.Generator().manual_seed(1234))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, FEATURES, generator=g)
    y = x @ w + noise * torch.randn(n, 1, generator=g)
    if poison is not None:
        y[poison.start : poison.stop] *= 1000.0
    if nan is not None:
        x[nan.start : nan.stop, 0] = math.nan
    return torch.utils.data.TensorDataset(x, y)


def drop(data, rows: range):
    keep = [i for i in range(len(data)) if i not in rows]
    return torch.utils.data.TensorDataset(*(t[keep] for t in data.tensors))


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x, y):
        return nn.functional.mse_loss(self.net(x), y)


def config(out: Path, steps: int, **sections) -> TrainConfig:
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
        "data": {"num_workers": 0, "shuffle": False},
        "optimizer": {"lr": 1e-2},
        "schedule": {"decay": "constant"},
        "checkpoint": {"every": 5},
        "spot": {"provider": "none"},
        "guard": {"spike_window": 10},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return TrainConfig.from_dict(base)


def fused_adamw(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)


def weights(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize(
    ("optimizer", "precision"),
    [(None, "fp32"), (fused_adamw, "fp32"), (None, "bf16")],
    ids=["adamw-host-flag", "fused-on-device", "bf16"],
)
def test_a_non_finite_step_is_left_out_as_if_its_batch_was_never_there(
    tmp_path, optimizer, precision
):
    # Window 6 (rows 48..55) holds a broken record: its loss and gradients are NaN.
    broken = range(48, 56)
    guarded = Linear()
    result = Trainer(
        guarded,
        regression(160, nan=broken),
        config(tmp_path / "g", 20, precision={"mode": precision}),
        optimizer=optimizer,
    ).fit()
    reference = Linear()
    Trainer(
        reference,
        drop(regression(160, nan=broken), broken),
        config(tmp_path / "r", 19, precision={"mode": precision}),
        optimizer=optimizer,
    ).fit()
    assert result.stop_reason == "max_steps" and result.guard["skipped_steps"] == 1
    records = [r for r in read_metrics(tmp_path / "g" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in records if r.get("skipped")] == [7]
    # No update, no optimizer state, no schedule step: the same weights as a run without it.
    for a, b in zip(weights(guarded), weights(reference), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_under_fp16_the_loss_scaler_skips_the_step_and_the_guard_counts_it(tmp_path):
    # The scaler lowers its scale after the NaN step, so later steps differ from a run that
    # never saw it: the claim here is the skip, and a run that goes on finite.
    model = Linear()
    result = Trainer(
        model,
        regression(160, nan=range(48, 56)),
        config(tmp_path / "h", 20, precision={"mode": "fp16"}),
        optimizer=fused_adamw,
    ).fit()
    assert result.stop_reason == "max_steps" and result.guard["skipped_steps"] == 1
    records = [r for r in read_metrics(tmp_path / "h" / "metrics.jsonl") if "loss" in r]
    assert [r["step"] for r in records if r.get("skipped")] == [7]
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert math.isfinite(result.train_loss)


def test_a_diverging_run_stops_and_never_checkpoints_nan(tmp_path):
    out = tmp_path / "lr1e6"
    config_ = config(
        out, 60, optimizer={"lr": 1e6, "grad_clip": 0.0}, guard={"max_skipped": 3}
    ).replace(**{"checkpoint.every": "1"})
    result = Trainer(tiny_gpt(), TokenDataset(n=64), config_).fit()
    assert result.stop_reason == "diverged"
    why = result.guard["diverged"]
    assert "steps in a row up to step" in why and "the last finite loss was" in why
    assert result.steps < 60
    events = [r for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "diverged"]
    assert len(events) == 1
    saved = sorted((out / "checkpoints").glob("step-*"))
    assert saved, "the finite checkpoints are kept"
    for folder in saved:  # every checkpoint on disk is finite
        state = load_checkpoint(str(folder))
        for name, tensor in state["model"].items():
            assert torch.isfinite(tensor).all(), (folder.name, name)
    assert not (out / "summary.json").exists() or result.stop_reason == "diverged"


def test_a_loss_spike_is_rolled_back_to_the_run_that_never_saw_it(tmp_path):
    # Windows 30..32 (rows 240..263) are a corrupt shard: targets 1000× too large.
    poison = range(240, 264)
    spiked = Linear()
    result = Trainer(spiked, regression(480, poison=poison), config(tmp_path / "s", 60)).fit()
    clean = Linear()
    reference = Trainer(clean, drop(regression(480), poison), config(tmp_path / "c", 57)).fit()

    assert result.stop_reason == "max_steps"
    (rollback,) = result.guard["rollbacks"]
    assert rollback["spike_start"] == 31 and rollback["to_step"] == 30
    assert rollback["steps_lost"] == 3
    events = [r for r in read_metrics(tmp_path / "s" / "metrics.jsonl") if r.get("event")]
    assert any(e["event"] == "rollback" and e["steps_lost"] == 3 for e in events)
    # After the rollback the run trained on exactly the clean windows, in the same order.
    assert result.train_loss == pytest.approx(reference.train_loss, rel=1e-4)
    for a, b in zip(weights(spiked), weights(clean), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_without_the_guard_the_spike_stays_in_the_weights(tmp_path):
    poison = range(240, 264)
    unguarded = Linear()
    Trainer(
        unguarded,
        regression(480, poison=poison),
        config(tmp_path / "u", 60, guard={"enabled": False}),
    ).fit()
    clean = Linear()
    Trainer(clean, drop(regression(480), poison), config(tmp_path / "c", 57)).fit()
    gap = max(
        (a - b).abs().max().item() for a, b in zip(weights(unguarded), weights(clean), strict=True)
    )
    assert gap > 1e-2


def test_rollbacks_are_bounded(tmp_path):
    # Two corrupt shards and max_rollbacks = 1: the second spike stops the run as diverged.
    data = regression(480, poison=range(240, 264))
    data.tensors[1][360:384] *= 1000.0
    result = Trainer(Linear(), data, config(tmp_path / "b", 60, guard={"max_rollbacks": 1})).fit()
    assert result.stop_reason == "diverged"
    assert len(result.guard["rollbacks"]) == 1
    assert "after 1 rollback(s) (guard.max_rollbacks = 1)" in result.guard["diverged"]


def test_a_run_that_cannot_reach_its_target_is_stopped_by_the_forecast(tmp_path):
    out = tmp_path / "f"
    cfg = config(
        out,
        400,
        eval={"every": 10},
        early_stopping={"target": 0.05},
        cost={"usd_per_gpu_hour": 3.0},
        checkpoint={"every": "off"},
        optimizer={"lr": 1e-3},  # still falling steadily when the forecast decides
    )
    # The noise floor (0.3² = 0.09) is far above the target: the curve flattens out short of it.
    train, val = regression(3200, noise=0.3), regression(256, seed=1, noise=0.3)
    result = Trainer(Linear(), train, cfg, val_data=val).fit()
    assert result.stop_reason == "forecast"
    assert result.steps < 400
    forecast = result.guard["forecast"]
    assert forecast["stopped"] and forecast["low"] > 0.05 and forecast["target"] == 0.05
    saved = result.guard["saved"]
    assert saved["by"] == "forecast" and saved["steps_not_run"] == 400 - result.steps
    assert saved["usd"] > 0


def test_a_run_that_reaches_its_target_is_not_stopped(tmp_path):
    cfg = config(tmp_path / "ok", 150, eval={"every": 10}, early_stopping={"target": 0.05})
    result = Trainer(Linear(), regression(1200), cfg, val_data=regression(200, seed=1)).fit()
    assert result.stop_reason == "max_steps"
    assert result.val_loss < 0.05


def test_a_forecast_without_validation_data_is_refused():
    with pytest.raises(ConfigError, match="early_stopping.target = 0.5 needs validation data"):
        Trainer(Linear(), regression(64), config(Path("unused"), 4, early_stopping={"target": 0.5}))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("early_stopping.target=nan", "early_stopping.target = nan is invalid"),
        ("early_stopping.target=-1", "early_stopping.target = -1 is invalid: must be a finite"),
        ("guard.spike_sigma=1", "guard.spike_sigma = 1.0 is invalid: must be a number, 2 or"),
        ("guard.spike_steps=0", "guard.spike_steps = 0 is invalid"),
        ("guard.rollback_lr_factor=2", "guard.rollback_lr_factor = 2.0 is invalid: must be in"),
    ],
)
def test_bad_guard_settings_exit_2_with_one_line(capsys, tmp_path, setting, message):
    job = tmp_path / "job.toml"
    job.write_text('[run]\nmax_steps = 1\n[task]\nmodel = "m:f"\ntrain_data = "m:d"\n')
    code, _, err = run_cli(capsys, "train", str(job), "--set", setting)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_weights_that_overflowed_are_never_checkpointed(tmp_path, caplog):
    # Finite gradients (targets of 1e18) times lr = 1e21 overflow the weights to inf at the
    # first update: that state must never reach disk.
    data = torch.utils.data.TensorDataset(torch.ones(64, FEATURES), torch.full((64, 1), 1e18))
    out = tmp_path / "inf"
    cfg = config(out, 6, optimizer={"grad_clip": 0.0}, checkpoint={"every": 1})
    with caplog.at_level("ERROR", logger="thrifty"):
        result = Trainer(
            Linear(), data, cfg, optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=1e21)
        ).fit()
    assert "not checkpointing step 1: the weights or optimizer state are not finite" in caplog.text
    assert not list((out / "checkpoints").glob("step-*")), "no checkpoint of inf weights"
    assert result.guard["skipped_steps"] == 5  # every step after the first
