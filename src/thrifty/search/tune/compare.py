"""A paired comparison: a candidate against the incumbent in alternating runs, A B A B ... A,
within the budget (the statistics are in `thrifty.search.tune.paired`).

Each run repeats the setting its trial resolved (the micro-batch and workers "auto" found), a
trial of its own in the tune's warm worker (`thrifty.search.engine`), one after the other, so
the two never share the machine's memory. Runs are named after the comparison: NAME.a0,
NAME.b1, NAME.a1, NAME.b2, ... (a: the incumbent, b: the candidate). A run measures about
`block_seconds()` of steady-state steps (as many steps as the slower of the two trials took in
that time, at least MIN_MEASURED_STEPS), both settings the same number: BLOCK_SECONDS (1 s) in
a warm worker, where a run starts in a tenth of a second, so that the machine's drift cancels
at the scale of a second and a round costs little more than its steps; COLD_BLOCK_SECONDS (3 s)
with a process per run (THRIFTY_COLD_TRIALS=1), whose start was most of what a round cost.

Rounds: MIN_ROUNDS first, and then one more at a time while the interval leaves the decision
open, up to MAX_ROUNDS, and while the budget has room for another round (a run's cost is the
shortest finished run of its setting, before the first its trial's time corrected for the
steps the run measures more or fewer). A comparison the budget has no room for is not run: its candidate
is not kept.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thrifty.search.engine import COLD
from thrifty.search.tune.paired import (
    KEPT,
    MAX_ROUNDS,
    MIN_GAIN,
    MIN_ROUNDS,
    NO_GAIN,
    UNDECIDED,
    Estimate,
    bracketed_ratios,
    estimate,
    spread,
)
from thrifty.search.tune.trials import Candidate, Trial, warmup_steps

BLOCK_SECONDS = 1.0  # steady-state seconds each run measures, in a warm worker
COLD_BLOCK_SECONDS = 3.0  # ... with a process per run, as before the warm worker
MIN_MEASURED_STEPS = 2
FINAL = "final"  # the stage (and name) of the winner's re-measurement against the config as given

# Decisions besides paired's "kept" and "no gain".
TOO_NOISY = "too noisy"  # still open after MAX_ROUNDS
OPEN = "undecided"  # still open when the budget ended
NOT_RUN = "not run"  # no room in the budget for MIN_ROUNDS
FAILED = "failed"  # a run failed where its trial had not


@dataclass(slots=True, kw_only=True)
class Comparison:
    """`candidate` (B) against `incumbent` (A), in the runs `blocks` (A B A ... A, as run).
    `stage` is the lever's stage, or FINAL for the winner against the config as given;
    `decision`: running, kept, no gain, too noisy, undecided, not run or failed; `line`
    says it in one line."""

    name: str
    stage: str
    unit: str
    incumbent: Trial
    candidate: Trial
    as_given: bool  # the incumbent is the config as given
    blocks: list[Trial] = field(default_factory=list)
    decision: str = "running"
    line: str = ""

    def runs(self, role: str) -> list[Trial]:
        """The runs of role "a" (the incumbent) or "b", in order."""
        return [t for t in self.blocks if t.name.rsplit(".", 1)[1][0] == role]

    def rates(self, role: str) -> list[float]:
        """The finished runs' rates of `role`, in order."""
        return [t.rate(self.unit) or 0.0 for t in self.runs(role) if t.ok]

    @property
    def ratios(self) -> list[float]:
        return bracketed_ratios(self.rates("a"), self.rates("b"))

    @property
    def estimate(self) -> Estimate | None:
        return estimate(self.ratios)

    @property
    def kept(self) -> bool:
        return self.decision == KEPT

    @property
    def reverts(self) -> bool:
        """The final comparison found the winner no faster than the config as given (or one of
        its runs failed): the tune keeps the config as given."""
        if self.stage != FINAL:
            return False
        ratio = self.ratio
        slower = ratio is not None and ratio <= 1.0
        return self.decision in (NO_GAIN, FAILED) or (self.decision in (TOO_NOISY, OPEN) and slower)

    @property
    def ratio(self) -> float | None:
        """B over A as measured: the estimate's, or a single round's (None: no round)."""
        est, ratios = self.estimate, self.ratios
        if est is not None:
            return est.ratio
        return ratios[0] if ratios else None

    def to_dict(self) -> dict[str, Any]:
        est = self.estimate
        figures = est.to_dict() if est else {"ratio": self.ratio, "low": None, "high": None}
        return {
            "name": self.name,
            "stage": self.stage,
            "incumbent": self.incumbent.name,
            "candidate": self.candidate.name,
            "decision": self.decision,
            "line": self.line,
            **figures,
            "rounds": len(self.ratios),
            "ratios": self.ratios,
            "incumbent_spread": spread(self.rates("a")),
            "blocks": [t.to_dict() for t in self.blocks],
        }


