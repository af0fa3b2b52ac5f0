"""Hyperband as the algorithm prescribes it: synchronous successive halving in each bracket.

Hyperband (Li et al., 2018) runs brackets of successive halving. Its resource is counted from
the schedule's warm-up (schedule.warmup_steps, 0 by default), during which the learning rate is
still climbing and the trials with the highest rates lead, so that a rung inside it would keep
the wrong ones: from w, the last evaluation at or before the warm-up's last step (the largest
multiple of eval.every not above it; 0 without a warm-up). With the smallest resource r
(eval.every steps), the largest R (run.max_steps − w) and η = 3, s_max = ⌊log_η(R/r)⌋;
bracket s (s_max down to 0) starts n_s = ⌈(s_max + 1)/(s + 1) · η^s⌉ trials and compares them
at s rungs, w + r·η^(s_max − s), then η times further each (every one an evaluation, after the
warm-up and below run.max_steps), keeping the best ⌊n/η⌋ (at least one) at each; the survivors
run to the last step. With R/r = 9: brackets of 9, 5 and 3 trials; the first stops 6 at its
first rung and 2 at its second. With a warm-up of 30 steps, eval.every 10 and 90 steps
(R/r = 6): brackets of 3 trials, compared at step 40, and of 2.

Asynchronous implementations (ASHA; Optuna's HyperbandPruner; wandb's) decide each trial as it
reaches a rung, against only those that reached it before: early arrivals pass easily, and far
fewer trials are stopped than the algorithm says. Here a trial that reaches a rung before the
rest of its bracket is paused instead: its run saves a checkpoint and ends (exit 75, as after a
preemption) and its worker takes up another trial. Once every trial of the bracket has reported
at the rung (a failed one counts as worst), the best ⌊n/η⌋ resume from their checkpoints and
the others are pruned. A resumable trial costs nothing to pause, which is what makes the
synchronous algorithm affordable.

Trials join brackets in the order of their numbers: the first n_{s_max} the most aggressive
bracket, the next n_{s_max − 1} the next, and so on, a new round after the last. The sweep's
--trials (default: one round) cuts the last bracket short; so does a budget that stops new
trials, and then the bracket decides among those it has.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

REDUCTION = 3
GO, PRUNE, WAIT = "go", "prune", "wait"


@dataclass(frozen=True, slots=True)
class Bracket:
    """One bracket: `size` trials, compared at each step in `rungs`."""

    s: int
    size: int
    rungs: tuple[int, ...]


def brackets(every: int, last: int, eta: int = REDUCTION, *, warmup: int = 0) -> list[Bracket]:
    """The brackets of one Hyperband round, most aggressive first, for trials evaluated every
    `every` steps up to step `last` after a warm-up of `warmup` steps (see the module's
    docstring). Where no rung fits after the warm-up: one bracket of one trial, without rungs."""
    start = warmup // every * every  # the last evaluation at or before the warm-up's last step
    resource = last - start
    s_max = 0
    if resource >= every:
        s_max = max(0, math.floor(math.log(resource / every, eta) + 1e-9))
    out = []
    for s in range(s_max, -1, -1):
        size = math.ceil((s_max + 1) / (s + 1) * eta**s)
        # s rungs, each an evaluation (a multiple of `every`) after the warm-up, below `last`.
        rungs = tuple(start + every * eta ** (s_max - s + k) for k in range(s))
        out.append(Bracket(s, size, rungs))
    return out


def first_judged(every: int, warmup: int) -> int:
    """The first evaluation after a warm-up of `warmup` steps: `every` without one."""
    return (warmup // every + 1) * every


def has_rungs(plan: Sequence[Bracket]) -> bool:
    """Whether any bracket of `plan` compares its trials anywhere (else Hyperband stops none)."""
    return any(b.rungs for b in plan)


def round_size(plan: Sequence[Bracket]) -> int:
    """Trials in one round of all brackets."""
    return sum(b.size for b in plan)


def membership(number: int, plan: Sequence[Bracket]) -> tuple[int, Bracket, range]:
    """Trial `number`'s bracket: (its first trial's number, the bracket, all its numbers)."""
    offset = (number // round_size(plan)) * round_size(plan)
    for bracket in plan:
        if number < offset + bracket.size:
            return offset, bracket, range(offset, offset + bracket.size)
        offset += bracket.size
    raise AssertionError("unreachable: a round covers every number")


@dataclass(frozen=True, slots=True)
class Verdict:
    """What a trial at a rung does: go on, stop (prune), or wait for its bracket; `reason` says
    why, `bound` is the worst loss that went on."""

    action: str
    reason: str = ""
    bound: float | None = None


def decide(
    number: int,
    step: int,
    curves: Mapping[int, Mapping[int, float]],
    failed: set[int],
    plan: Sequence[Bracket],
    limit: int | None,
    eta: int = REDUCTION,
) -> Verdict:
    """The verdict for trial `number`, which has reported at `step`. `curves`: every trial's
    reports by number ({step: loss}); `failed`: trials that ended without a value (worst at
    every rung); `limit`: the number of trials the sweep will have at most (None: no limit)."""
    _, bracket, numbers = membership(number, plan)
    if step not in bracket.rungs:
        return Verdict(GO)
    members = [n for n in numbers if limit is None or n < limit]
    alive = members
    for rung in bracket.rungs:
        values = {}
        for n in alive:
            if n in failed:
                values[n] = math.inf
            elif rung in curves.get(n, {}):
                values[n] = curves[n][rung]
        if len(values) < len(alive):
            if rung == step:
                return Verdict(
                    WAIT,
                    f"waiting for {len(alive) - len(values)} more trial(s) of its "
                    f"bracket to reach step {rung}",
                )
            return Verdict(WAIT, f"its bracket has not finished step {rung}")
        keep = max(1, len(alive) // eta)
        ranked = sorted(alive, key=lambda n: (values[n], n))
        survivors = ranked[:keep]
        if rung == step:
            bound = values[survivors[-1]]
            if number in survivors:
                return Verdict(GO, bound=bound)
            return Verdict(
                PRUNE,
                f"loss {values[number]:.4g} at step {rung} is not among the best {keep} of the "
                f"{len(alive)} trials of its bracket (Hyperband, η = {eta}; needs {bound:.4g} "
                "or less)",
                bound,
            )
        if number not in survivors:
            return Verdict(PRUNE, f"it did not pass step {rung} of its bracket")
        alive = survivors
    return Verdict(GO)
