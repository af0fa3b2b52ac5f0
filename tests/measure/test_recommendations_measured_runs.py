"""Loader-worker advice on real runs: the Trainer measures the steps for real (wall clock, a
real DataLoader), and the diagnosis recommends workers only where its measurement says they
make the step faster."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from thrifty import Trainer
from thrifty.config import TrainConfig


class Regressor(nn.Module):
    """A linear regression; `sleep` seconds per forward stand for a step's compute."""

    def __init__(self, width: int, sleep: float = 0.0) -> None:
        super().__init__()
        self.lin = nn.Linear(width, 1)
        self.sleep = sleep

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.sleep:
            time.sleep(self.sleep)
        return ((self.lin(x) - y) ** 2).mean()


class SleepyItems(Dataset):
    """Each item takes `seconds` to arrive, waiting rather than computing (a slow disk)."""

    def __init__(self, seconds: float, n: int = 512, width: int = 16) -> None:
        self.seconds = seconds
        self.x = torch.randn(n, width)
        self.y = torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.seconds)
        return self.x[i], self.y[i]


def train(tmp_path: Path, model: nn.Module, data: Dataset, micro: int, steps: int) -> Trainer:
    config = TrainConfig.from_dict(
        {
            "run": {
                "max_steps": steps,
                "device": "cpu",
                "out": str(tmp_path / "run"),
                "progress": "off",
                "log_every": 4,
            },
            "batch": {"micro": micro},
            "data": {"num_workers": 0},
            "precision": {"mode": "fp32"},
            "optimizer": {"name": "sgd", "lr": 1e-3},
            "schedule": {"decay": "constant"},
            "checkpoint": {"every": "off"},
            "spot": {"provider": "none"},
            "measure": {"peak_tflops": 1.0},
        }
    )
    trainer = Trainer(model, data, config)
    trainer.fit()
    return trainer


def test_in_memory_data_with_a_short_wait_gets_no_workers_recommendation(tmp_path: Path) -> None:
    """Collating 128 in-memory rows is a large share of a tiny model's step, but well under a
    millisecond: taking each batch from a worker process would cost more than that. (128, not
    64: on a machine whose cores are all busy, the step's time slices shrank 64 rows' share
    below the 10% this test needs to mean anything.)"""
    data = TensorDataset(torch.randn(8192, 16), torch.randn(8192, 1))
    trainer = train(tmp_path, Regressor(16), data, micro=128, steps=40)
    d = trainer.diagnosis
    assert d.measured.num_workers == 0
    assert d.breakdown["data_wait"] >= 0.10  # a share that used to bring a workers advice
    assert not any("num_workers" in r.text for r in d.recommendations), d.recommendations
    written = json.loads((tmp_path / "run" / "diagnosis.json").read_text())
    assert not any("num_workers" in r["text"] for r in written["recommendations"])
    assert "± is the noise" in " ".join(written["evidence"])


def test_a_loader_slower_than_the_step_gets_workers_with_its_measured_figures(
    tmp_path: Path,
) -> None:
    """Four items of 5 ms each a batch, 20 ms of compute: a worker fetching while the loop
    computes halves the step, far more than the step varies."""
    trainer = train(tmp_path, Regressor(16, sleep=0.020), SleepyItems(0.005), micro=4, steps=16)
    d = trainer.diagnosis
    advice = next(r for r in d.recommendations if "num_workers" in r.text)
    assert advice.area == "data"
    assert "raise data.num_workers from 0 to" in advice.text
    e = d.measured
    wait, step = e.figure("data_wait"), e.figure("step")
    assert "±" in wait and f"({wait} of {step} per step)" in advice.text
    figures = advice.figures
    assert figures["data_wait_seconds"] == pytest.approx(e.data_wait_seconds)
    assert figures["data_wait_seconds"] >= 0.020  # four sleeps of 5 ms
    assert figures["step_seconds"] == pytest.approx(e.step_seconds)
    assert figures["data_wait_noise_seconds"] == e.noise("data_wait")
    assert figures["step_noise_seconds"] == e.noise("step")
    gain = figures["step_seconds"] - figures["modelled_step_seconds"]
    assert gain > figures["step_noise_seconds"] and gain > 0.010
    assert e.spread_windows is not None and e.spread_windows >= 2
    written = json.loads((tmp_path / "run" / "diagnosis.json").read_text())
    saved = next(r for r in written["recommendations"] if "num_workers" in r["text"])
    assert saved["figures"] == pytest.approx(figures)
    assert set(written["measured"]["spread_seconds"]) >= {"data_wait", "step"}
