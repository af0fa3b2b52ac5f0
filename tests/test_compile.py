from __future__ import annotations

import time

import pytest
import torch

from helpers import TokenDataset, tiny_gpt
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
        }
    )


def test_compile_warm_up_is_left_out_of_throughput(tmp_path, monkeypatch):
    """A stand-in for torch.compile that spends 1.5 s on its first call, as compiling does."""
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
                if calls["n"] == 1:
                    time.sleep(1.5)
                return self.inner(*args, **kwargs)

        seen["calls"] = calls
        return Compiled()

    monkeypatch.setattr(torch, "compile", fake_compile)
    compiled = Trainer(tiny_gpt(), TokenDataset(), config(tmp_path, "reduce-overhead")).fit()
    assert seen["mode"] == "reduce-overhead" and seen["calls"]["n"] == 6  # the compiled model ran
    # 5 steady steps take far less than the 1.5 s warm-up; had it been counted, tokens/s would
    # be at most 6 × 128 tokens / 1.5 s = 512.
    assert compiled.tokens_per_second > 2000


@pytest.mark.slow
def test_real_compile_trains_to_the_same_loss(tmp_path):
    eager = Trainer(tiny_gpt(), TokenDataset(), config(tmp_path, "off")).fit()
    compiled = Trainer(tiny_gpt(), TokenDataset(), config(tmp_path, "default")).fit()
    assert compiled.train_loss == pytest.approx(eager.train_loss, rel=1e-3)
