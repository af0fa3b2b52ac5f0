"""Build a user's model, data, optimizer and loss from the import paths in [task]."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from thrifty.config import TrainConfig
from thrifty.errors import ConfigError

if TYPE_CHECKING:
    from thrifty.callbacks import Callback


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
    collate_fn: Any = None
    scheduler: Any = None  # a ConfigScheduler: task.scheduler with task.scheduler_args

    def trainer(
        self, config: TrainConfig, *, validate: bool = True, callbacks: Sequence[Callback] = ()
    ) -> Any:
        """The Trainer of this task: every part the factories built, passed in one place, with
        `callbacks` (`thrifty.callbacks`). `validate=False` leaves the validation set out (a
        profile measures training only)."""
        from thrifty.run.trainer import Trainer

        return Trainer(
            self.model,
            self.train_data,
            config,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            val_data=self.val_data if validate else None,
            loss_fn=self.loss_fn,
            collate_fn=self.collate_fn,
            callbacks=list(callbacks),
        )


def call_factory(factory: Any, args: dict[str, Any], field: str, args_field: str) -> Any:
    """Call `factory(**args)`, or say in one line which keyword it does not take."""
    misfit = _misfit(factory, **args)
    if misfit is not None:
        exc, accepts = misfit
        raise ConfigError(
            f"{args_field} does not fit {field} = {factory.__module__}:"
            f"{factory.__qualname__}: {exc}; it takes ({accepts})"
        )
    return factory(**args)


def _misfit(factory: Any, *args: Any, **kwargs: Any) -> tuple[TypeError, str] | None:
    """Why `factory(*args, **kwargs)` would not bind, with the parameters it takes ("a, b" or
    "no arguments"); None when it binds, or when it has no signature (the call will say)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: let the call say
        return None
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        return exc, ", ".join(signature.parameters) or "no arguments"
    return None


def build_task(config: TrainConfig) -> Task:
    """Call the factories of `config.task` (seed the RNG first: model init draws from it)."""
    from thrifty.data.geometry import starting_micro
    from thrifty.run.inputs import check_dataset, check_model, check_train_batches

    t = config.task
    if t.model is None or t.train_data is None:
        missing = "task.model" if t.model is None else "task.train_data"
        raise ConfigError(f"{missing} is not set: name a factory like 'mypackage.models:build'")
    model_factory = import_object(t.model, "task.model")
    model = call_factory(model_factory, t.model_args, "task.model", "task.model_args")
    check_model(model, f"what task.model = {t.model!r} returned")
    micro = starting_micro(config.batch)
    train_factory = import_object(t.train_data, "task.train_data")
    train = call_factory(train_factory, t.data_args, "task.train_data", "task.data_args")
    check_train_batches(
        train, config.batch, where=f"what task.train_data = {t.train_data!r} returned"
    )
    val = None
    if t.val_data:
        val_factory = import_object(t.val_data, "task.val_data")
        val = call_factory(val_factory, t.data_args, "task.val_data", "task.data_args")
        eval_micro = config.eval.micro or micro
        key = "eval.micro" if config.eval.micro else "batch.micro"
        check_dataset(val, f"what task.val_data = {t.val_data!r} returned", eval_micro, key)
    # The factory itself: the Trainer calls it once the model is wrapped (FSDP replaces the
    # parameters with their shards, so an optimizer built earlier would hold stale ones).
    optimizer = import_object(t.optimizer, "task.optimizer") if t.optimizer else None
    loss_fn = import_object(t.loss_fn, "task.loss_fn") if t.loss_fn else None
    collate_fn = import_object(t.collate_fn, "task.collate_fn") if t.collate_fn else None
    scheduler = scheduler_factory(t.scheduler, t.scheduler_args) if t.scheduler else None
    return Task(model, train, val, optimizer, loss_fn, collate_fn, scheduler)


def scheduler_factory(path: str, args: dict[str, Any]) -> Any:
    """`task.scheduler`, to be called on the optimizer once it is built, with
    `task.scheduler_args`; arguments it does not take are refused here, before training."""
    from thrifty.levers.user_scheduler import ConfigScheduler

    factory = import_object(path, "task.scheduler")
    misfit = _misfit(factory, None, **args)  # None stands for the optimizer
    if misfit is not None:
        exc, accepts = misfit
        raise ConfigError(
            f"task.scheduler_args does not fit task.scheduler = {path!r}: {exc}; it takes "
            f"({accepts}), the optimizer first"
        )
    return ConfigScheduler(factory, dict(args), f"task.scheduler = {path!r}")
