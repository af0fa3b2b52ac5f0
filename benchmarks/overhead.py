"""Per-step overhead of thrifty.Trainer against a hand-written PyTorch loop with the same levers.

Two models: the demo GPT (steps of ~200 ms on this CPU), and a 2-layer MLP whose steps take a
few milliseconds, where every microsecond the loop and its measurement add shows. Each pair
runs alternately, round by round and each first in turn, in one process, so machine noise hits both alike; both have
the same precision, accumulation, AdamW, clipping, warmup-cosine schedule and DataLoader, and
the Trainer keeps all its measurement on (breakdown, system sampling, cost meter, guard).
For the MLP both loops train the same model with the same optimizer object, in turn.

A step is timed from the end of one to the end of the next, the whole loop included: for the
Trainer, by the per-step hook its loop calls (the profiler's), so logging, the guard's flushes
and the step boundary all count. Prints the median step of each and their ratio (target
≤ 1.03 for both models). With --loggers the Trainer also logs to TensorBoard and to MLflow (a
local file: store), as `[log] tensorboard = true` and `mlflow = "file:..."` do.

    python benchmarks/overhead.py [--rounds 6] [--steps 25] [--mlp-rounds 100] [--mlp-steps 60]
                                  [--loggers]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from demo_runs import EFFECTIVE, MICRO, run_config

import thrifty.trainer
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.demo import DEMO_CONFIG, build_model, train_dataset
from thrifty.levers.precision import resolve_precision
from thrifty.levers.schedule import build_scheduler

ACCUM = EFFECTIVE // MICRO
MLP_MICRO, MLP_ACCUM = 64, 2
MLP_WIDTH = 256, 256  # in/out features and the hidden layer: about 4-5 ms a step here
WARMUP = 3  # steps left out of each run: allocator and caches warming up


def plain_loop(
    model: torch.nn.Module,
    data: Any,
    steps: int,
    *,
    micro: int,
    accum: int,
    forward: Callable[[torch.nn.Module, Any], torch.Tensor],
    precision: Any,
    seed: int,
    lr: float,
    betas: tuple[float, float],
    optimizer: torch.optim.Optimizer | None = None,
) -> list[float]:
    """The loop a careful engineer writes by hand, with the same levers. `optimizer`: train
    with this one (the Trainer's, on the same model) instead of a new AdamW."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = optimizer or torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
        betas=betas,
    )
    sched = build_scheduler(
        opt, warmup_steps=5, decay="cosine", total_steps=steps, min_lr_ratio=0.1
    )
    loader = torch.utils.data.DataLoader(
        data,
        batch_size=micro,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(seed),
    )
    batches = iter(loader)
    times = []
    last = time.perf_counter()
    for _ in range(steps):
        for _ in range(accum):
            batch = next(batches)
            with torch.autocast("cpu", dtype=precision.dtype, enabled=precision.dtype is not None):
                loss = forward(model, batch)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        now = time.perf_counter()
        times.append(now - last)
        last = now
    return times[WARMUP:]


def trainer_loop(
    model: torch.nn.Module | Trainer, data: Any, config: dict[str, Any], **kw: Any
) -> list[float]:
    """Train with thrifty.Trainer (or fit the one given); the time between the ends of
    consecutive steps."""
    stamps: list[float] = []

    @contextlib.contextmanager
    def each_step(*_: Any) -> Iterator[Callable[[], None]]:
        yield lambda: stamps.append(time.perf_counter())  # called after every step

    real = thrifty.trainer.maybe_trace
    thrifty.trainer.maybe_trace = each_step  # type: ignore[assignment]  # the loop's own hook
    try:
        trainer = model if isinstance(model, Trainer) else None
        trainer = trainer or Trainer(model, data, TrainConfig.from_dict(config), **kw)
        trainer.fit()
    finally:
        thrifty.trainer.maybe_trace = real
    return [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)][WARMUP - 1 :]


def config_for(
    out: str, steps: int, seed: int, micro: int, effective: int, **sections: Any
) -> dict[str, Any]:
    schedule = {"warmup_steps": 5, "decay": "cosine", "min_lr_ratio": 0.1}
    return run_config(out, steps, seed, micro, effective, schedule=schedule, **sections)


def alternate(
    r: int,
    ours_run: Callable[[], list[float]],
    plain_run: Callable[[], list[float]],
    ours: list[float],
    plain: list[float],
) -> None:
    """One run of each: the Trainer first in even rounds and second in odd ones, so neither
    always runs on a machine the other has just warmed (or left busy)."""
    if r % 2 == 0:
        ours += ours_run()
        plain += plain_run()
    else:
        plain += plain_run()
        ours += ours_run()


# --- the demo GPT ---------------------------------------------------------------------------------


def logger_sections(tmp: str, on: bool) -> dict[str, Any]:
    """The [log] section of the --loggers variant: both loggers on, MLflow in a file: store."""
    if not on:
        return {}
    return {"log": {"tensorboard": True, "mlflow": Path(tmp, "mlruns").as_uri()}}


