"""The validation loss: every rank evaluates its share, the mean is over all of them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from thrifty.errors import ThriftyError
from thrifty.levers.accumulation import LossFn, call_model, count_samples, count_tokens, to_device
from thrifty.levers.precision import Precision
from thrifty.strategies.process_group import Distributed


@torch.no_grad()
def validation_loss(
    model: nn.Module,
    forward_model: nn.Module,
    batches: Iterable[Any],
    *,
    device: torch.device,
    precision: Precision,
    loss_fn: LossFn | None,
    dist: Distributed,
    max_batches: int | None,
    micro: int,
) -> float:
    """Mean loss over `batches` (at most `max_batches`), weighted by samples, or by tokens
    where a batch has a loss_mask; `model` is put in eval mode meanwhile."""
    was_training = model.training
    model.eval()
    total = torch.zeros((), device=device, dtype=torch.float64)
    weight_sum = 0
    try:
        for i, batch in enumerate(batches):
            if max_batches and i >= max_batches:
                break
            masked = isinstance(batch, dict) and "loss_mask" in batch
            weight = count_tokens(batch) if masked else count_samples(batch)
            batch = to_device(batch, device, device.type == "cuda")
            with precision.autocast():
                loss = call_model(forward_model, batch, loss_fn)
            total += loss.double() * weight
            weight_sum += weight
    finally:
        model.train(was_training)
    if dist.enabled:  # every rank evaluated its share: the mean over all of them
        count = torch.tensor(float(weight_sum), device=device).double()
        total, summed = dist.sum_(torch.stack([total, count])).unbind()
        weight_sum = int(summed.item())
    if weight_sum == 0:
        raise ThriftyError(
            f"the validation set yields no full batch of {micro}: "
            "set eval.micro smaller or give more validation data"
        )
    return float(total) / weight_sum
