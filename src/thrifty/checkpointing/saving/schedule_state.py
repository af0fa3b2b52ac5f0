"""The learning-rate scheduler on resume: the same scheduler continues exactly where the
checkpoint left it; another one (thrifty's `[schedule]` for a user's scheduler, another user's
scheduler, other `task.scheduler_args`) is refused, or with `run.allow_config_change` starts at
the step the checkpoint's scheduler had reached."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from thrifty.errors import ConfigError
from thrifty.levers.user_scheduler import OWN_KIND, STEPS_KEY, UserScheduler
from thrifty.rundir.config_changes import ResumeChanges, reapply_optimizer_settings

log = logging.getLogger("thrifty")


def scheduler_kind(scheduler: Any) -> str:
    """What a checkpoint records of the scheduler: the user's scheduler class, or OWN_KIND."""
    return scheduler.kind if isinstance(scheduler, UserScheduler) else OWN_KIND


def _describe(kind: str) -> str:
    return "thrifty's [schedule]" if kind == OWN_KIND else kind


def restore_scheduler(
    scheduler: Any,
    state: Mapping[str, Any],
    settings: Sequence[Mapping[str, Any]],
    changes: ResumeChanges,
    allow: bool,
) -> None:
    """Load the checkpoint's scheduler state into `scheduler`, once the optimizer's is loaded.

    `settings` are the optimizer's param-group hyperparameters as this run built them (taken
    before the checkpoint's were loaded); they are put back when the optimization changed."""
    saved_kind = str(state.get("scheduler_kind", OWN_KIND))  # older checkpoints: the own one
    kind = scheduler_kind(scheduler)
    # task.scheduler, task.scheduler_args.<name>, schedule.interval: the state saved is
    # another scheduler's, or one stepped at another interval
    reconfigured = any(
        c.key.startswith("task.scheduler") or c.key == "schedule.interval" for c in changes.changes
    )
    if saved_kind != kind or reconfigured:
        if not allow:
            raise ConfigError(
                f"the checkpoint's learning rate follows {_describe(saved_kind)} and this "
                f"run's {_describe(kind)}: resume with the scheduler that wrote it, or pass "
                "--allow-config-change (run.allow_config_change = true) to start this run's at "
                "the step the checkpoint reached"
            )
        saved = state["scheduler"]
        # The optimizer steps the run had taken: counted by a user's scheduler, the schedule's
        # own step for thrifty's (one per optimizer step).
        step = int(saved.get(STEPS_KEY, saved.get("last_epoch", 0)))
        start_at(scheduler, settings, step)
        log.warning(
            "the learning rate follows %s from the checkpoint's optimizer step %d on (it "
            "followed %s)",
            _describe(kind),
            step,
            _describe(saved_kind),
        )
        return
    scheduler.load_state_dict(state["scheduler"])
    if not changes.optimization:
        return
    if isinstance(scheduler, UserScheduler):
        reapply_to_user_scheduler(scheduler, settings)
    else:
        reapply_optimizer_settings(scheduler.optimizer, scheduler, settings)


def start_at(scheduler: Any, settings: Sequence[Mapping[str, Any]], step: int) -> None:
    """This run's own scheduler, stepped `step` times from where it was built: another
    schedule picks up at the step the run has reached."""
    for group, fresh in zip(scheduler.optimizer.param_groups, settings, strict=True):
        group.update(fresh)
    user = scheduler if isinstance(scheduler, UserScheduler) else UserScheduler(scheduler)
    user.advance(step)


def reapply_to_user_scheduler(
    scheduler: UserScheduler, settings: Sequence[Mapping[str, Any]]
) -> None:
    """Put this run's hyperparameters back after loading a checkpoint, keeping the user's
    schedule where it was: the current rate is scaled by the change of the peak rate
    (initial_lr), which is what any multiplicative schedule would have reached."""
    optimizer = scheduler.optimizer
    for group, fresh in zip(optimizer.param_groups, settings, strict=True):
        old, lr = group.get("initial_lr"), group["lr"]
        group.update({k: v for k, v in fresh.items() if k != "lr"})
        new = group.get("initial_lr")
        group["lr"] = lr * new / old if old and new is not None else fresh["lr"]
    scheduler.base_lrs = [group["initial_lr"] for group in optimizer.param_groups]
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
