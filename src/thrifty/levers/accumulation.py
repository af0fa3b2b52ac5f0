"""What the Trainer needs to know about a batch: how to move it, call the model on it, find the
loss in the output, and weigh it inside an accumulation window.

Calling convention: a dict batch is passed as keyword arguments (`model(**batch)`); a tuple or
list as positional arguments, all of them without `loss_fn` and all but the last (the target)
with one; anything else as the single argument. The loss is the output itself, its `.loss` or
`["loss"]`, or the one scalar of a tuple (nanoGPT's and minGPT's `(logits, loss)`). A batch the
model's forward cannot take is one line naming the fix, not the TypeError of its call.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from thrifty.errors import ThriftyError

LossFn = Callable[[Any, Any], torch.Tensor]


def to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Move every tensor of a (nested) batch to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, Mapping):
        return {k: to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device, non_blocking) for v in batch)
    return batch


def _first_tensor(batch: Any) -> torch.Tensor | None:
    if isinstance(batch, torch.Tensor):
        return batch
    values = batch.values() if isinstance(batch, Mapping) else batch
    if isinstance(values, (list, tuple)) or isinstance(batch, Mapping):
        for v in values:
            found = _first_tensor(v)
            if found is not None:
                return found
    return None


def count_samples(batch: Any) -> int:
    """Samples in a batch: the leading dimension of its first tensor."""
    tensor = _first_tensor(batch)
    return int(tensor.shape[0]) if tensor is not None and tensor.dim() > 0 else 1


def count_tokens(batch: Any) -> int:
    """Tokens the loss is averaged over: the `loss_mask` sum, else the real tokens of
    `input_ids` (its `attention_mask`'s ones: padding is no token), else its size, else 0."""
    if isinstance(batch, Mapping):
        if "loss_mask" in batch:
            return int(batch["loss_mask"].sum())
        mask = batch.get("attention_mask")
        if isinstance(mask, torch.Tensor) and _is_padding_mask(mask) and "input_ids" in batch:
            return int(mask.sum())
        if "input_ids" in batch:
            return int(batch["input_ids"].numel())
    return 0


def _is_padding_mask(mask: torch.Tensor) -> bool:
    """A Hugging Face padding mask: ones for tokens, zeros for padding, one row a sample (an
    additive float mask of 0 and -inf is not one)."""
    if mask.dim() != 2:
        return False
    return mask.dtype == torch.bool or not (mask.is_floating_point() or mask.is_complex())


def window_counts(window: Sequence[Any]) -> tuple[list[int], list[int]]:
    """Samples and tokens of each micro-batch of a window, counted on the host."""
    return [count_samples(b) for b in window], [count_tokens(b) for b in window]


def uses_tokens(window: Sequence[Any], normalize: str) -> bool:
    """Whether the window's losses are weighted by tokens (else by samples)."""
    return normalize == "tokens" or (
        normalize == "auto" and all(isinstance(b, Mapping) and "loss_mask" in b for b in window)
    )


def loss_weights(
    window: Sequence[Any],
    normalize: str,
    counts: tuple[list[int], list[int]] | None = None,
    totals: Sequence[int] | None = None,
    world_size: int = 1,
) -> list[float]:
    """Weights that turn per-micro-batch mean losses into the mean over the whole window.

    Each micro-batch's loss is a mean over its own samples (or tokens); weighting it by its
    share of the window's samples (tokens) makes the accumulated gradient equal the gradient
    of one big batch, also when micro-batches hold uneven token counts. `counts` are
    `window_counts(window)` when the caller has them already.

    With several processes the window is every rank's micro-batches: `totals` are its samples
    and tokens over all ranks. Data parallelism averages the ranks' gradients (divides their
    sum by `world_size`), so each weight is the batch's share of the global window times
    `world_size`, and the averaged gradient is again that of one big batch.
    """
    use_tokens = uses_tokens(window, normalize)
    samples, tokens = counts or window_counts(window)
    counts_used = tokens if use_tokens else samples
    total: float
    if totals is None:
        total = sum(counts_used)
    else:
        total = (totals[1] if use_tokens else totals[0]) / world_size
    if total == 0:
        raise ThriftyError(
            "an accumulation window holds no tokens to learn from (every loss_mask is zero): "
            "check the data's loss_mask"
        )
    return [c / total for c in counts_used]


def call_model(model: nn.Module, batch: Any, loss_fn: LossFn | None = None) -> torch.Tensor:
    """Run the model on a batch and return the scalar loss (see the module docstring)."""
    try:
        if isinstance(batch, Mapping):
            output = model(**batch)
        elif isinstance(batch, (list, tuple)):
            output = model(*batch) if loss_fn is None else model(*batch[:-1])
        else:
            output = model(batch)
    except TypeError as exc:
        why = batch_mismatch(model, batch, loss_fn)
        if why is None:  # raised inside forward, not by the call
            raise
        raise ThriftyError(f"{why} ({exc})") from None
    if loss_fn is not None:
        loss = loss_fn(output, batch)
        return _as_loss(loss, "loss_fn")
    return _as_loss(output, "the model")


def batch_mismatch(model: nn.Module, batch: Any, loss_fn: LossFn | None) -> str | None:
    """Why the model's forward cannot take the batch as `call_model` passes it, naming the fix;
    None where it can (a TypeError then came from inside forward)."""
    inner = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    inner = getattr(inner, "module", inner)  # DDP's
    try:
        signature = inspect.signature(inner.forward)
    except (TypeError, ValueError):
        return None
    empty = inspect.Parameter.empty
    bare = signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty,
    )
    name = f"{type(inner).__name__}.forward{bare}"
    try:
        if isinstance(batch, Mapping):
            signature.bind(**batch)
        elif isinstance(batch, (list, tuple)):
            signature.bind(*(batch if loss_fn is None else batch[:-1]))
        else:
            signature.bind(batch)
    except TypeError:
        pass
    else:
        return None
    if isinstance(batch, Mapping):
        return (
            f"{name} does not take the batch's keys {', '.join(map(str, batch))} as keyword "
            "arguments: name the dataset's keys after forward's parameters, or give a "
            "loss_fn(output, batch) and a model that takes them"
        )
    if isinstance(batch, (list, tuple)) and loss_fn is None:
        return (
            f"{name} cannot take the batch's {len(batch)} items as positional arguments: give "
            "loss_fn(output, batch) (in Python, loss_fn=...; in a config, [task] loss_fn = "
            "'package.module:function'), and thrifty calls the model on all but the last item "
            "(the target)"
        )
    if isinstance(batch, (list, tuple)):
        return (
            f"{name} cannot take the batch's first {len(batch) - 1} items (all but the target, "
            "as with a loss_fn) as positional arguments: make forward take them, or return "
            "batches of (inputs, target)"
        )
    return f"{name} cannot take the batch, a {type(batch).__name__}, as its one argument"


def _as_loss(output: Any, source: str) -> torch.Tensor:
    loss = output
    if isinstance(output, (tuple, list)):  # (logits, loss): the loss when it is the only scalar
        scalars = [v for v in output if _is_scalar_loss(v)]
        loss = scalars[0] if len(scalars) == 1 else None
    elif not isinstance(loss, torch.Tensor):
        loss = output.get("loss") if isinstance(output, Mapping) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
        return loss if loss.dim() == 0 else loss.reshape(())
    desc = (
        f"a tensor of shape {tuple(output.shape)}"
        if isinstance(output, torch.Tensor)
        else f"a {type(output).__name__}"
    )
    raise ThriftyError(
        f"{source} returned {desc}, not a loss: return a scalar loss tensor, an output with "
        ".loss, or a tuple holding one scalar (logits, loss), or give a loss_fn(output, batch)"
    )


def _is_scalar_loss(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.numel() == 1 and value.is_floating_point()
