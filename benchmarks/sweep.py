"""What pruning buys in a sweep, and what thrifty's sweep costs beside a plain Optuna loop: the
same search with each pruner, on the demo's byte-level GPT (trained on the Python standard
library's source), run twice side by side.

Every arm searches the same space (optimizer.lr, log-uniform) with the same number of trials;
the sampler is seeded by the trial's number and its first ten trials are random, so with ten
trials or fewer every arm tries the same learning rates and differs only in what it stops.
A trial is 600 steps with a 30-step warm-up, evaluated every 10, so that the rungs of
`hyperband`, `asha` and `median` meet the warm-up's end (docs/sweep.md, "How rungs are
placed": the first rung at step 40, `asha`'s at 40, 120 and 360; `median` judges from step 40
on). Shorter trials cannot show the quarter: at 90 steps (the rungs at 40, the end at 90) a
pruned trial still runs 44% of a trial, and at 300 `asha` keeps a third of the trials past 40
and a ninth past 120, (40 + 80/3 + 180/9) / 300 = 0.29 of the steps however many trials run;
and a trial of this model at 90 steps is over in under 2 s, beside which a worker's one start
(about 2 s) is most of what separates thrifty from a loop in this process.

  thrifty   `thrifty.sweep(...)` with the pruner: none, median, asha, hyperband, forecast; every
            trial a `thrifty train` run of the config with its learning rate.
  optuna    a plain Optuna loop in this process: `study.optimize` over the learning rates the
            thrifty arm tried, enqueued in its trials' order, each trial a `thrifty.Trainer` of
            the same config and seed whose callback calls `trial.report(val_loss, step)` and
            `trial.should_prune()` after each evaluation, with Optuna's pruner of the same name:
            none: NopPruner; median: MedianPruner(n_startup_trials=5, n_warmup_steps=40);
            asha: SuccessiveHalvingPruner(min_resource=40, reduction_factor=3,
            min_early_stopping_rate=0); hyperband: HyperbandPruner(min_resource=10,
            max_resource=60 (the steps less 30), reduction_factor=3), its resource counted
            from the end of the warm-up as thrifty's is (the loop reports step - 30, from step
            40 on). The forecast
            pruner is thrifty's own: it has no Optuna arm.

Where the decisions can differ: none, median and asha see the same losses in the same order
and decide alike (the trials' losses agree where both ran them: the same run, seed and data).
Hyperband does not: thrifty's is synchronous (a trial that reaches a rung first is paused until
its bracket has, then the best third of the bracket goes on, in brackets filled in trial-number
order), Optuna's is asynchronous (each trial judged as it reaches a rung against those that
reached it before, its bracket drawn from a hash of the trial's number, and judged again at
every rung up to the last step).

Compute is the trials' wall seconds summed: for thrifty each trial's sessions, their start-up
included (the trial's process or worker starting, imports, the model and data built; a paused
or resumed trial pays its start-up again), the `start-up` column; for Optuna each trial from
its config to its Trainer's close, in a process that imported torch and thrifty before its
first trial. Steps are the optimizer steps the trials ran, what compute comes to when a trial
is long beside its start-up, as on a GPU; unlike seconds, they do not move with the machine's
load. Printed per pruner: both compute figures and their ratio (goal: thrifty's at most 1.1x
Optuna's), thrifty's compute beside its unpruned arm's, steps, both best validation losses,
thrifty's gap to its unpruned arm's best, and both pruned counts; then, for each pruner with
both loops, on how many trials they decided alike and how far their losses are apart. The goal
of pruning: an arm within 1% of the unpruned search's best validation loss for at most a
quarter of its compute. The last line names the thrifty arm with the least compute among those
within 1%:

    best arm: NAME compute_ratio=R loss_gap=G%

Not a test: the figures depend on the machine. Run:
python benchmarks/sweep.py [--trials 9] [--steps 600] [--arms none,median,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import logging
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import thrifty
from thrifty.demo import DEMO_CONFIG

STEPS = 600
WARMUP = 30
EVERY = 10
# The demo's own config (AdamW, warm-up and cosine, its data), smaller: fp32, one process.
CONFIG: dict[str, Any] = {
    **DEMO_CONFIG,
    "run": {"name": "bench", "max_steps": STEPS, "device": "cpu", "seed": 0, "log_every": EVERY},
    "precision": {"mode": "fp32"},
    "batch": {"micro": 16, "effective": 16},
    "schedule": {**DEMO_CONFIG["schedule"], "warmup_steps": WARMUP},
    "data": {"num_workers": 0},
    "eval": {"every": EVERY, "batches": 8, "micro": 32},
    "task": {
        **DEMO_CONFIG["task"],
        "model_args": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},
        "data_args": {"block_size": 64},
    },
}
SPACE = {"optimizer.lr": {"low": 1e-4, "high": 3e-2, "log": True}}
ARMS = ("none", "median", "asha", "hyperband", "forecast")
OPTUNA_ARMS = ("none", "median", "asha", "hyperband")  # those with an Optuna pruner
GOAL_RATIO = 1.1  # thrifty's compute at most this times Optuna's
GOAL_SHARE = 0.25  # within 1% of the unpruned best for at most this share of its compute
DIFFERS = (
    "hyperband's decisions can differ: thrifty's is synchronous (a bracket compared once all "
    "its trials reach the rung), Optuna's asynchronous (each trial against those before it)"
)


def config_for(steps: int) -> dict[str, Any]:
    """CONFIG with `steps` a trial."""
    return {**CONFIG, "run": {**CONFIG["run"], "max_steps": steps}}


def run_thrifty(config: dict[str, Any], pruner: str, trials: int, root: Path) -> dict[str, Any]:
    """The thrifty arm: `thrifty.sweep` with `pruner`; its record (sweep.json)."""
    return thrifty.sweep(
        config, SPACE, root / pruner, trials=trials, pruner=pruner, say=lambda _: None
    )


def optuna_pruner(name: str, steps: int) -> Any:
    """Optuna's pruner called `name`, set as thrifty sets its own for the same trials."""
    import optuna

    from thrifty.search.sweep import hyperband, pruning

    first = hyperband.first_judged(EVERY, WARMUP)  # the first evaluation after the warm-up
    if name == "none":
        return optuna.pruners.NopPruner()
    if name == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=pruning.MEDIAN_STARTUP_TRIALS, n_warmup_steps=first
        )
    if name == "asha":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=first, reduction_factor=pruning.REDUCTION, min_early_stopping_rate=0
        )
    if name == "hyperband":  # r and R as thrifty's brackets count them, from the warm-up's end
        return optuna.pruners.HyperbandPruner(
            min_resource=EVERY,
            max_resource=steps - resource_start(),
            reduction_factor=pruning.REDUCTION,
        )
    raise ValueError(f"no Optuna pruner for {name!r}: use one of {', '.join(OPTUNA_ARMS)}")


