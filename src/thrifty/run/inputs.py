"""Checks of what the user hands the Trainer, made before anything reads from it: each failure
is one line that names the argument, what it is, and the fix."""

from __future__ import annotations

from typing import Any

from torch import nn

from thrifty.config import BatchConfig
from thrifty.data.geometry import starting_micro
from thrifty.errors import ThriftyError


def check_model(model: Any, where: str = "model") -> None:
    """A module with at least one parameter that trains."""
    if not isinstance(model, nn.Module):
        raise ThriftyError(
            f"{where} is a {type(model).__name__}, not a torch.nn.Module: return the model itself"
        )
    if not any(p.requires_grad for p in model.parameters()):
        total = sum(p.numel() for p in model.parameters())
        raise ThriftyError(
            f"{where} ({type(model).__name__}) has no trainable parameters ({total:,} frozen): "
            "set requires_grad=True on the parameters to train"
        )


def check_dataset(data: Any, where: str, micro_batch: int, micro_key: str) -> int:
    """A map-style dataset (thrifty builds the loader) holding at least one micro-batch;
    returns its length. Reads `len()` only, never a sample."""
    if not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise ThriftyError(
            f"{where} is a {type(data).__name__}: pass a map-style Dataset (with __len__ and "
            "__getitem__), an IterableDataset or a DataLoader"
        )
    try:
        length = len(data)
    except TypeError as exc:
        raise ThriftyError(f"{where} has no length ({exc}): give it a __len__") from None
    if length == 0:
        raise ThriftyError(f"{where} is empty: it has 0 samples; check the data path or filter")
    if length < micro_batch:
        raise ThriftyError(
            f"{where} has {length} samples, fewer than one micro-batch ({micro_key} = "
            f"{micro_batch}): set {micro_key} to {length} or less, or give more data"
        )
    return length


def check_train_batches(
    train_data: Any,
    batch: BatchConfig,
    sampler: Any = None,
    batch_sampler: Any = None,
    where: str = "train_data",
) -> None:
    """A map-style dataset (alone or with your sampler), a stream, or your DataLoader, that
    `batch` (the [batch] section) can be drawn from."""
    from torch.utils.data import DataLoader

    from thrifty.data.sources import is_stream

    order = "sampler" if sampler is not None else "batch_sampler" if batch_sampler else None
    if sampler is not None and batch_sampler is not None:
        raise ThriftyError(
            "both sampler and batch_sampler are given: pass one (a batch_sampler yields whole "
            "micro-batches of indices)"
        )
    loader = isinstance(train_data, DataLoader)
    stream = not loader and is_stream(train_data)
    if order and (loader or stream):
        what = "a DataLoader" if loader else f"a stream ({type(train_data).__name__})"
        raise ThriftyError(
            f"a {order} needs a dataset it can index, and {where} is {what}: give the "
            f"{order} a map-style Dataset (with __getitem__ and __len__)"
            + (", or build the DataLoader with it" if loader else "")
        )
    if loader and batch.micro == "auto":
        raise ThriftyError(
            f"batch.micro = 'auto' sizes the batches thrifty's loader makes, and {where} is a "
            "DataLoader with its own batch size: set batch.micro to it"
        )
    if not (loader or stream):
        check_dataset(train_data, where, starting_micro(batch), "batch.micro")


def check_inputs(
    model: Any,
    train_data: Any,
    val_data: Any,
    batch: BatchConfig,
    *,
    eval_micro: int | None,
    target: float | None,
    sampler: Any = None,
    batch_sampler: Any = None,
) -> None:
    """Everything a Trainer is handed, checked in the order a person would fix it: `batch` is
    the [batch] section, `eval_micro` eval.micro, `target` early_stopping.target (it needs a
    validation set)."""
    from thrifty.measure.forecast import require_validation

    check_model(model)
    check_train_batches(train_data, batch, sampler, batch_sampler)
    require_validation(target, val_data is not None)
    if val_data is not None:
        name = "eval.micro" if eval_micro else "batch.micro"
        check_dataset(val_data, "val_data", eval_micro or starting_micro(batch), name)
