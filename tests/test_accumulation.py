from __future__ import annotations

import copy

import pytest
import torch

from helpers import RecordingSGD, TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.levers.accumulation import loss_weights


def accumulated_gradient(tmp_path, model, data, normalize: str = "auto") -> list[torch.Tensor]:
    optimizer = RecordingSGD(model.parameters(), lr=0.0)
    cfg = TrainConfig.from_dict(
        {
            "run": {
                "max_steps": 1,
                "device": "cpu",
                "out": str(tmp_path / normalize),
                "progress": "off",
            },
            "precision": {"mode": "fp32"},
            "batch": {"micro": 4, "effective": 16, "normalize": normalize},
            "optimizer": {"grad_clip": 0.0},
            "schedule": {"decay": "constant"},
            "data": {"num_workers": 0, "shuffle": False},
        }
    )
    Trainer(model, data, cfg, optimizer=optimizer).fit()
    return optimizer.seen


def full_batch_gradient(model, data) -> list[torch.Tensor]:
    items = [data[i] for i in range(16)]
    batch = {k: torch.stack([it[k] for it in items]) for k in items[0]}
    model.zero_grad()
    model(**batch).backward()
    return [p.grad.clone() for p in model.parameters()]


def relative_error(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    diff = torch.sqrt(
        sum((x.double() - y.double()).pow(2).sum() for x, y in zip(a, b, strict=True))
    )
    norm = torch.sqrt(sum(y.double().pow(2).sum() for y in b))
    return float(diff / norm)


@pytest.mark.parametrize("pad", [False, True], ids=["full-windows", "uneven-padding"])
def test_four_micro_batches_give_the_gradient_of_one_big_batch(tmp_path, pad):
    model = tiny_gpt()
    reference = copy.deepcopy(model)
    data = TokenDataset(n=32, pad=pad)
    err = relative_error(
        accumulated_gradient(tmp_path, model, data), full_batch_gradient(reference, data)
    )
    assert err < 1e-6


def test_weighting_by_samples_would_misweight_uneven_padding(tmp_path):
    # The check above can fail: averaging per-micro-batch means is off when token counts differ.
    model = tiny_gpt()
    reference = copy.deepcopy(model)
    data = TokenDataset(n=32, pad=True)
    naive = accumulated_gradient(tmp_path, model, data, normalize="samples")
    assert relative_error(naive, full_batch_gradient(reference, data)) > 1e-3


def test_weights_follow_token_counts_and_sum_to_one():
    window = [{"loss_mask": torch.ones(2, 3)}, {"loss_mask": torch.tensor([[1, 0, 0], [0, 0, 0]])}]
    assert loss_weights(window, "auto") == [6 / 7, 1 / 7]
    assert loss_weights(window, "samples") == [0.5, 0.5]