def resource_start() -> int:
    """w: the last evaluation at or before the warm-up's last step, where Hyperband's
    resource starts (thrifty.search.sweep.hyperband)."""
    return WARMUP // EVERY * EVERY


def run_optuna(
    config: dict[str, Any], pruner: str, rates: list[float], root: Path
) -> dict[str, Any]:
    """The Optuna arm: one `study.optimize` in this process over `rates`, in order, each
    trial a `thrifty.Trainer` of `config` with its learning rate and a callback that reports
    each evaluation and asks the pruner. Returns the figures `thrifty_row` returns: `seconds`
    (the trials' summed), `startup` (None), `steps`, `best` (the best complete trial's value),
    `pruned`, `states` (each trial's: complete, pruned or failed) and `values` (each trial's
    last loss)."""
    import optuna

    from thrifty.callbacks import Callback
    from thrifty.checkpointing.saving.rng import seed_everything
    from thrifty.records.stop import StopReason
    from thrifty.run.task import build_task

    offset = resource_start() if pruner == "hyperband" else 0
    seconds: list[float] = []
    steps: list[int] = []
    values: list[float | None] = []

    class Report(Callback):
        """The trial's evaluations to Optuna; PRUNED when its pruner says so."""

        def __init__(self, trial: optuna.Trial) -> None:
            self.trial = trial

        def on_evaluation_end(self, step: int, val_loss: float | None) -> Any:
            if step - offset <= 0 or val_loss is None or not math.isfinite(val_loss):
                return None
            self.trial.report(val_loss, step - offset)
            return StopReason.PRUNED if self.trial.should_prune() else None

    def objective(trial: optuna.Trial) -> float:
        space = SPACE["optimizer.lr"]
        lr = trial.suggest_float("optimizer.lr", space["low"], space["high"], log=True)
        started = time.monotonic()
        out = root / f"optuna-{pruner}" / f"{trial.number:04d}"
        run = thrifty.load_config(None, [("optimizer.lr", lr), ("run.out", str(out))], base=config)
        seed_everything(run.run.seed)  # as `thrifty train` does, before the model is built
        with build_task(run).trainer(run, callbacks=[Report(trial)]) as trainer:
            result = trainer.fit()
        seconds.append(time.monotonic() - started)
        steps.append(result.steps)
        value = result.val_loss if result.val_loss is not None else result.train_loss
        values.append(value)
        if result.stop_reason == StopReason.PRUNED:
            raise optuna.TrialPruned()
        if result.stop_reason == StopReason.DIVERGED or value is None:
            return math.nan  # failed, as thrifty's sweep fails such a trial
        return float(value)

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        study_name=f"bench-{pruner}", pruner=optuna_pruner(pruner, config["run"]["max_steps"])
    )
    for lr in rates:
        study.enqueue_trial({"optimizer.lr": lr})
    study.optimize(objective, n_trials=len(rates))
    names = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}
    states = [names.get(t.state.name, t.state.name.lower()) for t in study.trials]
    complete = [t.value for t in study.trials if t.value is not None]
    return {
        "seconds": sum(seconds),
        "startup": None,
        "steps": sum(steps),
        "best": min(complete) if complete else math.nan,
        "pruned": states.count("pruned"),
        "states": states,
        "values": values,
    }


