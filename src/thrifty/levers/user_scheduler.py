"""A user's own learning-rate scheduler, stepped by the run in place of `[schedule]`.

It is given as an `LRScheduler` built on the optimizer the run trains, or as a factory
`optimizer -> LRScheduler` (the form a config's `task.scheduler` names, and the one that also
works with an optimizer thrifty or a factory builds). The run steps it once per optimizer step,
where it steps its own schedule; a step the guard or the fp16 loss scaler left out is taken
back at the next metrics flush, as for the own schedule; a checkpoint holds its state_dict, so a
resumed run's learning rates are the uninterrupted run's, bit for bit.

Refused in one line: a scheduler built on another optimizer (it would never move the rate the
run trains with), one that steps on a metric (ReduceLROnPlateau: the run has no metric at each
step), and one whose state a checkpoint cannot hold.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from thrifty.config import ScheduleConfig, TrainConfig
from thrifty.errors import ThriftyError
from thrifty.levers.schedule import scaled_lr, schedule_horizon, scheduler_for

log = logging.getLogger("thrifty")

SchedulerArg = LRScheduler | Callable[[torch.optim.Optimizer], LRScheduler] | None
OWN_KIND = "schedule"  # the kind of thrifty's own [schedule] scheduler, in checkpoints


@dataclass(frozen=True)
class ConfigScheduler:
    """The factory a config's `task.scheduler` names, called with `task.scheduler_args`."""

    factory: Callable[..., Any]
    args: Mapping[str, Any] = field(default_factory=dict)
    where: str = "task.scheduler"  # how messages name it: "task.scheduler = 'pkg.mod:fn'"

    def __call__(self, optimizer: torch.optim.Optimizer) -> Any:
        return self.factory(optimizer, **self.args)


def _through(name: str) -> Any:
    """A property reading and writing the wrapped scheduler's attribute `name`."""

    def get(self: UserScheduler) -> Any:
        return getattr(self.scheduler, name)

    def set_(self: UserScheduler, value: Any) -> None:
        setattr(self.scheduler, name, value)

    return property(get, set_)


class UserScheduler:
    """A user's LRScheduler as the run steps it.

    `rewind(steps)` (the guard, at every metrics flush) takes back the last `steps` steps,
    found skipped once their flags reached the host: the scheduler is restored to its state at
    the first step after the previous flush and stepped again for the steps that were not
    skipped, which works for any scheduler whose step needs no argument. The state is copied
    once per flush interval, not per step.
    """

    def __init__(self, scheduler: LRScheduler, label: str = "scheduler=") -> None:
        self.scheduler = scheduler
        self.label = label  # how messages name it: "scheduler=StepLR", "task.scheduler = '...'"
        cls = type(scheduler)
        self.kind = f"{cls.__module__}.{cls.__qualname__}"  # recorded with the checkpoint
        self._mark: tuple[dict[str, Any], list[Any]] | None = None  # state before `_since` steps
        self._since = 0

    # --- what the loop, the guard and the checkpointer use --------------------------------------

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self.scheduler.optimizer

    base_lrs = _through("base_lrs")  # a rollback scales the peak rates
    _last_lr = _through("_last_lr")  # set with base_lrs by a rollback

    @property
    def last_epoch(self) -> int:
        return self.scheduler.last_epoch

    def get_last_lr(self) -> list[Any]:
        return self.scheduler.get_last_lr()

    def step(self) -> None:
        """One optimizer step done: step the user's scheduler."""
        if self._mark is None:  # the first step since the guard last judged the steps
            self._mark = self._snapshot()
            self._since = 0
        self.scheduler.step()
        self._since += 1

    def rewind(self, steps: int) -> None:
        """Take back the last `steps` steps (skipped ones: no update, so no schedule step)."""
        steps = min(steps, self._since)
        if steps > 0 and self._mark is not None:
            self._restore(self._mark)
            self.advance(self._since - steps)
        self._mark, self._since = None, 0

    def advance(self, steps: int) -> None:
        """Step the scheduler `steps` times without an optimizer step: a replay, or a new
        scheduler brought to the step a resumed run has reached."""
        with warnings.catch_warnings():
            # Stepping before the optimizer has stepped is the point here, not a mistake.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step")
            for _ in range(steps):
                self.scheduler.step()
        self._mark, self._since = None, 0

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state)
        self._mark, self._since = None, 0

    # --- the state a rewind goes back to ------------------------------------------------------

    def _snapshot(self) -> tuple[dict[str, Any], list[Any]]:
        # Deep copies: load_state_dict adopts the dict's lists, and a tensor lr is updated in
        # place by the scheduler.
        lrs = [copy.deepcopy(g["lr"]) for g in self.optimizer.param_groups]
        return copy.deepcopy(self.scheduler.state_dict()), lrs

    def _restore(self, mark: tuple[dict[str, Any], list[Any]]) -> None:
        state, lrs = mark
        self.scheduler.load_state_dict(copy.deepcopy(state))
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].copy_(lr)
            else:
                group["lr"] = lr  # chainable schedulers (StepLR) read the group's current rate


