"""Build a user's model, data, optimizer and loss from the import paths in [task]."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from typing import Any

from thrifty.config import TrainConfig
from thrifty.errors import ConfigError


def import_object(path: str, field: str) -> Any:
    """`package.module:attribute` → the object, or a ConfigError naming the field and the fix."""
    module_name, _, attr = path.partition(":")
    if os.getcwd() not in sys.path:  # so a project's own modules import as they do in `python -m`
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"{field} = {path!r} does not import: {exc} (is the package installed, or run from "
            "the directory that holds it?)"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(
                f"{field} = {path!r} does not import: {module_name} has no attribute {attr!r}"
            ) from None
    if not callable(obj):
        raise ConfigError(f"{field} = {path!r} is not callable: name a function or class")
    return obj


@dataclass
class Task:
    model: Any
    train_data: Any
    val_data: Any = None
    optimizer: Any = None
    loss_fn: Any = None


def build_task(config: TrainConfig) -> Task:
    """Call the factories of `config.task` (seed the RNG first: model init draws from it)."""
    t = config.task
    if t.model is None or t.train_data is None:
        missing = "task.model" if t.model is None else "task.train_data"
        raise ConfigError(f"{missing} is not set: name a factory like 'mypackage.models:build'")
    model = import_object(t.model, "task.model")(**t.model_args)
    train = import_object(t.train_data, "task.train_data")(**t.data_args)
    val = import_object(t.val_data, "task.val_data")(**t.data_args) if t.val_data else None
    # The factory itself: the Trainer calls it once the model is wrapped (FSDP replaces the
    # parameters with their shards, so an optimizer built earlier would hold stale ones).
    optimizer = import_object(t.optimizer, "task.optimizer") if t.optimizer else None
    loss_fn = import_object(t.loss_fn, "task.loss_fn") if t.loss_fn else None
    return Task(model, train, val, optimizer, loss_fn)