def run_rounds(
    c: Comparison, run: Callable[[Candidate], Trial], left: Callable[[], float]
) -> Comparison:
    """Run `c`'s rounds and decide: `run(candidate)` runs one process and adds it to
    `c.blocks`; `left()` is the seconds the budget has left for them."""
    measured = measured_steps(c.incumbent, c.candidate)
    settings = {"a": c.incumbent.resolved, "b": c.candidate.resolved}

    def block(role: str, index: int) -> bool:
        s = settings[role]
        return run(Candidate(f"{c.name}.{role}{index}", c.stage, s, warmup_steps(s) + measured)).ok

    need = needed(c, measured)
    if left() < need:
        return conclude(c, why=f"needs about {need:.0f} s, {max(0.0, left()):.0f} s left")
    if block("a", 0):
        for n in range(1, MAX_ROUNDS + 1):
            if n > MIN_ROUNDS and left() < cost(c, "a", measured) + cost(c, "b", measured):
                break
            if not (block("b", n) and block("a", n)):
                break
            est = c.estimate
            if n >= MIN_ROUNDS and est is not None and est.verdict() != UNDECIDED:
                break
    return conclude(c)


def needed(c: Comparison, measured: int | None = None) -> float:
    """Seconds the first MIN_ROUNDS of `c` take: A, then B A per round."""
    if measured is None:
        measured = measured_steps(c.incumbent, c.candidate)
    a, b = cost(c, "a", measured), cost(c, "b", measured)
    return a + MIN_ROUNDS * (a + b)


def cost(c: Comparison, role: str, measured: int) -> float:
    """Seconds a run of `role` takes: its shortest finished run, else its trial's time less the
    steps the trial measured beyond the run's `measured` (plus those it measured fewer)."""
    done = [t.wall_seconds for t in c.runs(role) if not ended_by_budget(t)]
    if done:
        return min(done)
    trial = c.incumbent if role == "a" else c.candidate
    beyond = (trial_measured(trial) or measured) - measured
    return max(0.0, trial.wall_seconds - beyond * (trial.step_seconds or 0.0))


def trial_measured(trial: Trial) -> int | None:
    """The steps a trial measured (after its warm-up), where known."""
    if trial.steps_completed is None:
        return None
    return trial.steps_completed - warmup_steps(trial.resolved)


def block_seconds() -> float:
    """The steady-state seconds a run measures: BLOCK_SECONDS in a warm worker,
    COLD_BLOCK_SECONDS with a process per run."""
    return COLD_BLOCK_SECONDS if os.environ.get(COLD) == "1" else BLOCK_SECONDS


def measured_steps(a: Trial, b: Trial) -> int:
    """Steps each run measures: about `block_seconds()` at the slower trial's pace, at least
    MIN_MEASURED_STEPS."""
    slower = max(a.step_seconds or 0.0, b.step_seconds or 0.0)
    wanted = math.ceil(block_seconds() / slower) if slower > 0 else MIN_MEASURED_STEPS
    return max(MIN_MEASURED_STEPS, wanted)


def conclude(c: Comparison, why: str = "") -> Comparison:
    """The decision and its line, from the runs made (`why`: why none was)."""
    est = c.estimate
    trouble = next((t for t in c.blocks if not t.ok), None)
    if why:
        c.decision = NOT_RUN
    elif trouble is not None and not ended_by_budget(trouble):
        c.decision = FAILED
    elif est is None:  # one round at most: its ratio is said, but it decides nothing
        c.decision = OPEN if c.ratios else NOT_RUN
        why = "" if c.ratios else "the budget ended before a round"
    else:
        verdict = est.verdict()
        if verdict == UNDECIDED:
            verdict = TOO_NOISY if est.rounds >= MAX_ROUNDS else OPEN
        c.decision = verdict
    c.line = line(c, why, trouble)
    return c


def ended_by_budget(run: Trial) -> bool:
    """The budget ended `run`: stopped mid-run, or still before its first step (what a
    screening trial calls hung is, in a paired run of a setting that already ran, the budget
    ending while it compiled)."""
    return run.status == "stopped" or run.failure == "hung"


def line(c: Comparison, why: str, trouble: Trial | None) -> str:
    """The decision in one line."""
    est = c.estimate
    if c.stage == FINAL:
        head = f"the winner {c.candidate.name} re-measured against the config as given"
    else:
        head = f"{c.candidate.name} against {c.incumbent.name}"
    if c.decision == NOT_RUN:
        return f"{head}: not measured ({why}); {outcome(c)}"
    if c.decision == FAILED and trouble is not None:
        return f"{head}: run {trouble.name} failed ({trouble.error}); {outcome(c)}"
    if est is None:  # one round: an interval needs two
        return (
            f"{head}: {c.ratios[0]:.2f}x {c.unit}/s in its one round; the budget ended before "
            f"a second, which an interval needs; {outcome(c)}"
        )
    figure = f"{head}: {est.describe()} {c.unit}/s over {est.rounds} alternating rounds"
    if c.decision == KEPT:
        return f"{figure}: {outcome(c)}"
    if c.decision == NO_GAIN:
        return f"{figure}: no gain of {MIN_GAIN:.0%} or more; {outcome(c)}"
    if c.decision == TOO_NOISY:
        swing = spread(c.rates("a"))
        return (
            f"{figure}, while {c.incumbent.name}'s own runs ranged {swing:.2f}x: the machine's "
            f"throughput swings more than the difference measured; {outcome(c)}"
        )
    return f"{figure}: the budget ended before it could tell; {outcome(c)}"


def outcome(c: Comparison) -> str:
    """What the tune does with the decision."""
    keeping = "the config as given" if c.as_given else c.incumbent.name
    if c.stage != FINAL:
        return "kept" if c.kept else f"keeping {keeping}"
    if c.kept:
        return "confirmed"
    if c.reverts:
        return "keeping the config as given"
    return "not confirmed; the winner stands on its levers' own paired comparisons"
