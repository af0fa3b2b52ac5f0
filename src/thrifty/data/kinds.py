"""What kind of training data a run was given: a stream or a dataset, its length, whether it
keeps state, and torchdata's StatefulDataLoader where installed."""

from __future__ import annotations

from typing import Any

from torch.utils.data import IterableDataset


def length(obj: Any) -> int | None:
    try:
        return len(obj)
    except TypeError:
        return None


def stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def is_hf_stream(data: Any) -> bool:
    return type(data).__module__.startswith("datasets.") and hasattr(data, "n_shards")


def is_stream(data: Any) -> bool:
    """An IterableDataset. A bare iterator (a generator) is not one: it cannot start a second
    pass, nor be copied to a loader worker."""
    return isinstance(data, IterableDataset) or is_hf_stream(data)


def stateful_loader_class() -> type | None:
    """torchdata's StatefulDataLoader, when installed (`thrifty[data]`)."""
    try:
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError:
        return None
    return StatefulDataLoader
