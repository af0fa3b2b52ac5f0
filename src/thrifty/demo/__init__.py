"""The demo: a byte-level GPT trained from scratch on the Python standard library's source.

`thrifty demo` is `thrifty train` on `DEMO_CONFIG`; these factories are what its [task] names.
"""

from __future__ import annotations

from typing import Any

from thrifty.demo.data import ByteWindows, load_split
from thrifty.demo.model import GPT, GPTConfig

# Sized to finish in under three minutes on a 2-core CPU while the validation loss falls clearly.
DEMO_CONFIG: dict[str, dict[str, Any]] = {
    "run": {"name": "demo", "max_steps": 300, "max_time": "160s", "log_every": 10},
    "precision": {"mode": "auto"},
    "batch": {"micro": 16, "effective": 32},
    "optimizer": {
        "name": "adamw",
        "lr": 2e-3,
        "weight_decay": 0.1,
        "betas": [0.9, 0.95],
        "grad_clip": 1.0,
    },
    "schedule": {"warmup_steps": 30, "decay": "cosine", "min_lr_ratio": 0.1},
    "data": {"num_workers": "auto"},
    "eval": {"every": 50, "batches": 16, "micro": 32},
    "task": {
        "model": "thrifty.demo:build_model",
        "train_data": "thrifty.demo:train_dataset",
        "val_data": "thrifty.demo:val_dataset",
        "model_args": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 128},
        "data_args": {"block_size": 128},
    },
}


def build_model(**kwargs: Any) -> GPT:
    """The demo GPT; keyword arguments are GPTConfig fields."""
    return GPT(GPTConfig(**kwargs))


def train_dataset(block_size: int = 128, max_bytes: int = 3_000_000) -> ByteWindows:
    return ByteWindows(load_split("train", max_bytes), block_size)


def val_dataset(block_size: int = 128, max_bytes: int = 300_000) -> ByteWindows:
    return ByteWindows(load_split("val", max_bytes), block_size)


__all__ = [
    "DEMO_CONFIG",
    "GPT",
    "GPTConfig",
    "ByteWindows",
    "build_model",
    "train_dataset",
    "val_dataset",
]
