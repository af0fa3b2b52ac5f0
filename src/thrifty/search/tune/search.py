"""The search: the config as given, then one lever at a time from the best setting so far,
in the seeds' order of impact, skipping what cannot win, within a budget.

Stages (each only for the levers searched): workers (the measured count, when the config
fixes one), precision, micro (the largest micro-batch that fits under each checkpointing
policy, lightest first), compile (default, then max-autotune; on a CUDA GPU default,
max-autotune without and with CUDA graphs, then CUDA graphs alone: reduce-overhead), and last
fp8, from the best setting so far, compiled where compile won (torchao's float8 pays only
compiled). Each candidate runs one short trial, a screening: on a machine whose throughput
swings, one reading per setting cannot tell a gain from the swing. A stage's best trial, when
it beats the incumbent (the best setting so far, at first the config as given) in its trial,
is then compared with it in alternating runs (`thrifty.search.tune.compare`), and it becomes the
incumbent only when that paired comparison keeps it. A winner two levers or more from the
config as given is re-measured against it the same way at the end; when it is not faster
there, the config as given is the winner (a winner one lever away was compared with the
config as given itself). The lowest cost per token at one price is the highest tokens per
second (samples without tokens), so trials are ranked by throughput.

Pruned, because it cannot win:
  * fp16 once bf16 ran: the same tensor-core peak, plus loss scaling;
  * fp32 on a CUDA GPU once bf16 ran there: at most half bf16's tensor-core peak (TF32) and
    twice its activation memory (on a CPU bf16 may be emulated, so fp32 is measured);
  * fp8 without torch.compile: torchao's float8 scales and casts each tensor in kernels of
    its own, which compile fuses (uncompiled it was slower than bf16 at every size in
    pytorch/ao#685, and 0.39x of bf16 for GPT-2 124M on an H200,
    benchmarks/results/h200-run3-tune.log);
  * a micro-batch no larger than one that already fits under the same or a lighter policy:
    no larger batch for as much recompute or more;
  * a micro-batch at least as large as one that ran out of memory under the same policy;
  * a heavier checkpointing policy that, by the memory a lighter policy's trial measured on a
    GPU, would not fit the micro-batch it needs to win (for "auto", the size after the lighter
    trial's: `Trial.checkpointing_fits`, with ROOM_SLACK for the prediction's error);
  * any other compile mode once the default compile mode failed (not for the budget).
Kept only where its loss holds: an fp8 trial (bf16 with float8 linears) may become the
incumbent only when the mean training loss of its last steps is within 0.01 nats of the bf16
trial's (of its own setting where one ran), the same steps on the same data
(`thrifty.levers.fp8.parity`); each check is one of the outcome's `checks` lines.
Not kept: a trial whose "auto" values resolved to what the incumbent runs (workers "auto"
measured the count the config already fixes): a change of nothing, however fast its one
reading was.
Not reached: a candidate that needs more time than the budget has left (its estimate is the
shortest finished trial like it; an autotuning mode's MAX_AUTOTUNE_FACTOR times the default
mode's, or longer than one that was still compiling when its time ran out). What is to come
is held back from each candidate's time, and a trial is ended where that time begins: the
paired comparison of the stage's leader (its best trial so far that beat the incumbent), and
the winner's re-measurement where it will have one. A measured gain is never left
unconfirmed for a candidate that might have beaten it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from thrifty.levers.fp8 import parity
from thrifty.search.tune.compare import FINAL, Comparison, needed, run_rounds
from thrifty.search.tune.space import AUTO, AUTOTUNE_MODES, Setting, Space, policy_rank
from thrifty.search.tune.trials import Candidate, Runner, Trial

STAGES = ("workers", "precision", "micro", "compile", "fp8")


def lever_of(stage: str) -> str:
    """The lever a stage changes: fp8's is precision, tried apart once compile ran."""
    return "precision" if stage == "fp8" else stage


# An autotuning mode compiles for far longer than the default one: on an H200, GPT-2 124M's
# max-autotune-no-cudagraphs trial had not finished compiling after 159 s where the default
# mode's whole trial took 44 s (benchmarks/results/h200-run3-tune.log).
MAX_AUTOTUNE_FACTOR = 4.0
# A heavier checkpointing policy is tried unless the micro-batch it needs is this much above
# the size it is predicted to fit: on the demo model's activations, counted for real, the size
# predicted needed 98-99.5% of the memory allowed (tests/test_activation_checkpointing.py); a
# GPU's allocator and the recomputation's own memory in backward add their error.
ROOM_SLACK = 1.1