# --- choosing the run's scheduler ------------------------------------------------------------


def run_scheduler(
    given: SchedulerArg,
    optimizer: torch.optim.Optimizer,
    config: TrainConfig,
    epoch_steps: int | None,
    effective_batch: int,
) -> tuple[Any, int | None, Callable[[int | None], Any] | None]:
    """The scheduler the run steps, the schedule's horizon (optimizer steps; None for a user's
    scheduler, which has its own) and how to rebuild it for another horizon (None: it is not
    rebuilt). With `given`, the user's scheduler wins over `[schedule]`, and any `[schedule]`
    setting it overrides is named in one warning line."""
    if given is None:
        horizon = schedule_horizon(config.schedule, config.run.max_steps, epoch_steps)
        make = functools.partial(scheduler_for, optimizer, config.schedule)
        return make(horizon), horizon, make
    user = adopt_scheduler(given, optimizer, effective_batch, config.optimizer.reference_batch)
    ignored = set_schedule_keys(config.schedule)
    if ignored:
        log.warning(
            "%s sets the learning rate; [schedule] is ignored: %s (remove those settings, or "
            "the scheduler to use them)",
            user.label,
            ", ".join(ignored),
        )
    return user, None, None


def set_schedule_keys(schedule: ScheduleConfig) -> list[str]:
    """The `[schedule]` settings that differ from their defaults, as `schedule.key = value`."""
    default = ScheduleConfig()
    return [
        f"schedule.{name} = {getattr(schedule, name)!r}"
        for name in ("warmup_steps", "decay", "min_lr_ratio", "total_steps")
        if getattr(schedule, name) != getattr(default, name)
    ]


def adopt_scheduler(
    given: Any,
    optimizer: torch.optim.Optimizer,
    effective_batch: int,
    reference_batch: int | None,
) -> UserScheduler:
    """The user's scheduler (or the one its factory builds on `optimizer`), checked: built on
    `optimizer`, stepped without a metric, its state one a checkpoint can hold. A scheduler
    built before the linear scaling rule scaled the optimizer's rates has its base rates scaled
    alike."""
    if isinstance(given, LRScheduler):
        name = type(given).__name__
        label = f"scheduler={name}"
        _check_scheduler(given, label)
        if given.optimizer is not optimizer:
            raise ThriftyError(
                f"{label} is built on another optimizer than the one thrifty trains: pass that "
                f"optimizer too (optimizer=...), or the scheduler as a factory "
                f"(scheduler=lambda optimizer: {name}(optimizer, ...))"
            )
        factor = scaled_lr(1.0, effective_batch, reference_batch)
        given.base_lrs = [base * factor for base in given.base_lrs]
        scheduler = given
    elif callable(given):
        source = given.where if isinstance(given, ConfigScheduler) else "the scheduler factory"
        scheduler = given(optimizer)
        if not isinstance(scheduler, LRScheduler):
            raise ThriftyError(
                f"{source} returned an object of type {type(scheduler).__name__}, not a "
                "torch.optim.lr_scheduler.LRScheduler: return one built on the optimizer it is "
                "given"
            )
        name = type(scheduler).__name__
        label = source if isinstance(given, ConfigScheduler) else f"{source}'s {name}"
        _check_scheduler(scheduler, f"{source} returned a {name}, which")
        if scheduler.optimizer is not optimizer:
            raise ThriftyError(
                f"{source} returned a {name} built on another optimizer: build it on the "
                "optimizer it is given"
            )
    else:
        raise ThriftyError(
            f"scheduler= is an object of type {type(given).__name__}: pass a torch.optim.lr_scheduler."
            "LRScheduler built on the optimizer, or a factory optimizer -> LRScheduler"
        )
    # The schedule's peak rates, where thrifty's own schedule keeps them (a rollback and a
    # resume with another optimizer.lr scale them).
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["initial_lr"] = base
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    return UserScheduler(scheduler, label)


def _check_scheduler(scheduler: LRScheduler, label: str) -> None:
    """Refuse a scheduler that needs a metric to step, or whose state no checkpoint holds;
    `label` is the subject of the message ("scheduler=StepLR")."""
    if needs_metric(scheduler):
        raise ThriftyError(
            f"{label} steps on a metric (step(metrics)), and thrifty steps the scheduler once "
            "per optimizer step, with none: use a scheduler of steps (StepLR, LambdaLR, "
            "OneCycleLR, SequentialLR, ...), or early_stopping.patience to stop on a plateau"
        )
    from thrifty.checkpoint.snapshot import copy_to_host

    try:
        copy_to_host(scheduler.state_dict())
    except TypeError as exc:
        raise ThriftyError(f"{label} cannot be checkpointed: its state_dict()'s {exc}") from None


def needs_metric(scheduler: Any) -> bool:
    """Whether `scheduler.step` takes a required argument (ReduceLROnPlateau's metric)."""
    if isinstance(scheduler, ReduceLROnPlateau):
        return True
    try:
        parameters = inspect.signature(scheduler.step).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return any(p.default is p.empty and p.kind in positional for p in parameters)
