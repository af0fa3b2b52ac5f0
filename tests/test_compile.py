from __future__ import annotations

import pytest
import torch

from helpers import TokenDataset, VirtualClock, time_trainer_with, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig


def config(tmp_path, mode: str) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {
                "max_steps": 6,
                "device": "cpu",
                "out": str(tmp_path / mode),
                "progress": "off",
            },
            "batch": {"micro": 4},
            "data": {"num_workers": 0},
            "schedule": {"decay": "constant"},
            "precision": {"mode": "fp32"},
            "compile": {"mode": mode},
            # No interval save: its stall is timed on the real clock, not the test's.
            "checkpoint": {"every": "off"},
        }
    )


def test_compile_warm_up_is_left_out_of_throughput(tmp_path, monkeypatch):
    """A stand-in for torch.compile whose first call costs 1.5 s, as compiling does, and every
    call after it 10 ms, on a virtual clock: the figures are exact, whatever the machine."""
    clock = VirtualClock()
    time_trainer_with(monkeypatch, clock)
    seen = {}

    def fake_compile(model, mode=None):
        seen["mode"] = mode
        calls = {"n": 0}

        class Compiled(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = model

            def forward(self, *args, **kwargs):
                calls["n"] += 1
                clock.advance(1.5 if calls["n"] == 1 else 0.01)
                return self.inner(*args, **kwargs)

        seen["calls"] = calls
        return Compiled()

    monkeypatch.setattr(torch, "compile", fake_compile)
    compiled = Trainer(tiny_gpt(), TokenDataset(), config(tmp_path, "reduce-overhead")).fit()
    assert seen["mode"] == "reduce-overhead" and seen["calls"]["n"] == 6  # the compiled model ran
    # The warm-up steps (the first 3 under compile) are left out: the steady step is 10 ms.
    assert compiled.step_seconds == pytest.approx(0.01)
    assert compiled.tokens_per_second == pytest.approx(4 * 32 / 0.01)


@pytest.mark.slow
def test_real_compile_trains_to_the_same_loss(tmp_path):
    eager = Trainer(tiny_gpt(), TokenDataset(), config(tmp_path, "off")).fit()
    compiled = Trainer(tiny_gpt(), TokenDataset(), config(tmp_path, "default")).fit()
    assert compiled.train_loss == pytest.approx(eager.train_loss, rel=1e-3)
