"""The micro-batch search (`batch.micro = "auto"`) reaches the largest size that fits on an
80 GB card as on an H200, tried here on the CPU against a faked device: its memory, and a
step whose peak grows with the micro-batch as GPT-2 124M's eager bf16 step does (weights,
gradients and AdamW's moments in fp32, 16 bytes a parameter, and 0.89 GiB a sequence of
1,024 tokens: 115.6 GiB at 128 on an H200)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from test_micro_batch import Tight, config, data
from thrifty import Trainer
from thrifty.errors import ConfigError
from thrifty.levers.micro_batch import candidates, measure_micro

GIB = 2**30
FIXED = 124e6 * 16  # bytes held at any size: weights, gradients, AdamW's two moments
PER_SEQUENCE = (115.6 * GIB - FIXED) / 128  # an eager step's activations, per sequence
PER_RANK = 512  # 0.5M tokens a step, sequences of 1,024


class FakeCuda:
    """CUDA's memory figures for a card of `total` bytes, the peak set by each trial step."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, total: float) -> None:
        self.total, self.peak = total, 0.0
        props = type("Properties", (), {"total_memory": int(total)})()
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda *_: props)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *_: self.peak)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        # The trial batches stay on the CPU, where the step runs.
        monkeypatch.setattr("thrifty.levers.accumulation.to_device", lambda batch, _: batch)

    def reset(self, *_: Any) -> None:
        self.peak = 0.0

    def step(self, micro: int) -> None:
        need = FIXED + micro * PER_SEQUENCE
        if need > self.total:
            raise torch.OutOfMemoryError(f"tried to allocate {need / GIB:.1f} GiB")
        self.peak = need


def search(monkeypatch: pytest.MonkeyPatch, total_gib: float, samples: int) -> Any:
    card = FakeCuda(monkeypatch, total_gib * GIB)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(samples, 4))

    def call(batch: list[torch.Tensor]) -> torch.Tensor:
        card.step(len(batch[0]))
        return model(batch[0]).sum()

    return measure_micro(
        model,
        optimizer,
        data,
        torch.utils.data.default_collate,
        call,
        device=torch.device("cuda"),
        per_rank=PER_RANK,
        margin=0.1,
        agree=lambda fits: fits,
    )


def largest_that_fits(total_gib: float, most: int = PER_RANK) -> int:
    limit = 0.9 * total_gib * GIB
    return max(m for m in candidates(PER_RANK) if m <= most and FIXED + m * PER_SEQUENCE <= limit)


@pytest.mark.parametrize(("total_gib", "expected"), [(80, 64), (141, 128)])
def test_the_search_reaches_the_largest_size_that_fits_on_an_80_gb_card_and_an_h200(
    monkeypatch, total_gib, expected
):
    found = search(monkeypatch, total_gib, samples=PER_RANK)
    assert found.chosen == expected == largest_that_fits(total_gib)
    # The next size was tried and did not fit under the margin: none larger was left out.
    last = found.tried[-1]
    assert (last.micro, last.fits) == (2 * expected, False)
    print(
        f"{total_gib} GiB: chosen {found.chosen} "
        f"(peak {(FIXED + found.chosen * PER_SEQUENCE) / GIB:.1f} GiB of "
        f"{0.9 * total_gib:.1f} usable); tried {[(t.micro, t.fits) for t in found.tried]}"
    )


@pytest.mark.parametrize(("total_gib", "samples", "expected"), [(80, 300, 64), (141, 100, 64)])
def test_fewer_samples_than_the_batch_cap_the_search_at_a_size_that_divides_it(
    monkeypatch, total_gib, samples, expected
):
    # The search tried the sizes dividing the sample count (300: 1, 2, 4, 10, 20, 50, 100,
    # 300), and chose 50 on an 80 GB card: 512 sequences a step are no whole number of them,
    # and the run stopped at the accumulation.
    found = search(monkeypatch, total_gib, samples)
    assert found.chosen == expected == largest_that_fits(total_gib, most=samples)
    assert PER_RANK % found.chosen == 0
    assert all(PER_RANK % t.micro == 0 for t in found.tried)


def test_a_training_set_smaller_than_the_batch_is_named_not_the_micro_batch(tmp_path):
    # The search chose all 48 samples, and the run stopped on "a multiple of batch.micro × world
    # size = 48 × 1": a micro-batch the user never set.
    with pytest.raises(ConfigError, match="the training set has only 48 samples; use a smaller"):
        Trainer(Tight(limit=None), data(48), config(tmp_path, "small", "auto", effective=64))
