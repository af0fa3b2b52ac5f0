"""Checks of a user's learning-rate scheduler against the run it will step.

At set-up, before any step is paid for: the run's horizon (`RunHorizon`, the optimizer steps
its budget allows, where the budget says), a `OneCycleLR` whose `total_steps` the run would
step past, and a rehearsal (`rehearse`) that steps a copy of the scheduler, on a stand-in for
the optimizer, as many times as the run will (at most `REHEARSAL_STEPS`): a scheduler that
raises at its first step (`CosineAnnealingLR(T_max=0)`, a `step_size` given as text) or at
any step of a bounded run is refused in one line before training.

During the run: `CollapseWatch`, asked at each metrics flush, says once in one warning line
that the schedule took the learning rate below `COLLAPSE_FRACTION` of its start within the
first tenth of the run, the mark of a scheduler written for epochs and stepped per step.
"""

from __future__ import annotations

import copy
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, OneCycleLR

from thrifty.config import RunConfig
from thrifty.errors import ConfigError

log = logging.getLogger("thrifty")

# At most this many scheduler steps are rehearsed at set-up (a torch scheduler's step takes
# about 10 µs: a tenth of a second at most).
REHEARSAL_STEPS = 10_000
# A learning rate below this fraction of its start within the first tenth of the run is
# named: no schedule meant to train keeps a thousandth of its rate for 90% of the run.
COLLAPSE_FRACTION = 1e-3
# With no horizon in steps (a time or token budget), the first this many optimizer steps are
# watched instead of the first tenth.
UNKNOWN_HORIZON_WATCH = 1000


@dataclass(frozen=True)
class RunHorizon:
    """The optimizer steps the run's budget allows (None where a time or token budget alone
    bounds it) and the words that say where the number comes from."""

    steps: int | None
    source: str = ""

    @classmethod
    def of(cls, run: RunConfig, epoch_steps: int | None, steps_per_epoch: int | None) -> RunHorizon:
        """From run.max_steps and run.max_epochs × the steps of an epoch (`epoch_steps`, the
        epochs' steps in all), the smaller where both are set."""
        known: list[tuple[int, str]] = []
        if run.max_steps is not None:
            known.append((run.max_steps, f"run.max_steps = {run.max_steps}"))
        if epoch_steps is not None and run.max_epochs is not None:
            per = f" × {steps_per_epoch} steps" if steps_per_epoch else ""
            known.append((epoch_steps, f"run.max_epochs = {run.max_epochs}{per}"))
        if not known:
            return cls(None)
        steps, source = min(known)
        return cls(steps, source)


def check_total_steps(
    scheduler: LRScheduler, label: str, needed: int, horizon: RunHorizon, unit: str, arguments: str
) -> None:
    """Refuse a OneCycleLR that the run would step `needed` times, past its total_steps (it
    raises at that step, mid-run, after the steps before it were paid for)."""
    if not isinstance(scheduler, OneCycleLR) or scheduler.total_steps >= needed:
        return
    raise ConfigError(
        f"{label} has total_steps = {scheduler.total_steps}, fewer than the {needed} {unit} "
        f"this run steps it ({horizon.source}), and would fail at its step "
        f"{scheduler.total_steps + 1}: give it total_steps = {needed} ({arguments}), or a "
        "smaller budget"
    )


class _StandIn:
    """What a scheduler sees of its optimizer in a rehearsal: copies of the param groups'
    hyperparameters (what a scheduler writes), without their parameters; stepping it does
    nothing; anything else is read from the optimizer itself (its state, for a scheduler
    that looks at it)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer
        self.param_groups = [
            {**copy.deepcopy({k: v for k, v in g.items() if k != "params"}), "params": []}
            for g in optimizer.param_groups
        ]
        self.defaults = copy.deepcopy(optimizer.defaults)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._optimizer, name)

    def step(self, *args: Any, **kwargs: Any) -> None:
        return None


def rehearse(scheduler: LRScheduler, steps: int) -> tuple[int, BaseException] | None:
    """Step a copy of `scheduler` `steps` times (at most REHEARSAL_STEPS) on a stand-in for
    its optimizer; the step it failed at (1-based) and the exception, or None. The scheduler,
    its optimizer and the parameters are left as they were. A scheduler that cannot be
    copied is not rehearsed (its own steps in the run will say what fails)."""
    optimizer = scheduler.optimizer
    memo: dict[int, Any] = {id(optimizer): _StandIn(optimizer)}
    for group in optimizer.param_groups:  # never copied, whatever holds them
        for p in group["params"]:
            memo[id(p)] = p
    try:
        rehearsal = copy.deepcopy(scheduler, memo)
    except Exception:  # a lock, a file, a generator: nothing to rehearse on
        return None
    with warnings.catch_warnings():
        # No optimizer step comes first here, by design; the stand-in is no optimizer.
        warnings.simplefilter("ignore")
        for i in range(1, min(steps, REHEARSAL_STEPS) + 1):
            try:
                rehearsal.step()
            except Exception as exc:
                return i, exc
    return None


def one_line(exc: BaseException) -> str:
    """`Type: text` on one line, for a message that quotes another library's exception."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class CollapseWatch:
    """Says once that a schedule took the learning rate below COLLAPSE_FRACTION of its start
    within the first tenth of the run (`window` optimizer steps). Asked at metrics flushes
    only; a flush after the window is judged only if no flush came within it (a
    run.log_every longer than the window)."""

    label: str  # "task.scheduler = '...'", "scheduler=StepLR"
    start: list[float]  # each param group's learning rate at the run's first step
    window: int  # optimizer steps watched
    planned: int | None  # the run's optimizer steps, where known
    fix: str  # what the message proposes
    done: bool = False
    seen_flush: bool = field(default=False, repr=False)

    @classmethod
    def of(
        cls, label: str, optimizer: torch.optim.Optimizer, planned: int | None, fix: str
    ) -> CollapseWatch:
        window = max(1, planned // 10) if planned else UNKNOWN_HORIZON_WATCH
        start = [float(g["lr"]) for g in optimizer.param_groups]
        return cls(label, start, window, planned, fix)

    def at_flush(self, step: int, optimizer: torch.optim.Optimizer) -> None:
        """Judge the rate at optimizer step `step` (one read of each group's rate)."""
        if self.done or step <= 0:
            return
        if step > self.window and self.seen_flush:
            self.done = True
            return
        self.seen_flush = True
        self.done = step >= self.window
        for start, group in zip(self.start, optimizer.param_groups, strict=True):
            lr = float(group["lr"])
            if start > 0 and lr < COLLAPSE_FRACTION * start:
                self.done = True
                self._warn(start, lr, step)
                return

    def _warn(self, start: float, lr: float, step: int) -> None:
        within = (
            f"the first tenth of the run's {self.planned} steps"
            if self.planned
            else f"the first {self.window} steps watched (the run's length in steps is not known)"
        )
        log.warning(
            "guard: %s took the learning rate from %.3g to %.3g by optimizer step %d, below "
            "%g of its start within %s: %s",
            self.label,
            start,
            lr,
            step,
            COLLAPSE_FRACTION,
            within,
            self.fix,
        )