def thrifty_row(record: dict[str, Any]) -> dict[str, Any]:
    """The figures of a thrifty arm's record, as `run_optuna` returns them, with `startup`:
    the seconds its trials' sessions spent starting (included in `seconds`)."""
    trials = sorted(record["trials"], key=lambda t: t["number"])
    best = record.get("best") or {}
    return {
        "seconds": record["compute"]["seconds"],
        "startup": record["compute"].get("startup_seconds"),
        "steps": sum(t["steps"] or 0 for t in trials),
        "best": best.get("value", math.nan),
        "pruned": record["counts"]["pruned"],
        "states": [t["state"] for t in trials],
        "values": [t.get("value") for t in trials],
    }


def agreement(arm: str, ours: dict[str, Any], theirs: dict[str, Any]) -> str:
    """One line: on how many trials the two loops decided alike, and how far apart their
    losses are on those (the same run and the same last step: 0 on one machine)."""
    same = sum(a == b for a, b in zip(ours["states"], theirs["states"], strict=False))
    line = f"{arm}: the same decision on {same} of {len(ours['states'])} trials"
    if same < len(ours["states"]):
        line += f" (thrifty: {' '.join(ours['states'])}; optuna: {' '.join(theirs['states'])})"
    both = zip(ours["values"], theirs["values"], ours["states"], theirs["states"], strict=False)
    pairs = [(a, b) for a, b, x, y in both if a is not None and b is not None and x == y]
    if pairs:
        worst = max(abs(a - b) for a, b in pairs)
        line += f"; their losses there differ by at most {worst:.2g}"
    return line


