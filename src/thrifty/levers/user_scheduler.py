"""A user's own learning-rate scheduler, stepped by the run in place of `[schedule]`.

It is given as an `LRScheduler` built on the optimizer the run trains, or as a factory
`optimizer -> LRScheduler` (the form a config's `task.scheduler` names, and the one that also
works with an optimizer thrifty or a factory builds). `schedule.interval` says how often the run
steps it: once per optimizer step ("step", the default, where it steps its own schedule), or
once each time an epoch of optimizer steps completes ("epoch", as PyTorch's StepLR, MultiStepLR
and ExponentialLR are documented). Per step, a step the guard or the fp16 loss scaler left out
is taken back at the next metrics flush, as for the own schedule; per epoch, a skipped step
still counts toward its epoch (its data was seen). A checkpoint holds its state_dict and the
optimizer steps counted, so a resumed run's learning rates are the uninterrupted run's, bit for
bit, mid-epoch too.

Refused in one line: a scheduler built on another optimizer (it would never move the rate the
run trains with), one that steps on a metric (ReduceLROnPlateau: the run has no metric at each
step), one whose state a checkpoint cannot hold, a factory that raises, and one that fails
within the run's steps (rehearsed on a copy at set-up: thrifty.levers.scheduler_checks); one
that fails at a step no rehearsal reached stops the run with one line, not a traceback.
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

from thrifty.config import RunConfig, ScheduleConfig
from thrifty.errors import ConfigError, ThriftyError
from thrifty.levers.schedule import scaled_lr, schedule_horizon, scheduler_for
from thrifty.levers.scheduler_checks import (
    REHEARSAL_STEPS,
    CollapseWatch,
    RunHorizon,
    check_total_steps,
    one_line,
    rehearse,
)

log = logging.getLogger("thrifty")

SchedulerArg = LRScheduler | Callable[[torch.optim.Optimizer], LRScheduler] | None
OWN_KIND = "schedule"  # the kind of thrifty's own [schedule] scheduler, in checkpoints
# The optimizer steps a user's scheduler has counted, kept with its state_dict in a checkpoint
# (per epoch, the place in the epoch a resumed run goes on from).
STEPS_KEY = "thrifty_optimizer_steps"


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
    """A user's LRScheduler as the run steps it: once per optimizer step, or with
    `epoch_steps` once each time that many optimizer steps (an epoch) complete.

    `rewind(steps)` (the guard, at every metrics flush) takes back the last `steps` steps,
    found skipped once their flags reached the host: the scheduler is restored to its state at
    the first step after the previous flush and stepped again for the steps that were not
    skipped, which works for any scheduler whose step needs no argument. The state is copied
    once per flush interval, not per step. Per epoch nothing is taken back: a skipped step
    still ends its epoch on time.
    """

    def __init__(
        self,
        scheduler: LRScheduler,
        label: str = "scheduler=",
        *,
        epoch_steps: int | None = None,
        arguments: str = "its arguments",
    ) -> None:
        self.scheduler = scheduler
        self.label = label  # how messages name it: "scheduler=StepLR", "task.scheduler = '...'"
        self.arguments = arguments  # where its arguments are set: "task.scheduler_args"
        cls = type(scheduler)
        self.kind = f"{cls.__module__}.{cls.__qualname__}"  # recorded with the checkpoint
        self.epoch_steps = epoch_steps  # None: stepped once per optimizer step
        self.steps = 0  # optimizer steps taken (skipped ones too) since the run began
        self.watch: CollapseWatch | None = None  # the guard's look at the rate, at flushes
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
        """One optimizer step done: step the user's scheduler (per epoch: at an epoch's end)."""
        self.steps += 1
        if self.epoch_steps is not None:
            if self.steps % self.epoch_steps == 0:
                self._step_scheduler()
            return
        if self._mark is None:  # the first step since the guard last judged the steps
            self._mark = self._snapshot()
            self._since = 0
        self._step_scheduler()
        self._since += 1

    def _step_scheduler(self) -> None:
        # A failure no rehearsal reached (a budget of time or tokens has no horizon to
        # rehearse): one line, not a traceback from inside the loop.
        try:
            self.scheduler.step()
        except Exception as exc:
            raise ThriftyError(
                f"{self.label} failed at optimizer step {self.steps} ({one_line(exc)}): fix "
                f"{self.arguments}, or give the run a budget in steps or epochs "
                "(run.max_steps, run.max_epochs) so that this is found before training"
            ) from exc

    def rewind(self, steps: int) -> None:
        """Take back the last `steps` steps (skipped ones: no update, so no schedule step)."""
        steps = min(steps, self._since)
        if steps > 0 and self._mark is not None:
            self._restore(self._mark)
            self._replay(self._since - steps)
        self._mark, self._since = None, 0

    def flushed(self) -> None:
        """The metrics are flushed: the guard looks at the rate the schedule has reached."""
        if self.watch is not None:
            self.watch.at_flush(self.steps, self.optimizer)

    def advance(self, steps: int) -> None:
        """`steps` optimizer steps without an optimizer step: a new scheduler brought to the
        step a resumed run has reached (per epoch: stepped once for each epoch completed)."""
        if self.epoch_steps is None:
            self._replay(steps)
        else:
            self._replay((self.steps + steps) // self.epoch_steps - self.steps // self.epoch_steps)
        self.steps += steps

    def _replay(self, steps: int) -> None:
        """Step the scheduler itself `steps` times, with no optimizer step."""
        with warnings.catch_warnings():
            # Stepping before the optimizer has stepped is the point here, not a mistake.
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step")
            for _ in range(steps):
                self.scheduler.step()
        self._mark, self._since = None, 0

    def state_dict(self) -> dict[str, Any]:
        return {**self.scheduler.state_dict(), STEPS_KEY: self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = dict(state)
        steps = state.pop(STEPS_KEY, None)
        self.scheduler.load_state_dict(state)
        # A checkpoint from before the count was kept was stepped once per optimizer step.
        self.steps = int(steps) if steps is not None else self.scheduler.last_epoch
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
    schedule: ScheduleConfig,
    run: RunConfig,
    *,
    epoch_steps: int | None,
    effective_batch: int,
    steps_per_epoch: int | None = None,
    reference_batch: int | None,
    guarded: bool,
) -> tuple[Any, int | None, Callable[[int | None], Any] | None]:
    """The scheduler the run steps, the schedule's horizon (optimizer steps; None for a user's
    scheduler, which has its own) and how to rebuild it for another horizon (None: it is not
    rebuilt). With `given`, the user's scheduler wins over `[schedule]`, and any `[schedule]`
    setting it overrides is named in one warning line; it is stepped per `schedule.interval`,
    said in one set-up line, and rehearsed over the run's steps before training.

    `epoch_steps` is run.max_epochs × the optimizer steps of an epoch (None without an epoch
    budget); `steps_per_epoch` the steps of one epoch (None: from `epoch_steps`, or unknown).
    A user's scheduler is scaled to `effective_batch` from optimizer.reference_batch
    (`reference_batch`) and, with guard.enabled (`guarded`), watched for a collapsing rate.
    Nine parameters: the schedule's inputs, each read here alone."""
    interval = schedule.interval
    if given is None:
        if interval != "step":
            raise ConfigError(
                f"schedule.interval = {interval!r} is invalid without a scheduler of your own: "
                "thrifty's [schedule] counts optimizer steps (schedule.warmup_steps, "
                "schedule.total_steps); name one with task.scheduler (or Trainer(scheduler=...)),"
                " or remove schedule.interval"
            )
        horizon = schedule_horizon(schedule, run.max_steps, epoch_steps)
        make = functools.partial(scheduler_for, optimizer, schedule)
        return make(horizon), horizon, make
    if steps_per_epoch is None and epoch_steps and run.max_epochs:
        steps_per_epoch = epoch_steps // run.max_epochs
    per_epoch = interval == "epoch"
    if per_epoch and not steps_per_epoch:
        raise ConfigError(
            "schedule.interval = 'epoch' needs the optimizer steps of an epoch, which this run "
            "does not know: give data of known length and run.max_epochs, or step the scheduler "
            "per optimizer step (schedule.interval = 'step')"
        )
    user = adopt_scheduler(given, optimizer, effective_batch, reference_batch)
    user.epoch_steps = steps_per_epoch if per_epoch else None
    ignored = set_schedule_keys(schedule)
    if ignored:
        log.warning(
            "%s sets the learning rate; [schedule] is ignored: %s (remove those settings, or "
            "the scheduler to use them)",
            user.label,
            ", ".join(ignored),
        )
    bounds = RunHorizon.of(run, epoch_steps, steps_per_epoch)
    check_before_training(user, bounds)
    if guarded:
        user.watch = CollapseWatch.of(user.label, optimizer, bounds.steps, collapse_fix(user))
    log.info("learning rate: %s, %s", user.label, describe_interval(user))
    return user, None, None