def demo_pair(
    tmp: str, rounds: int, steps: int, loggers: bool = False
) -> tuple[list[float], list[float], str]:
    data = train_dataset()
    precision = resolve_precision("auto", torch.device("cpu"))
    args = DEMO_CONFIG["task"]["model_args"]
    sections = {k: DEMO_CONFIG[k] for k in ("precision", "optimizer") if k in DEMO_CONFIG}
    sections.update(logger_sections(tmp, loggers))
    opt = DEMO_CONFIG.get("optimizer", {})
    ours: list[float] = []
    plain: list[float] = []
    for r in range(rounds):
        config = config_for(f"{tmp}/demo{r}", steps, r, MICRO, EFFECTIVE, **sections)

        def ours_run(r: int = r, config: dict[str, Any] = config) -> list[float]:
            torch.manual_seed(r)
            return trainer_loop(build_model(**args), data, config)

        def plain_run(r: int = r) -> list[float]:
            torch.manual_seed(r)
            return plain_loop(
                build_model(**args),
                data,
                steps,
                micro=MICRO,
                accum=ACCUM,
                forward=lambda m, b: m(**b),
                precision=precision,
                seed=r,
                lr=opt.get("lr", 2e-3),
                betas=tuple(opt.get("betas", (0.9, 0.95))),  # type: ignore[arg-type]
            )

        alternate(r, ours_run, plain_run, ours, plain)
    return ours, plain, f"demo GPT, {precision.name}, micro {MICRO} × {ACCUM}"


# --- a tiny MLP: the loop's own cost shows ------------------------------------------------------


def mlp() -> torch.nn.Module:
    io, hidden = MLP_WIDTH
    return torch.nn.Sequential(
        torch.nn.Linear(io, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, io)
    )


def mse(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, batch[-1])


def mlp_pair(
    tmp: str, rounds: int, steps: int, loggers: bool = False
) -> tuple[list[float], list[float], str]:
    io, _ = MLP_WIDTH
    n = MLP_MICRO * MLP_ACCUM * (steps + 1)
    generator = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(
        torch.randn(n, io, generator=generator), torch.randn(n, io, generator=generator)
    )
    precision = resolve_precision("fp32", torch.device("cpu"))
    sections = {
        "precision": {"mode": "fp32"},
        "optimizer": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1},
        "measure": {"peak_tflops": 1.0},  # not measured: the benchmark times the loop only
        "cost": {"usd_per_gpu_hour": 2.0},  # the dollar meter on
        **logger_sections(tmp, loggers),
    }
    ours: list[float] = []
    plain: list[float] = []
    effective = MLP_MICRO * MLP_ACCUM
    for r in range(rounds):
        config = config_for(f"{tmp}/mlp{r}", steps, r, MLP_MICRO, effective, **sections)

        # Both loops train the same model with the same optimizer object: on this CPU a new
        # model's memory layout alone moves a run's step time by 10-20 %.
        torch.manual_seed(r)
        trainer = Trainer(mlp(), data, TrainConfig.from_dict(config), loss_fn=mse)

        def ours_run(trainer: Trainer = trainer) -> list[float]:
            return trainer_loop(trainer, data, {})

        def plain_run(r: int = r, trainer: Trainer = trainer) -> list[float]:
            return plain_loop(
                trainer.model,
                data,
                steps,
                micro=MLP_MICRO,
                accum=MLP_ACCUM,
                forward=lambda m, b: mse(m(b[0]), b),
                precision=precision,
                seed=r,
                lr=1e-3,
                betas=(0.9, 0.95),
                optimizer=trainer.optimizer,
            )

        alternate(r, ours_run, plain_run, ours, plain)
    return (
        ours,
        plain,
        f"2-layer MLP {MLP_WIDTH[0]}-{MLP_WIDTH[1]}-{MLP_WIDTH[0]}, fp32, micro {MLP_MICRO} × {MLP_ACCUM}",
    )


def report(name: str, ours: list[float], plain: list[float], rounds: int, steps: int) -> float:
    """Print the medians of all steps and their ratio, and how far the runs' own ratios
    spread: on a shared machine a whole run can be 20% faster or slower than the next."""
    t, p = statistics.median(ours), statistics.median(plain)
    per = len(ours) // rounds
    runs = sorted(
        statistics.median(ours[i : i + per]) / statistics.median(plain[i : i + per])
        for i in range(0, per * rounds, per)
    )
    print(f"{name}, {rounds} rounds × {steps} steps, {torch.get_num_threads()} threads")
    print(f"  median step: thrifty.Trainer {t * 1e3:.3f} ms, plain loop {p * 1e3:.3f} ms")
    print(f"  overhead ratio (Trainer / plain): {t / p:.3f}  (target ≤ 1.03)")
    print(
        f"  per-round ratios: median {statistics.median(runs):.3f}, "
        f"middle half {runs[len(runs) // 4]:.3f}-{runs[(3 * len(runs)) // 4]:.3f}"
    )
    return t / p


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--mlp-rounds", type=int, default=100)
    parser.add_argument("--mlp-steps", type=int, default=60)
    parser.add_argument("--only", choices=("demo", "mlp"), default=None)
    parser.add_argument(
        "--loggers", action="store_true", help="the Trainer logs to TensorBoard and MLflow too"
    )
    args = parser.parse_args()
    with_loggers = " + TensorBoard + MLflow" if args.loggers else ""
    if not logging.getLogger().handlers:  # quiet runs: fit() prints its summary otherwise
        logging.basicConfig(level=logging.WARNING, format="thrifty: %(message)s")
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "mlp"):
            ours, plain, name = mlp_pair(tmp, args.mlp_rounds, args.mlp_steps, args.loggers)
            report(name + with_loggers, ours, plain, args.mlp_rounds, args.mlp_steps)
        if args.only in (None, "demo"):
            ours, plain, name = demo_pair(tmp, args.rounds, args.steps, args.loggers)
            report(name + with_loggers, ours, plain, args.rounds, args.steps)


if __name__ == "__main__":
    main()