def cell(value: Any, spec: str, width: int) -> str:
    """`value` formatted with `spec` in `width` characters, or "-" where there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return f"{'-':>{width}}"
    return f"{value:>{width}{spec}}"


def report(ours: dict[str, dict], theirs: dict[str, dict]) -> None:
    """The table, the decisions, the goal lines and the best arm's line."""
    base = ours.get("none")
    print(
        f"\n{'pruner':<11}{'thrifty s':>10}{'start-up':>10}{'optuna s':>10}{'thr/opt':>9}"
        f"{'vs none':>9}{'thr steps':>11}{'opt steps':>11}{'thr loss':>10}{'opt loss':>10}"
        f"{'gap':>9}{'pruned':>9}"
    )
    ratios: dict[str, float] = {}
    rows = []  # (arm, compute beside the unpruned arm's, loss gap %)
    for arm, row in ours.items():
        other = theirs.get(arm)
        ratio = row["seconds"] / other["seconds"] if other else None
        if ratio is not None:
            ratios[arm] = ratio
        share = row["seconds"] / base["seconds"] if base else None
        gap = (row["best"] / base["best"] - 1) * 100 if base else None
        if share is not None and gap is not None:
            rows.append((arm, share, gap))
        pruned = f"{row['pruned']}/{other['pruned'] if other else '-'}"
        print(
            f"{arm:<11}{row['seconds']:>10.1f}{cell(row['startup'], '.1f', 10)}"
            f"{cell(other and other['seconds'], '.1f', 10)}{cell(ratio, '.2f', 9)}"
            f"{cell(share, '.2f', 9)}{row['steps']:>11}{cell(other and other['steps'], 'd', 11)}"
            f"{cell(row['best'], '.4f', 10)}{cell(other and other['best'], '.4f', 10)}"
            f"{cell(gap, '.2f', 8)}{'%' if gap is not None else ' '}{pruned:>9}"
        )
    print(
        "(seconds: the trials' wall time summed; start-up: thrifty's share of it spent starting "
        "trials; thr/opt: thrifty's compute over Optuna's for the same pruner; vs none: over "
        "thrifty's unpruned arm; gap: to that arm's best loss; pruned: thrifty/optuna)"
    )
    for arm in ours:
        if arm in theirs:
            print(agreement(arm, ours[arm], theirs[arm]))
    if "hyperband" in theirs:
        print(f"note: {DIFFERS}")
    if ratios:
        met = [a for a, r in ratios.items() if r <= GOAL_RATIO]
        missed = [f"{a} ({r:.2f}x)" for a, r in ratios.items() if r > GOAL_RATIO]
        print(
            f"\ngoal (thrifty's compute at most {GOAL_RATIO}x Optuna's, in-process): met by "
            f"{', '.join(met) or 'no pruner'}; missed by {', '.join(missed) or 'no pruner'}"
        )
    if base is None:
        print("(no unpruned arm among --arms: the goal of pruning is not judged)")
        return
    within = [r for r in rows if r[0] != "none" and r[2] <= 1.0]
    goal = [r for r in within if r[1] <= GOAL_SHARE]
    print(
        "goal (within 1% of the unpruned search's best for at most a quarter of its compute): "
        f"{', '.join(r[0] for r in goal) or 'not met by any arm'}"
    )
    pruned_rows = [r for r in rows if r[0] != "none"]
    if pruned_rows:
        name, share, gap = min(within or pruned_rows, key=lambda r: (r[1], r[2]))
        print(f"best arm: {name} compute_ratio={share:.2f} loss_gap={gap:.2f}%")


def parse_arms(text: str) -> list[str]:
    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise argparse.ArgumentTypeError(
            f"{text!r}: name pruners among {', '.join(ARMS)}, separated by commas"
        )
    return [a for a in ARMS if a in arms]  # in the table's order


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=9, help="trials per arm (default 9)")
    parser.add_argument(
        "--steps", type=int, default=STEPS, help=f"steps a trial (default {STEPS}; 60 or more)"
    )
    parser.add_argument(
        "--arms",
        type=parse_arms,
        default=list(ARMS),
        help=f"the pruners to compare, comma-separated (default: {','.join(ARMS)})",
    )
    parser.add_argument("--out", help="where the sweeps go (default: a temporary folder)")
    args = parser.parse_args(argv)
    least = resource_start() + 3 * EVERY  # Hyperband's brackets need 3 evaluations past w
    if args.steps < least:
        parser.error(f"--steps {args.steps}: give {least} or more (a rung after the warm-up)")
    if args.trials < 1:
        parser.error(f"--trials {args.trials}: give 1 or more")
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="thrifty-sweep-bench-"))
    # The in-process Trainers print their warnings only, as the trials' logs hold theirs.
    logging.basicConfig(level=logging.WARNING, format="thrifty: %(message)s")
    config = config_for(args.steps)
    print(
        f"demo GPT (2 layers, 64 wide), {args.steps} steps a trial, warm-up {WARMUP}, evaluated "
        f"every {EVERY}; {args.trials} trials an arm; optimizer.lr log-uniform in [1e-4, 3e-2]"
    )
    print(
        "thrifty: thrifty.sweep(...); optuna: study.optimize over thrifty.Trainer, in this process"
    )
    ours: dict[str, dict] = {}
    theirs: dict[str, dict] = {}
    for arm in args.arms:
        record = run_thrifty(config, arm, args.trials, root)
        ours[arm] = thrifty_row(record)
        if arm in OPTUNA_ARMS:
            trials = sorted(record["trials"], key=lambda t: t["number"])
            rates = [t["params"]["optimizer.lr"] for t in trials]
            theirs[arm] = run_optuna(config, arm, rates, root)
    report(ours, theirs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