@dataclass(frozen=True, slots=True)
class Skipped:
    """A candidate not run: `kind` "pruned" (it cannot win) or "not reached" (the budget)."""

    stage: str
    setting: Setting
    kind: str
    reason: str

    def describe(self) -> str:
        """The values it would have tried: "checkpointing all, micro auto"."""
        return changed_values(self.stage, self.setting)

    def to_dict(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "setting": self.setting.config_values(),
            "kind": self.kind,
            "reason": self.reason,
        }


@dataclass(slots=True)
class Outcome:
    """Every trial in the order run, what was skipped, the paired comparisons in the order run
    (the final re-measurement last), and the path: each incumbent in turn (the baseline
    first, when it finished). `stop` says why the search ended early, if it did."""

    trials: list[Trial] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    comparisons: list[Comparison] = field(default_factory=list)
    path: list[Trial] = field(default_factory=list)
    stop: str | None = None
    checks: list[str] = field(default_factory=list)  # the FP8 parity checks, one line each

    @property
    def baseline(self) -> Trial | None:
        return self.trials[0] if self.trials else None

    @property
    def unit(self) -> str:
        """ "tokens" when the task counts tokens, else "samples"."""
        return "tokens" if any(t.ok and t.tokens_per_second for t in self.trials) else "samples"

    @property
    def final(self) -> Comparison | None:
        """The winner's re-measurement against the config as given, once it ran."""
        return next((c for c in self.comparisons if c.stage == FINAL), None)

    @property
    def winner(self) -> Trial | None:
        """The last incumbent, or the config as given where the final re-measurement found
        that incumbent no faster."""
        if not self.path:
            return None
        final = self.final
        return self.path[0] if final is not None and final.reverts else self.path[-1]

    @property
    def levers(self) -> list[Comparison]:
        """The comparisons that kept each lever of the winner, in order."""
        if not self.path or self.winner is not self.path[-1]:
            return []
        return [c for c in self.comparisons if c.kept and c.stage != FINAL]

    @property
    def not_reached(self) -> list[Skipped]:
        return [s for s in self.skipped if s.kind == "not reached"]


