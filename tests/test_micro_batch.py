"""The micro-batch as a lever: `batch.micro = "auto"` finds the largest that fits, and an
out-of-memory error during training halves it and replays the window, the update unchanged.

Here a model raises CUDA's exception type above a batch size, as a GPU would; a real
allocation failure on the CPU is in test_oom_cpu.py."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ConfigError, ThriftyError
from thrifty.levers.micro_batch import candidates, split_window


class Tight(nn.Module):
    """A small regression net that runs out of memory on batches larger than `limit` once it
    has run `after` forward passes (a longer sequence arriving mid-run, say)."""

    def __init__(self, limit: int | None, after: int = 0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
        self.limit, self.after, self.calls = limit, after, 0

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.limit is not None and self.calls > self.after and x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"injected: {x.shape[0]} samples do not fit")
        return ((self.net(x) - y) ** 2).mean()


def data(n: int = 256) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g)
    )


def config(tmp_path, name: str, micro: int | str, effective: int = 64, **sections) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {
                "max_steps": 6,
                "device": "cpu",
                "out": str(tmp_path / name),
                "progress": "off",
            },
            "precision": {"mode": "fp32"},
            "batch": {"micro": micro, "effective": effective},
            "data": {"num_workers": 0},
            "checkpoint": {"every": "off"},
            **sections,
        }
    )


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_candidates_divide_the_batch_and_double():
    assert candidates(64) == [1, 2, 4, 8, 16, 32, 64]
    assert candidates(48) == [1, 2, 4, 8, 16, 48]
    assert candidates(1) == [1]


def test_auto_finds_the_largest_micro_batch_that_fits_and_trains_as_if_it_were_given(
    tmp_path, caplog
):
    auto_model = Tight(limit=16)
    with caplog.at_level(logging.INFO, logger="thrifty"):
        trainer = Trainer(auto_model, data(), config(tmp_path, "auto", "auto"))
        result = trainer.fit()
    assert trainer.micro == 16 and trainer.accumulation == 4  # 64 = 16 × 4
    summary = json.loads((tmp_path / "auto" / "summary.json").read_text())
    assert summary["micro_batch"] == 16
    search = summary["micro_batch_search"]
    assert search["chosen"] == 16
    assert [(t["micro"], t["fits"]) for t in search["tried"]] == [
        (1, True),
        (2, True),
        (4, True),
        (8, True),
        (16, True),
        (32, False),
    ]
    assert "micro-batch auto: 16" in caplog.text
    # The trial steps left no trace: the same weights as a run given micro 16 (dropout included).
    given = Tight(limit=None)
    Trainer(given, data(), config(tmp_path, "given", 16)).fit()
    assert result.steps == 6
    for a, b in zip(weights(auto_model), weights(given), strict=True):
        assert torch.equal(a, b)


def test_an_out_of_memory_error_mid_run_replays_the_window_with_the_same_update(tmp_path):
    # Batches above 8 samples stop fitting after 6 forward passes (the FLOP count's two and
    # step 1's four): step 2 of micro 16 × 4 runs out of memory, logged after the one step done.
    hit = Tight(limit=8, after=6)
    trainer = Trainer(hit, data(), config(tmp_path, "hit", 16))
    result = trainer.fit()
    never = Tight(limit=None)
    Trainer(never, data(), config(tmp_path, "never", 16)).fit()
    assert result.steps == 6 and result.stop_reason == "max_steps"
    for a, b in zip(weights(hit), weights(never), strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)  # only the summation order differs
    events = [
        json.loads(line)
        for line in (tmp_path / "hit" / "metrics.jsonl").read_text().splitlines()
        if "event" in line
    ]
    assert {"step": 1, "event": "out_of_memory", "micro_batch": 8} in events
    # From the start: the halves of each batch are what a micro-batch of 8 reads, bit for bit.
    first = Tight(limit=8)
    Trainer(first, data(), config(tmp_path, "first", 16)).fit()
    eight = Tight(limit=None)
    Trainer(eight, data(), config(tmp_path, "eight", 8)).fit()
    for a, b in zip(weights(first), weights(eight), strict=True):
        assert torch.equal(a, b)


def test_a_micro_batch_of_one_that_does_not_fit_ends_the_run_saying_what_would_help(tmp_path):
    with pytest.raises(ThriftyError, match="out of memory at a micro-batch of 1 sample") as info:
        Trainer(Tight(limit=0, after=2), data(), config(tmp_path, "none", 2, effective=8)).fit()
    assert "activation checkpointing" in str(info.value) and "fsdp" in str(info.value)
    with pytest.raises(ThriftyError, match="out of memory at a micro-batch of 1 sample"):
        Trainer(Tight(limit=0), data(), config(tmp_path, "auto-none", "auto"))


def test_auto_needs_an_effective_batch(tmp_path):
    with pytest.raises(ConfigError, match="batch.micro = 'auto' is invalid: needs batch.effective"):
        TrainConfig.from_dict({"run": {"max_steps": 1}, "batch": {"micro": "auto"}})


def test_a_window_splits_into_halves_of_the_same_samples():
    x, y = torch.arange(8.0).reshape(4, 2), torch.arange(4)
    window = [{"x": x, "y": y, "ids": ["a", "b", "c", "d"]}, (x, y)]
    halves = split_window(window)
    assert len(halves) == 4
    assert torch.equal(halves[0]["x"], x[:2]) and halves[1]["ids"] == ["c", "d"]
    assert torch.equal(halves[3][1], y[2:])
    with pytest.raises(ValueError):
        split_window([(x[:1], y[:1])])


@pytest.mark.parametrize(
    "change, tolerance",
    [
        ({"batch": {"micro": 8, "effective": 16}}, 1e-6),  # summation order only
        ({"batch": {"micro": 16, "effective": 16}}, 1e-6),
        ({"data": {"num_workers": 2}}, 0.0),  # the same batches, seeded alike: bit for bit
        ({"activation_checkpointing": {"policy": "all"}}, 0.0),  # recomputed alike: bit for bit
        ({"precision": {"mode": "bf16"}}, 3e-2),  # bf16's 8-bit mantissa
    ],
    ids=["micro-8", "micro-16", "workers", "checkpointing", "bf16"],
)
def test_a_lever_changes_how_the_work_is_done_not_the_optimization(tmp_path, change, tolerance):
    """What `thrifty tune` may change: the losses of a few steps match the baseline's within
    what the change implies."""
    from helpers import TokenDataset, tiny_gpt

    def run(name: str, **sections) -> list[float]:
        torch.manual_seed(3)
        model = tiny_gpt()
        base = {
            "run": {
                "max_steps": 4,
                "device": "cpu",
                "out": str(tmp_path / name),
                "progress": "off",
                "log_every": 1,
            },
            "precision": {"mode": "fp32"},
            "batch": {"micro": 4, "effective": 16},
            "data": {"num_workers": 0},
        }
        cfg = TrainConfig.from_dict({**base, **sections})
        Trainer(model, TokenDataset(n=64), cfg).fit()
        lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["loss"] for line in lines if '"loss"' in line]

    baseline, changed = run("baseline"), run("changed", **change)
    assert len(baseline) == len(changed) == 4
    if tolerance == 0.0:
        assert changed == baseline
    else:
        assert changed == pytest.approx(baseline, rel=tolerance)


class Exact(nn.Module):
    """A linear model whose arithmetic is exact in fp32: small integers, power-of-two batches
    and learning rate. Every sum is exact, so its order cannot matter: any difference left
    between micro-batch sizes would be the accumulation's weighting, not rounding."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([[1.0, -2.0, 3.0, 0.0]]))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((x @ self.w.T - y) ** 2).mean()


