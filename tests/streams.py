"""Streams and loaders for the your-data tests (imported by child processes through
PYTHONPATH=tests)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset


def window(i: int, block: int = 32) -> dict[str, torch.Tensor]:
    """Sample i of every stream here: a byte window drawn from i alone."""
    x = torch.randint(0, 256, (block + 1,), generator=torch.Generator().manual_seed(i))
    return {"input_ids": x[:-1], "targets": x[1:]}


class Stream(IterableDataset):
    """Samples 0, 1, 2, ... (`n` a pass). With `stateful`, it says where it is, and a restored
    state is where its next iteration starts (the protocol of Hugging Face's streams).
    `fail_at`: the sample at which its source goes away."""

    def __init__(self, n: int = 100_000, stateful: bool = True, fail_at: int | None = None):
        self.n, self.fail_at = n, fail_at
        self.position = 0
        self._start = 0
        if not stateful:
            self.state_dict = None  # type: ignore[assignment]

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        start, self._start = self._start, 0
        for i in range(start, self.n):
            if i == self.fail_at:
                raise OSError("the bucket went away (503 Slow Down)")
            self.position = i + 1
            yield window(i)

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._start = self.position = state["position"]


def stream(**args: Any) -> Stream:
    return Stream(**args)


def plain_stream(**args: Any) -> Stream:
    return Stream(stateful=False)


def failing_stream(**args: Any) -> Stream:
    """A stream whose source goes away at sample $STREAM_FAIL_AT (and is back without it)."""
    import os

    fail_at = os.environ.get("STREAM_FAIL_AT")
    return Stream(fail_at=int(fail_at) if fail_at else None)


class Picky(Stream):
    """A stream whose `load_state_dict` rejects the state it is given while $STREAM_REJECTS
    names an exception type (KeyError, ValueError or TypeError), as a new version of a pipeline
    refuses the state an old one saved; without it, it resumes as `Stream` does."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import os

        kind = os.environ.get("STREAM_REJECTS")
        if kind == "KeyError":
            raise KeyError("offset")
        if kind == "ValueError":
            raise ValueError("state format 1, this stream reads format 2")
        if kind == "TypeError":
            raise TypeError("'int' object is not subscriptable")
        super().load_state_dict(state)


def picky_stream(**args: Any) -> Picky:
    return Picky()


def stateful_loader(**args: Any) -> Any:
    """Your own DataLoader: torchdata's StatefulDataLoader with 2 workers over a stream."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(Sharded(), batch_size=4, num_workers=2)


class Sharded(Stream):
    """A stream that splits itself among a DataLoader's workers (worker w: samples w, w+W...)."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        workers, worker = (info.num_workers, info.id) if info else (1, 0)
        start, self._start = self._start, 0
        for i in range(start or worker, self.n, workers):
            self.position = i + workers
            yield window(i)


def hf_stream(path: str = "", **args: Any) -> Any:
    """Hugging Face `datasets` in streaming mode over the JSON files in `path`."""
    import glob

    from datasets import load_dataset

    files = sorted(glob.glob(f"{path}/*.jsonl"))
    data = load_dataset("json", data_files=files, split="train", streaming=True)
    return data.with_format("torch")