class Search:
    """Runs the search over `space` from `baseline` (the config as given) with `runner`,
    ending by `deadline` (seconds on `clock`); `on_trial` hears of each trial and comparison
    run as it ends, `on_comparison` of each comparison once decided."""

    def __init__(
        self,
        space: Space,
        baseline: Setting,
        runner: Runner,
        deadline: float,
        clock: Callable[[], float] = time.monotonic,
        on_trial: Callable[[Trial], None] = lambda trial: None,
        on_comparison: Callable[[Comparison], None] = lambda comparison: None,
    ) -> None:
        self.space, self.baseline, self.runner = space, baseline, runner
        self.deadline, self.clock, self.on_trial = deadline, clock, on_trial
        self.on_comparison = on_comparison
        self.outcome = Outcome()

    @property
    def incumbent(self) -> Setting:
        """The best setting so far: where each stage starts."""
        path = self.outcome.path
        return path[-1].resolved if path else self.baseline

    def run(self) -> Outcome:
        first = self._trial("baseline", self.baseline)
        if first.ok:
            self.outcome.path.append(first)
        if first.failure == "bad_input":
            self.outcome.stop = "the config as given fails: every trial would fail alike"
            return self.outcome
        for stage in STAGES:
            for setting in self._candidates(stage):
                self._consider(stage, setting)
            self._advance(stage)
        self._remeasure()
        return self.outcome

    # --- candidates ------------------------------------------------------------------------

    def _candidates(self, stage: str) -> list[Setting]:
        """The settings `stage` tries from the best so far, those already run left out."""
        s, space = self.incumbent, self.space
        options: list[Setting] = []
        if stage == "workers" and space.searches("workers") and self.baseline.num_workers != AUTO:
            options = [s.with_(num_workers=AUTO)]
        elif stage == "precision":
            options = [s.with_(precision=p) for p in space.precisions if p != "fp8"]
        elif stage == "fp8" and "fp8" in space.precisions:
            options = [s.with_(precision="fp8")]
        elif stage == "micro":
            policies = space.policies or (s.checkpointing,)
            micros = space.micros or (s.micro,)
            options = [s.with_(checkpointing=c, micro=m) for c in policies for m in micros]
        elif stage == "compile":
            options = [s.with_(compile=mode) for mode in space.compile_modes]
        return [o for o in options if not self._seen(o)]

    def _seen(self, setting: Setting) -> bool:
        """Already run: each of its values is what a trial asked for or what it resolved
        (the config as given with "auto" precision resolved to bf16 ran bf16, workers "auto"
        resolved to 4 ran 4, and its micro "auto" would find the same size again)."""
        if setting == self.incumbent:
            return True
        return any(_covers(t, setting) for t in self.outcome.trials)

    def _consider(self, stage: str, setting: Setting) -> None:
        """Run `setting` unless it cannot win or the budget has no time for it."""
        why = self._pruned(stage, setting)
        if why is not None:
            self.outcome.skipped.append(Skipped(stage, setting, "pruned", why))
            return
        left = self._left(self.outcome.winner)
        leader = self._leader(stage)
        if leader is not None:  # its comparison, and the re-measurement were it kept, come first
            left = min(left, self._left(leader) - needed(self._against_incumbent(stage, leader)))
        need = self._estimate(setting)
        if left <= 0 or left < need:
            if left <= 0:
                reason = "the budget ran out"
            else:
                reason = f"needs about {need:.0f} s, {left:.0f} s left"
            if leader is not None:
                reason += f" once {leader.name}'s comparison is held back"
            self.outcome.skipped.append(Skipped(stage, setting, "not reached", reason))
            return
        # Ended where the time held back begins, however long its compiling takes.
        self._trial(stage, setting, self.clock() + left)

    def _trial(self, stage: str, setting: Setting, deadline: float | None = None) -> Trial:
        name = f"{len(self.outcome.trials):02d}-{stage}"  # the table shows what it sets
        ends = self.deadline if deadline is None else deadline
        trial = self.runner(Candidate(name, stage, setting), ends)
        self.outcome.trials.append(trial)
        self.on_trial(trial)
        return trial

    # --- the paired comparisons ------------------------------------------------------------

    def _advance(self, stage: str) -> None:
        """Make the stage's best trial the incumbent: at once when there is none (the config
        as given did not finish), else when it beat the incumbent in its trial and then in
        the paired comparison."""
        finished = [t for t in self.outcome.trials if t.ok and t.stage == stage]
        best = self._best([t for t in finished if self._loss_holds(t)])
        if best is None:
            return
        path = self.outcome.path
        if not path or self._compare(self._against_incumbent(stage, best), best).kept:
            path.append(best)

    def _leader(self, stage: str) -> Trial | None:
        """The stage's best trial so far, where it beat the incumbent in its trial (its
        comparison is still to come); None when none did, or without an incumbent."""
        if not self.outcome.path:
            return None
        return self._best([t for t in self.outcome.trials if t.ok and t.stage == stage])

    def _best(self, finished: list[Trial]) -> Trial | None:
        """The fastest of `finished` where, against the incumbent, it is a lever: it changed
        something ("auto" may choose what the incumbent runs: only noise) and beat the
        incumbent's trial. Without an incumbent, the fastest."""
        unit, path = self.outcome.unit, self.outcome.path
        if not finished:
            return None
        best = max(finished, key=lambda t: t.rate(unit) or 0.0)
        if path and best.resolved == path[-1].resolved:
            return None
        if path and (best.rate(unit) or 0.0) <= (path[-1].rate(unit) or 0.0):
            return None
        return best

    def _against_incumbent(self, stage: str, candidate: Trial) -> Comparison:
        return self._comparison(stage, self.outcome.path[-1], candidate)

    def _loss_holds(self, t: Trial) -> bool:
        """An fp8 trial's loss against the bf16 trial's over the same steps (its check is
        recorded); any other precision holds."""
        if t.resolved.precision != "fp8":
            return True
        same_steps = [
            r
            for r in self.outcome.trials
            if r.steps_completed == t.steps_completed
            and r.ok
            and r.resolved.precision == "bf16"
            and r.last_losses
        ]
        # The bf16 run of its very setting (compiled where it is) first.
        ref = next(
            (r for r in same_steps if _same_except(r.resolved, t.resolved, "precision")),
            next(iter(same_steps), None),
        )
        if ref is None or ref.last_losses is None or not t.last_losses:
            self.outcome.checks.append(
                f"{t.name}: no bf16 trial of the same steps to check its loss against; not kept"
            )
            return False
        k = min(len(ref.last_losses), len(t.last_losses))
        check = parity(ref.last_losses[-k:], t.last_losses[-k:], last=k)
        verdict = "its speed decides" if check.ok else "not kept"
        self.outcome.checks.append(f"{t.name} against {ref.name}: {check.describe()}; {verdict}")
        return check.ok

    def _remeasure(self) -> None:
        """The winner against the config as given, paired, when it is levers away from it."""
        path = self.outcome.path
        if path and self._remeasures(path[-1]):
            self._compare(self._comparison(FINAL, path[0], path[-1]), None)

    def _remeasures(self, winner: Trial) -> bool:
        """`winner` (the incumbent, or a candidate were it kept) is re-measured against the
        config as given at the end: where two levers or more lie between them. One lever's
        own comparison was against the config as given: measuring that pair again would
        spend the time of a comparison to repeat one."""
        path, base = self.outcome.path, self.outcome.baseline
        if base is None or not base.ok or not path or path[0] is not base:
            return False
        levers = next((i for i, t in enumerate(path) if t is winner), len(path))
        return levers >= 2

    def _comparison(self, stage: str, incumbent: Trial, candidate: Trial) -> Comparison:
        return Comparison(
            name=FINAL if stage == FINAL else candidate.name,
            stage=stage,
            unit=self.outcome.unit,
            incumbent=incumbent,
            candidate=candidate,
            as_given=incumbent is self.outcome.baseline,
        )

    def _compare(self, c: Comparison, winner: Trial | None) -> Comparison:
        """Run `c` within the time left once the re-measurement of `winner` (the winner were
        `c` to keep its candidate; None: `c` is that re-measurement) is held back."""

        def run(candidate: Candidate) -> Trial:
            trial = self.runner(candidate, self.deadline)
            c.blocks.append(trial)
            self.on_trial(trial)
            return trial

        self.outcome.comparisons.append(c)
        run_rounds(c, run, lambda: self._left(winner))
        self.on_comparison(c)
        return c

    def _left(self, winner: Trial | None) -> float:
        """Seconds left, less what the re-measurement of `winner` against the config as given
        needs where it has one (`_remeasures`; None: none)."""
        left = self.deadline - self.clock()
        if winner is None or not self._remeasures(winner):
            return left
        return left - needed(self._comparison(FINAL, self.outcome.path[0], winner))

    # --- what cannot win, and what does not fit in the budget -------------------------------

    def _pruned(self, stage: str, s: Setting) -> str | None:
        trials = self.outcome.trials
        if stage == "precision" and s.precision in ("fp16", "fp32"):
            bf16 = next((t for t in trials if t.ok and t.resolved.precision == "bf16"), None)
            if bf16 is not None and s.precision == "fp16":
                return f"fp16 runs at bf16's peak and adds loss scaling: it cannot beat {bf16.name}"
            if bf16 is not None and self.space.device == "cuda":
                return (
                    "fp32 runs at half bf16's tensor-core peak at best (TF32), with twice the "
                    f"activation memory: it cannot beat {bf16.name}"
                )
        if stage == "fp8" and s.compile == "off":
            return (
                "fp8 without torch.compile cannot beat bf16: torchao's float8 scales and casts "
                "each tensor in kernels of their own, which compile fuses"
            )
        if stage == "micro":
            return self._micro_pruned(s)
        if stage == "compile" and s.compile not in ("off", "default"):
            for t in trials:
                if t.setting.compile == "default" and t.status == "failed" and t.failure != "hung":
                    if _same_except(t.resolved, s, "compile"):
                        return f"torch.compile failed in default mode ({t.name}: {t.error})"
        return None

    def _micro_pruned(self, s: Setting) -> str | None:
        size = self.space.effective if s.micro == AUTO else s.micro
        for t in self.outcome.trials:
            r = t.resolved
            if not _same_except(r, s, "micro", "checkpointing"):
                continue
            same_policy = r.checkpointing == s.checkpointing
            fits = t.ok and isinstance(r.micro, int) and isinstance(size, int) and r.micro >= size
            if fits and same_policy:
                return f"micro-batch {r.micro} already fits ({t.name})"
            if fits and _lighter(r.checkpointing, s.checkpointing):
                return (
                    f"checkpointing {r.checkpointing} already fits micro-batch {r.micro} "
                    f"({t.name}): more recompute cannot win"
                )
            if t.failure == "oom" and same_policy and _no_smaller(r.micro, s.micro):
                return f"micro-batch {r.micro} ran out of memory under this policy ({t.name})"
            no_room = _no_room(t, s)
            if no_room is not None:
                return no_room
        return None

    def _estimate(self, s: Setting) -> float:
        """Seconds the trial needs at least: the shortest finished trial like it."""
        trials = self.outcome.trials
        done = [t for t in trials if t.status != "stopped"]
        like = [t for t in done if t.setting.compile == s.compile]
        like = [t for t in like if t.ok] or like
        if like:
            return min(t.wall_seconds for t in like)
        estimate = min((t.wall_seconds for t in done), default=0.0)
        if s.compile not in AUTOTUNE_MODES:
            return estimate
        default = [t.wall_seconds for t in done if t.ok and t.setting.compile == "default"]
        if default:
            estimate = MAX_AUTOTUNE_FACTOR * min(default)
        # An autotuning mode still compiling when its time ran out: another autotunes as long,
        # and then trains.
        compiling = [
            t.wall_seconds + min(default, default=0.0) for t in trials if t.failure == "compiling"
        ]
        return max([estimate, *compiling])