@pytest.mark.parametrize("micro", [1, 2, 4, 8])
def test_where_arithmetic_is_exact_the_micro_batch_changes_no_bit(tmp_path, micro):
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(
        torch.randint(-3, 4, (64, 4), generator=g).float(),
        torch.randint(-8, 9, (64, 1), generator=g).float(),
    )

    def weights(name: str, micro: int) -> torch.Tensor:
        run = {"max_steps": 2, "device": "cpu", "out": str(tmp_path / name), "progress": "off"}
        cfg = TrainConfig.from_dict(
            {
                "run": run,
                "precision": {"mode": "fp32"},
                "batch": {"micro": micro, "effective": 16},
                "data": {"num_workers": 0},
                "optimizer": {"name": "sgd", "lr": 2**-4, "grad_clip": 0},
                "schedule": {"decay": "constant"},
            }
        )
        trainer = Trainer(Exact(), data, cfg)
        trainer.fit()
        return trainer.model.w.detach().clone()

    whole, split = weights("whole", 16), weights("split", micro)
    assert not torch.equal(whole, Exact().w.detach())  # it trained
    assert torch.equal(split, whole)


class Streamed(torch.utils.data.IterableDataset):
    """`data()` as a stream: no length, no indexing."""

    def __iter__(self):
        return iter(data())


def test_auto_sizes_a_stream_from_its_first_samples(tmp_path):
    trainer = Trainer(Tight(limit=16), Streamed(), config(tmp_path, "stream", "auto"))
    trainer.fit()
    assert trainer.micro == 16 and trainer.accumulation == 4
    assert [(t.micro, t.fits) for t in trainer.micro_search.tried][-2:] == [(16, True), (32, False)]
