"""The first micro-batch collated at set-up, so that a missing or failing collator is one line
naming `collate_fn` before anything else reads the data (the FLOP count, the loader's workers,
the micro-batch search), not a traceback from inside torch's `default_collate`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, default_collate

from thrifty.errors import ThriftyError

Collate = Callable[[list[Any]], Any]

# Where a collator is given: in Python, and in a config.
GIVE_COLLATE = (
    "in Python, collate_fn=...; in a config, [task] collate_fn = 'package.module:function'"
)
PADDING_COLLATORS = (
    "transformers' DataCollatorWithPadding(tokenizer), or "
    "DataCollatorForLanguageModeling(tokenizer, mlm=False) for a causal LM"
)


def collate_used(data: Any, collate_fn: Collate | None) -> tuple[Collate, str]:
    """The collator the loader will use and how to name it: the one given, a DataLoader's
    own, or torch's default_collate."""
    if collate_fn is not None:
        return collate_fn, f"collate_fn ({_name(collate_fn)})"
    if isinstance(data, DataLoader) and data.collate_fn is not default_collate:
        return data.collate_fn, f"the DataLoader's collate_fn ({_name(data.collate_fn)})"
    return default_collate, "torch's default_collate"


def collate_checked(
    samples: list[Any], collate: Collate, named: str, where: str = "train_data"
) -> Any:
    """`collate(samples)`, or a ThriftyError in one line naming the collator and the fix:
    samples of different shapes with no padding collator, or a collator that raised."""
    try:
        return collate(samples)
    except Exception as exc:  # the user's collator, or default_collate, on the user's samples
        if isinstance(exc, torch.OutOfMemoryError):
            raise
        said = _first_line(exc)
        if collate is not default_collate:
            raise ThriftyError(
                f"{named} raised {said} on the first {len(samples)} samples of {where}: fix "
                "it so it returns the batch the model takes (a dict of tensors, a tuple or a "
                "tensor)"
            ) from None
        differ = differing_shapes(samples)
        if differ is not None:
            key, shapes = differ
            raise ThriftyError(
                f"{where}'s samples have different shapes ({key}: {shapes}) and no collate_fn "
                f"pads them (torch's default_collate stacks equal shapes only): give a "
                f"collate_fn ({GIVE_COLLATE}), e.g. {PADDING_COLLATORS}"
            ) from None
        raise ThriftyError(
            f"torch's default_collate cannot batch {where}'s samples ({said}): give a "
            f"collate_fn that builds the batch ({GIVE_COLLATE})"
        ) from None


def differing_shapes(samples: list[Any]) -> tuple[str, str] | None:
    """The first field whose shape differs across `samples` ("input_ids", "[1]", "sample")
    and its shapes in order of appearance ("(5,) in sample 0, (6,) in sample 1"); None when
    every field has one shape. Lists count by length (a tokenizer's lists of ids)."""
    return _differ(samples, "sample")


def _differ(values: list[Any], path: str) -> tuple[str, str] | None:
    first = values[0]
    if isinstance(first, Mapping):
        if all(isinstance(v, Mapping) for v in values):
            for key in first:
                if all(key in v for v in values):
                    found = _differ([v[key] for v in values], str(key))
                    if found is not None:
                        return found
        return None
    if isinstance(first, (tuple, list)) and not _is_numbers(first):
        if all(isinstance(v, (tuple, list)) and len(v) == len(first) for v in values):
            for i in range(len(first)):
                found = _differ([v[i] for v in values], f"{path}[{i}]")
                if found is not None:
                    return found
        return None
    shapes = [_shape(v) for v in values]
    if None in shapes or len(set(shapes)) == 1:
        return None
    seen: dict[tuple[int, ...], int] = {}
    for i, shape in enumerate(shapes):
        seen.setdefault(shape, i)  # type: ignore[arg-type]
        if len(seen) == 3:
            break
    return path, ", ".join(f"{shape} in sample {i}" for shape, i in seen.items())


def _shape(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape)
    if hasattr(value, "shape") and isinstance(value.shape, tuple):  # numpy
        return tuple(value.shape)
    if isinstance(value, (list, tuple)) and _is_numbers(value):
        return (len(value),)
    return None


def _is_numbers(value: Sequence[Any]) -> bool:
    return all(isinstance(v, (int, float, bool)) for v in value)


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else 'no message'}"