def changed_values(stage: str, s: Setting) -> str:
    """What `stage` varies, as `s` sets it."""
    if stage == "workers":
        return f"workers {s.num_workers}"
    if lever_of(stage) == "precision":
        return f"precision {s.precision}"
    if stage == "compile":
        return f"compile {s.compile}"
    policy = s.checkpointing if isinstance(s.checkpointing, str) else ",".join(s.checkpointing)
    return f"checkpointing {policy}, micro {s.micro}"


def _covers(trial: Trial, s: Setting) -> bool:
    """`trial` ran `s`: every value of `s` is the one the trial asked for or resolved."""
    asked, resolved = trial.setting, trial.resolved
    fields = ("precision", "checkpointing", "micro", "compile", "num_workers")
    return all(getattr(s, f) in (getattr(asked, f), getattr(resolved, f)) for f in fields)


def _same_except(a: Setting, b: Setting, *fields: str) -> bool:
    keep = ("precision", "checkpointing", "micro", "compile", "num_workers")
    return all(getattr(a, f) == getattr(b, f) for f in keep if f not in fields)


def _lighter(a: Any, b: Any) -> bool:
    """Policy `a` recomputes no more than `b` (custom policies compare with nothing)."""
    ra, rb = policy_rank(a), policy_rank(b)
    return ra is not None and rb is not None and ra <= rb


def _no_room(t: Trial, s: Setting) -> str | None:
    """Why `s`'s heavier policy cannot fit a larger micro-batch than `t` ran, by the memory `t`
    measured (`Trial.checkpointing_fits`): the micro-batch it would need, `t`'s next size for
    "auto", is above what that policy is predicted to fit. None when it may fit."""
    r, policy = t.resolved, s.checkpointing
    fits = (t.checkpointing_fits or {}).get(policy) if isinstance(policy, str) else None
    target = t.next_micro if s.micro == AUTO else s.micro
    if fits is None or not (t.ok and isinstance(r.micro, int) and isinstance(target, int)):
        return None
    if target <= r.micro or fits * ROOM_SLACK >= target:
        return None
    return (
        f"by the memory {t.name} measured, checkpointing {policy} fits about {fits} "
        f"samples, not micro-batch {target}: no larger micro-batch for its recompute"
    )


def _no_smaller(failed: int | str, candidate: int | str) -> bool:
    """A candidate micro-batch that cannot fit where `failed` did not: any, once "the largest
    that fits" found none; a size at least as large otherwise."""
    if failed == AUTO:
        return True
    return isinstance(failed, int) and isinstance(candidate, int) and candidate >= failed
