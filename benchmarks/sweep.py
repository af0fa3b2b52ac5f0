"""What pruning buys in a sweep: the same search with four pruners, side by side, on the demo's
byte-level GPT (trained on the Python standard library's source), and a plain-Optuna loop.

Every arm searches the same space (optimizer.lr, log-uniform) with the same number of trials;
the sampler is seeded by the trial's number and its first ten trials are random, so with ten
trials or fewer every arm tries the same learning rates and differs only in what it stops:

  (a) none       every trial to its end
  (b) median     Optuna's MedianPruner
  (c) hyperband  thrifty's synchronous Hyperband (brackets from eval.every to run.max_steps)
  (d) forecast   thrifty's forecast pruner (the guard's learning-curve forecast)

Each arm is `thrifty.sweep(...)`: every trial a real `thrifty train` run in its own process.
Compute is the trials' wall seconds summed (process start-up, evaluation, checkpoints
included: a paused or resumed trial pays its start-up again); steps are the optimizer steps
the trials ran, what compute comes to when a trial is long beside its start-up, as on a GPU.
Printed per arm: compute and steps with their ratios to (a)'s, the best validation loss and
its gap to (a)'s best. Then a plain-Optuna user's loop on the same task and space: a hand-written
PyTorch objective with `trial.report` / `trial.should_prune` (MedianPruner), in this process.
The goal: an arm within 1% of (a)'s best validation loss for at most a third of (a)'s compute.
The last line names the arm with the least compute among those within 1%:

    best arm: NAME compute_ratio=R loss_gap=G%

Not a test: the figures depend on the machine. Run: python benchmarks/sweep.py [--trials 9]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import thrifty
from thrifty.demo import DEMO_CONFIG

STEPS = 1620
EVERY = 60
# The demo's own config (AdamW, warm-up and cosine, its data), smaller and longer: a trial is
# ~30 s on a 2-core CPU, fp32, one process, checkpoints every 180 steps.
CONFIG: dict[str, Any] = {
    **DEMO_CONFIG,
    "run": {"name": "bench", "max_steps": STEPS, "device": "cpu", "seed": 0, "log_every": 60},
    "precision": {"mode": "fp32"},
    "batch": {"micro": 16, "effective": 16},
    "schedule": {**DEMO_CONFIG["schedule"], "warmup_steps": 10},
    "data": {"num_workers": 0},
    "eval": {"every": EVERY, "batches": 8, "micro": 32},
    "checkpoint": {"every": 180},
    "task": {
        **DEMO_CONFIG["task"],
        "model_args": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64},
        "data_args": {"block_size": 64},
    },
}
SPACE = {"optimizer.lr": {"low": 1e-4, "high": 3e-2, "log": True}}
ARMS = ("none", "median", "hyperband", "forecast")


def run_arm(pruner: str, trials: int, root: Path) -> dict[str, Any]:
    started = time.monotonic()
    record = thrifty.sweep(
        CONFIG, SPACE, root / pruner, trials=trials, pruner=pruner, say=lambda _: None
    )
    record["wall"] = time.monotonic() - started
    return record


def plain_optuna(rates: list[float]) -> tuple[float, float, int]:
    """A user's own loop: the same model, data, optimizer and schedule, hand-written, with
    Optuna's MedianPruner, trying the learning rates arm (a) tried. Returns (seconds, best
    validation loss, trials pruned)."""
    import optuna
    import torch

    from thrifty.demo import build_model, train_dataset, val_dataset

    task, opt = CONFIG["task"], CONFIG["optimizer"]
    train, val = train_dataset(**task["data_args"]), val_dataset(**task["data_args"])
    torch.set_num_threads(max(1, torch.get_num_threads()))

    def batches(data: Any, size: int, seed: int) -> Any:
        g = torch.Generator().manual_seed(seed)
        while True:
            for idx in torch.randperm(len(data), generator=g).split(size):
                if len(idx) == size:
                    items = [data[int(i)] for i in idx]
                    yield {k: torch.stack([it[k] for it in items]) for k in items[0]}

    def evaluate(model: torch.nn.Module) -> float:
        model.eval()
        it = batches(val, CONFIG["eval"]["micro"], seed=0)
        with torch.no_grad():
            loss = sum(float(model(**next(it))) for _ in range(CONFIG["eval"]["batches"]))
        model.train()
        return loss / CONFIG["eval"]["batches"]

    def objective(trial: optuna.Trial) -> float:
        space = SPACE["optimizer.lr"]
        lr = trial.suggest_float("lr", space["low"], space["high"], log=True)
        torch.manual_seed(0)
        model = build_model(**task["model_args"])
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=lr, weight_decay=opt["weight_decay"], betas=tuple(opt["betas"])
        )
        warmup = CONFIG["schedule"]["warmup_steps"]

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = (step - warmup) / max(1, STEPS - warmup)
            return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        data = batches(train, CONFIG["batch"]["micro"], seed=trial.number)
        value = math.inf
        for step in range(1, STEPS + 1):
            loss = model(**next(data))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), opt["grad_clip"])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            if step % EVERY == 0:
                value = evaluate(model)
                trial.report(value, step)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        return value

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        pruner=optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=EVERY)
    )
    for lr in rates:
        study.enqueue_trial({"lr": lr})
    started = time.monotonic()
    study.optimize(objective, n_trials=len(rates))
    pruned = sum(1 for t in study.trials if t.state == optuna.trial.TrialState.PRUNED)
    return time.monotonic() - started, study.best_value, pruned


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=9, help="trials per arm (default 9)")
    parser.add_argument("--out", help="where the sweeps go (default: a temporary folder)")
    args = parser.parse_args(argv)
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="thrifty-sweep-bench-"))
    print(
        f"demo GPT (2 layers, 64 wide), {STEPS} steps a trial, evaluated every {EVERY}; "
        f"{args.trials} trials an arm; optimizer.lr log-uniform in [1e-4, 3e-2]"
    )
    records = {arm: run_arm(arm, args.trials, root) for arm in ARMS}
    base = records["none"]
    base_seconds, base_loss = base["compute"]["seconds"], base["best"]["value"]
    base_steps = sum(t["steps"] or 0 for t in base["trials"])
    print(
        f"\n{'arm':<12}{'compute s':>11}{'ratio':>8}{'steps':>8}{'ratio':>8}{'best loss':>11}"
        f"{'gap':>9}{'pruned':>8}"
    )
    rows = []
    for arm, rec in records.items():
        seconds, loss = rec["compute"]["seconds"], rec["best"]["value"]
        ratio, gap = seconds / base_seconds, (loss / base_loss - 1) * 100
        pruned = rec["counts"]["pruned"]
        steps = sum(t["steps"] or 0 for t in rec["trials"])
        rows.append((arm, ratio, gap))
        print(
            f"{arm:<12}{seconds:>11.1f}{ratio:>8.2f}{steps:>8}{steps / base_steps:>8.2f}"
            f"{loss:>11.4f}{gap:>8.2f}%{pruned:>8}"
        )
    rates = [t["params"]["optimizer.lr"] for t in base["trials"]]
    seconds, loss, pruned = plain_optuna(rates)
    print(
        f"{'optuna loop':<12}{seconds:>11.1f}{seconds / base_seconds:>8.2f}{'-':>8}{'-':>8}"
        f"{loss:>11.4f}{(loss / base_loss - 1) * 100:>8.2f}%{pruned:>8}"
    )
    print(
        "(optuna loop: a hand-written objective in this process, MedianPruner, arm (a)'s "
        "learning rates; its own data order, no checkpoints, no resume, no dollars)"
    )
    within = [r for r in rows if r[0] != "none" and r[2] <= 1.0]
    goal = [r for r in within if r[1] <= 1 / 3]
    print(
        f"\ngoal (within 1% of (a)'s best for at most 1/3 of its compute): "
        f"{', '.join(r[0] for r in goal) or 'not met by any arm'}"
    )
    name, ratio, gap = min(within or rows[1:], key=lambda r: (r[1], r[2]))
    print(f"best arm: {name} compute_ratio={ratio:.2f} loss_gap={gap:.2f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
