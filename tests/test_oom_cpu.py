"""A real out-of-memory error on the CPU: the allocator raises a RuntimeError ("DefaultCPUAllocator:
can't allocate memory"), not CUDA's torch.OutOfMemoryError. The micro-batch search and the
replay take it as they take CUDA's; any other RuntimeError is shown, not halved away.

The model below asks the allocator for a buffer that grows with the batch, past the address
space of any machine: the allocation fails at once, before a byte is committed."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from torch import nn

from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ThriftyError
from thrifty.levers.micro_batch import is_out_of_memory


def scratch_bytes(samples: int, fits: int) -> int:
    """1 MiB at `fits` samples, 2^28 times that for each sample more (256 TiB at one more:
    beyond the 128 TiB a process can address), less for fewer."""
    return 2 ** max(0, min(20 + 28 * (samples - fits), 62))


class Greedy(nn.Module):
    """A small regression net whose forward also takes a scratch buffer of
    `scratch_bytes(batch, fits)` from the CPU allocator (all-pairs tables grow this way)."""

    def __init__(self, fits: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Dropout(0.1), nn.Linear(16, 1))
        self.fits = fits

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(scratch_bytes(x.shape[0], self.fits), dtype=torch.uint8)
        loss = ((self.net(x) - y) ** 2).mean()
        return loss + scratch[:0].float().sum()  # an empty slice: adds 0


class Miswired(nn.Module):
    """A bug, not a size: its forward joins a batch with its first two samples' targets, which
    works only while the batch has at most two samples."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(7, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.net(torch.cat([x, y[:2]], dim=1)) - y) ** 2).mean()


def data(n: int = 64) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 6, generator=g), torch.randn(n, 1, generator=g)
    )


def config(tmp_path, name: str, micro: int | str, effective: int = 8) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {
                "max_steps": 4,
                "device": "cpu",
                "out": str(tmp_path / name),
                "progress": "off",
            },
            "precision": {"mode": "fp32"},
            "batch": {"micro": micro, "effective": effective},
            "data": {"num_workers": 0},
            "checkpoint": {"every": "off"},
        }
    )


def weights(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def summary(tmp_path, name: str) -> dict:
    return json.loads((tmp_path / name / "summary.json").read_text())


def test_the_cpu_allocator_refuses_the_buffer_at_once_as_a_runtime_error():
    # What the tests below stand on: a plain RuntimeError, which only its words tell apart.
    with pytest.raises(RuntimeError) as info:
        torch.empty(scratch_bytes(2, fits=1), dtype=torch.uint8)
    assert not isinstance(info.value, torch.OutOfMemoryError)
    assert "DefaultCPUAllocator: can't allocate memory" in str(info.value)
    assert is_out_of_memory(info.value)
    assert not is_out_of_memory(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))


def test_auto_takes_a_real_cpu_out_of_memory_error_as_a_size_that_does_not_fit(tmp_path, caplog):
    model = Greedy(fits=2)
    with caplog.at_level(logging.INFO, logger="thrifty"):
        trainer = Trainer(model, data(), config(tmp_path, "auto", "auto"))
        trainer.fit()
    assert trainer.micro == 2 and trainer.accumulation == 4  # 8 = 2 × 4
    search = summary(tmp_path, "auto")["micro_batch_search"]
    assert [(t["micro"], t["fits"]) for t in search["tried"]] == [(1, True), (2, True), (4, False)]
    assert "micro-batch auto: 2 (1 fits, 2 fits, 4 does not fit" in caplog.text
    # The trial steps left no trace: the weights of a run given micro 2.
    given = Greedy(fits=2)
    Trainer(given, data(), config(tmp_path, "given", 2)).fit()
    for a, b in zip(weights(model), weights(given), strict=True):
        assert torch.equal(a, b)


def test_a_run_too_large_for_the_cpu_halves_and_finishes_with_the_same_samples(tmp_path, caplog):
    model = Greedy(fits=2)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        trainer = Trainer(model, data(), config(tmp_path, "big", 4))
        result = trainer.fit()
    assert result.steps == 4 and result.stop_reason == "max_steps"
    assert "out of memory at a micro-batch of 4: replaying the step as 4 micro-batches of 2" in (
        caplog.text
    )
    assert "could not count the model's FLOPs" not in caplog.text  # counted on one sample
    assert trainer.flops is not None
    events = [
        json.loads(line)
        for line in (tmp_path / "big" / "metrics.jsonl").read_text().splitlines()
        if "event" in line
    ]
    assert {"step": 0, "event": "out_of_memory", "micro_batch": 2} in events
    big = summary(tmp_path, "big")
    assert big["micro_batch"] == 2 and big["effective_batch"] == 8
    # The halves of each batch are what a micro-batch of 2 reads: the same samples, bit for bit.
    given = Greedy(fits=2)
    Trainer(given, data(), config(tmp_path, "given", 2)).fit()
    assert big["samples"] == summary(tmp_path, "given")["samples"] == 4 * 8
    for a, b in zip(weights(model), weights(given), strict=True):
        assert torch.equal(a, b)


def test_a_cpu_that_cannot_fit_one_sample_ends_the_run_in_one_line(tmp_path):
    with pytest.raises(ThriftyError) as info:
        Trainer(Greedy(fits=0), data(), config(tmp_path, "none", "auto"))
    message = str(info.value)
    assert message.startswith(
        "out of memory at a micro-batch of 1 sample (DefaultCPUAllocator: can't allocate memory: "
        "you tried to allocate 281474976710656 bytes."
    )
    assert "\n" not in message and "enforce fail" not in message


@pytest.mark.parametrize("micro", ["auto", 4])
def test_a_runtime_error_that_is_not_out_of_memory_is_raised_not_halved(tmp_path, micro):
    with pytest.raises(RuntimeError, match="Sizes of tensors must match") as info:
        Trainer(Miswired(), data(), config(tmp_path, f"bug-{micro}", micro)).fit()
    assert not isinstance(info.value, (ThriftyError, torch.OutOfMemoryError))