def describe_interval(user: UserScheduler) -> str:
    """How often the run steps the scheduler, for the set-up line."""
    if user.epoch_steps is None:
        return "stepped once per optimizer step (schedule.interval = 'step')"
    return (
        f"stepped once per epoch of {user.epoch_steps} optimizer steps "
        "(schedule.interval = 'epoch')"
    )


def collapse_fix(user: UserScheduler) -> str:
    """What the guard's line proposes when the schedule takes the rate to nearly nothing."""
    if user.epoch_steps is None:
        return (
            "it is stepped once per optimizer step (schedule.interval = 'step'); a scheduler "
            "written per epoch, as PyTorch's StepLR, MultiStepLR and ExponentialLR are, needs "
            f"schedule.interval = 'epoch' (or check {user.arguments})"
        )
    return f"check {user.arguments} (it is stepped once per epoch: schedule.interval = 'epoch')"


def check_before_training(user: UserScheduler, horizon: RunHorizon) -> None:
    """Refuse, before any step is paid for, a scheduler that would fail within the run's
    steps: a OneCycleLR stepped past its total_steps, or any scheduler whose step raises in a
    rehearsal on a copy (the run's steps, at most REHEARSAL_STEPS).

    Where a time or token budget alone bounds the run, its steps are not known: a scheduler
    that fails at its first step is refused, one that fails later is named in one warning
    line (the budget may end first; if not, the run stops there with one line)."""
    per = user.epoch_steps
    unit = "epochs" if per is not None else "optimizer steps"
    if horizon.steps is None:
        steps = REHEARSAL_STEPS
    else:
        steps = horizon.steps // per if per is not None else horizon.steps
        check_total_steps(user.scheduler, user.label, steps, horizon, unit, user.arguments)
    failed = rehearse(user.scheduler, steps)
    if failed is None:
        return
    step, exc = failed
    if horizon.steps is not None or step == 1:
        where = (
            f"its step {step} of the {steps} {unit} this run takes ({horizon.source})"
            if horizon.steps is not None
            else "its first step"
        )
        raise ConfigError(
            f"{user.label} fails at {where}, found before training: {one_line(exc)}; fix "
            f"{user.arguments}"
        )
    log.warning(
        "%s fails at its step %d (%s), found before training; this run's budget is not in "
        "steps, so it trains, and stops there with one line if it gets that far: fix %s, or "
        "set run.max_steps",
        user.label,
        step,
        one_line(exc),
        user.arguments,
    )


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
        try:
            scheduler = given(optimizer)
        except ThriftyError:
            raise
        except Exception as exc:  # the user's code: one line naming it, not its traceback
            raise ThriftyError(
                f"{source} raised {one_line(exc)} when called on the optimizer: fix the "
                f"factory or {_arguments(given)}"
            ) from exc
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
    return UserScheduler(scheduler, label, arguments=_arguments(given))


def _arguments(given: Any) -> str:
    """Where the scheduler's arguments are set, for messages: "task.scheduler_args"."""
    if isinstance(given, ConfigScheduler):
        return f"{given.where.split(' =')[0]}_args"
    return "the scheduler's arguments"


def _check_scheduler(scheduler: LRScheduler, label: str) -> None:
    """Refuse a scheduler that needs a metric to step, or whose state no checkpoint holds;
    `label` is the subject of the message ("scheduler=StepLR")."""
    if needs_metric(scheduler):
        raise ThriftyError(
            f"{label} steps on a metric (step(metrics)), and thrifty steps the scheduler once "
            "per optimizer step, with none: use a scheduler of steps (StepLR, LambdaLR, "
            "OneCycleLR, SequentialLR, ...), or early_stopping.patience to stop on a plateau"
        )
    from thrifty.checkpointing.store.snapshot import copy_to_host

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
