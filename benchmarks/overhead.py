"""Per-step overhead of thrifty.Trainer against a hand-written PyTorch loop with the same levers.

Cases (`--only` picks one; by default `mlp` and `gpt2`):

- `mlp`: a 2-layer MLP whose steps take about 2 ms, over an ordinary map-style `Dataset` (a
  class with `__getitem__`, which may draw random numbers as far as the Trainer knows): every
  microsecond the loop, its data path and its measurement add shows. Timed by the wall clock.
- `mlp-tensor`: the same over a `TensorDataset`, known to draw no random numbers.
- `gpt2`: a Hugging Face GPT-2 (4 layers, 256 wide, 128 tokens) over an ordinary `Dataset` of
  token blocks, timed by the process's CPU time (all threads): what the Trainer costs a real
  model, less at the mercy of other tenants than the wall clock.
- `demo`: the demo GPT (steps of ~200 ms on this CPU).

Each pair runs alternately, round by round and each first in turn, in one process, so machine
noise hits both alike. Both loops train the same model with the same optimizer object (on this
CPU a new model's memory layout alone moves a run's step time by 10-20 %), the same precision,
accumulation, AdamW, clipping, warmup-cosine schedule and DataLoader; the Trainer keeps all its
measurement on (breakdown, system sampling, cost meter, guard) and flushes its metrics every 10
steps.

A step is timed from the end of one to the end of the next, the whole loop included: for the
Trainer, by the per-step hook its loop calls (the profiler's), so logging, the guard's flushes
and the step boundary all count. The ratio printed is the block ratio: the median time of 10
consecutive steps (each block holds one metrics flush) of the Trainer over the plain loop's,
with the spread of the rounds' own block ratios. Targets: ≤ 1.03 for the 2 ms MLP, ≤ 1.01 for
GPT-2.

    python benchmarks/overhead.py [--only mlp|mlp-tensor|gpt2|demo] [--rounds N] [--steps N]
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from demo_runs import EFFECTIVE, MICRO, run_config

import thrifty.run.trainer
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.demo import DEMO_CONFIG, build_model, train_dataset
from thrifty.levers.precision import resolve_precision
from thrifty.levers.schedule import build_scheduler

WARMUP = 3  # steps left out of each run: allocator and caches warming up
LOG_EVERY = 10  # the Trainer's metrics flush; timed runs hold whole flush periods

Clock = Callable[[], float]


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
    clock: Clock = time.perf_counter,
) -> list[float]:
    """The loop a careful engineer writes by hand, with the same levers. `optimizer`: train
    with this one (the Trainer's, on the same model) instead of a new AdamW. Eight parameters
    past the data: the levers both loops share, spelled out as the hand-written loop has them."""
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
    last = clock()
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
        now = clock()
        times.append(now - last)
        last = now
    return times[WARMUP:]


def trainer_loop(trainer: Trainer, clock: Clock = time.perf_counter) -> list[float]:
    """Fit `trainer`; the time between the ends of consecutive steps, by `clock`."""
    stamps: list[float] = []

    @contextlib.contextmanager
    def each_step(*_: Any) -> Iterator[Callable[[], None]]:
        yield lambda: stamps.append(clock())  # called after every step

    real = thrifty.run.trainer.maybe_trace
    thrifty.run.trainer.maybe_trace = each_step  # type: ignore[assignment]  # the loop's own hook
    try:
        trainer.fit()
    finally:
        thrifty.run.trainer.maybe_trace = real
    return [b - a for a, b in zip(stamps[:-1], stamps[1:], strict=True)][WARMUP - 1 :]


def alternate(
    r: int,
    ours_run: Callable[[], list[float]],
    plain_run: Callable[[], list[float]],
    ours: list[list[float]],
    plain: list[list[float]],
) -> None:
    """One run of each: the Trainer first in even rounds and second in odd ones, so neither
    always runs on a machine the other has just warmed (or left busy)."""
    if r % 2 == 0:
        ours.append(ours_run())
        plain.append(plain_run())
    else:
        plain.append(plain_run())
        ours.append(ours_run())


def logger_sections(tmp: str, on: bool) -> dict[str, Any]:
    """The [log] section of the --loggers variant: both loggers on, MLflow in a file: store."""
    if not on:
        return {}
    return {"log": {"tensorboard": True, "mlflow": Path(tmp, "mlruns").as_uri()}}


# --- the cases ------------------------------------------------------------------------------------


class Rows(torch.utils.data.Dataset):
    """An ordinary map-style dataset: rows of tensors fetched one sample at a time. It draws no
    random numbers, but nothing in its type says so."""

    def __init__(self, *columns: Any) -> None:
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns[0])

    def __getitem__(self, i: int) -> Any:
        return tuple(c[i] for c in self.columns)


class Blocks(torch.utils.data.Dataset):
    """Token blocks for a causal language model, as a Hugging Face model takes them."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


@dataclass
class Case:
    """One comparison: a model (built per round), its data, its step and how it is timed."""

    name: str
    data: Any
    model: Callable[[], torch.nn.Module]
    forward: Callable[[torch.nn.Module, Any], torch.Tensor]
    micro: int
    accum: int
    clock: Clock = time.perf_counter
    loss_fn: Any = None
    precision: str = "fp32"
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.95)
    config: dict[str, Any] = field(default_factory=dict)  # sections besides the run's


def _mse(output: torch.Tensor, batch: Any) -> torch.Tensor:
    return torch.nn.functional.mse_loss(output, batch[-1])


def mlp_case(steps: int, tensor: bool) -> Case:
    """A 2-layer MLP 256-256-256, fp32, micro 64 × 2: about 2-3 ms a step on 2 CPU cores."""
    io, hidden, micro, accum = 256, 256, 64, 2
    n = micro * accum * (steps + 1)
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.randn(n, io, generator=generator) for _ in range(2))
    data = torch.utils.data.TensorDataset(x, y) if tensor else Rows(x, y)

    def model() -> torch.nn.Module:
        return torch.nn.Sequential(
            torch.nn.Linear(io, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, io)
        )

    kind = "a TensorDataset" if tensor else "an ordinary Dataset"
    return Case(
        f"2-layer MLP {io}-{hidden}-{io} over {kind}, fp32, micro {micro} × {accum}, wall time",
        data,
        model,
        lambda m, b: _mse(m(b[0]), b),
        micro,
        accum,
        loss_fn=_mse,
    )


def gpt2_case(steps: int) -> Case:
    """A Hugging Face GPT-2, 4 layers × 256 wide, 128 tokens, micro 4 × 2, fp32, CPU time."""
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel

    transformers.logging.set_verbosity_error()
    micro, accum, block, vocab = 4, 2, 128, 8192
    config = GPT2Config(
        n_layer=4,
        n_embd=256,
        n_head=4,
        n_positions=block,
        vocab_size=vocab,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )
    n = micro * accum * (steps + 1)
    tokens = torch.randint(0, config.vocab_size, (n, block), generator=torch.Generator())
    return Case(
        f"HF GPT-2 4 × 256, {block} tokens, fp32, micro {micro} × {accum}, process CPU time",
        Blocks(tokens),
        lambda: GPT2LMHeadModel(config),
        lambda m, b: m(**b).loss,
        micro,
        accum,
        clock=time.process_time,
        lr=3e-4,
    )


def run_case(
    case: Case, tmp: str, rounds: int, steps: int, loggers: bool = False
) -> tuple[list[list[float]], list[list[float]]]:
    """Per round, the Trainer's and the plain loop's timed steps."""
    precision = resolve_precision(case.precision, torch.device("cpu"))
    sections = {
        "precision": {"mode": case.precision},
        "optimizer": {"lr": case.lr, "betas": list(case.betas), "weight_decay": 0.1},
        "measure": {"peak_tflops": 1.0},  # not measured: the benchmark times the loop only
        "cost": {"usd_per_gpu_hour": 2.0},  # the dollar meter on
        **logger_sections(tmp, loggers),
        **case.config,
    }
    ours: list[list[float]] = []
    plain: list[list[float]] = []
    effective = case.micro * case.accum
    for r in range(rounds):
        config = run_config(f"{tmp}/{r}", steps, r, case.micro, effective, **sections)
        config["run"]["log_every"] = LOG_EVERY
        config["schedule"] = {"warmup_steps": 5, "decay": "cosine", "min_lr_ratio": 0.1}
        torch.manual_seed(r)
        trainer = Trainer(
            case.model(), case.data, TrainConfig.from_dict(config), loss_fn=case.loss_fn
        )

        def ours_run(trainer: Trainer = trainer) -> list[float]:
            return trainer_loop(trainer, case.clock)

        def plain_run(r: int = r, trainer: Trainer = trainer) -> list[float]:
            return plain_loop(
                trainer.model,
                case.data,
                steps,
                micro=case.micro,
                accum=case.accum,
                forward=case.forward,
                precision=precision,
                seed=r,
                lr=case.lr,
                betas=case.betas,
                optimizer=trainer.optimizer,
                clock=case.clock,
            )

        alternate(r, ours_run, plain_run, ours, plain)
        trainer.close()
    return ours, plain


def demo_runs(
    tmp: str, rounds: int, steps: int, loggers: bool = False
) -> tuple[list[list[float]], list[list[float]], str]:
    """The demo GPT: each loop trains its own new model, as the demo does."""
    data = train_dataset()
    precision = resolve_precision("auto", torch.device("cpu"))
    args = DEMO_CONFIG["task"]["model_args"]
    sections = {k: DEMO_CONFIG[k] for k in ("precision", "optimizer") if k in DEMO_CONFIG}
    sections.update(logger_sections(tmp, loggers))
    opt = DEMO_CONFIG.get("optimizer", {})
    schedule = {"warmup_steps": 5, "decay": "cosine", "min_lr_ratio": 0.1}
    ours: list[list[float]] = []
    plain: list[list[float]] = []
    for r in range(rounds):
        config = run_config(f"{tmp}/demo{r}", steps, r, MICRO, EFFECTIVE, **sections)
        config["schedule"] = schedule

        def ours_run(r: int = r, config: dict[str, Any] = config) -> list[float]:
            torch.manual_seed(r)
            trainer = Trainer(build_model(**args), data, TrainConfig.from_dict(config))
            with trainer:
                return trainer_loop(trainer)

        def plain_run(r: int = r) -> list[float]:
            torch.manual_seed(r)
            return plain_loop(
                build_model(**args),
                data,
                steps,
                micro=MICRO,
                accum=EFFECTIVE // MICRO,
                forward=lambda m, b: m(**b),
                precision=precision,
                seed=r,
                lr=opt.get("lr", 2e-3),
                betas=tuple(opt.get("betas", (0.9, 0.95))),  # type: ignore[arg-type]
            )

        alternate(r, ours_run, plain_run, ours, plain)
    return ours, plain, f"demo GPT, {precision.name}, micro {MICRO} × {EFFECTIVE // MICRO}"


def blocks(run: list[float]) -> list[float]:
    """The run's timed steps summed by `LOG_EVERY`: each block holds one metrics flush."""
    return [sum(run[i : i + LOG_EVERY]) for i in range(0, len(run) - LOG_EVERY + 1, LOG_EVERY)]


def report(name: str, ours: list[list[float]], plain: list[list[float]], target: float) -> float:
    """Print the block ratio: the median time of `LOG_EVERY` consecutive steps (one metrics
    flush each) of the Trainer over the plain loop's. Medians, because on a shared machine a
    step now and then stalls for a third of a second (the host's doing, not the loop's); the
    ratio of the plain sums is printed beside it, with the spread of the rounds' own ratios."""
    ours_blocks = [b for run in ours for b in blocks(run)]
    plain_blocks = [b for run in plain for b in blocks(run)]
    ratio = statistics.median(ours_blocks) / statistics.median(plain_blocks)
    runs = sorted(
        statistics.median(blocks(o)) / statistics.median(blocks(q))
        for o, q in zip(ours, plain, strict=True)
    )
    sums = sum(map(sum, ours)) / sum(map(sum, plain))
    steps = len(ours[0])
    print(f"{name}, {len(ours)} rounds × {steps} timed steps, {torch.get_num_threads()} threads")
    print(
        f"  median block of {LOG_EVERY} steps: thrifty.Trainer "
        f"{statistics.median(ours_blocks) * 1e3:.2f} ms, plain loop "
        f"{statistics.median(plain_blocks) * 1e3:.2f} ms"
    )
    print(f"  block ratio (Trainer / plain): {ratio:.4f}  (target ≤ {target})")
    print(
        f"  per-round block ratios: median {statistics.median(runs):.4f}, middle half "
        f"{runs[len(runs) // 4]:.4f}-{runs[(3 * len(runs)) // 4]:.4f}; ratio of all steps' "
        f"sums {sums:.4f}",
        flush=True,
    )
    return ratio


# (rounds, steps) by default, the steps a whole number of flush periods past the warm-up
DEFAULTS = {"mlp": (60, 63), "mlp-tensor": (60, 63), "gpt2": (10, 23), "demo": (6, 23)}
TARGETS = {"mlp": 1.03, "mlp-tensor": 1.03, "gpt2": 1.01, "demo": 1.03}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=tuple(DEFAULTS), action="append")
    parser.add_argument("--rounds", type=int, default=None, help="per case; see DEFAULTS")
    parser.add_argument("--steps", type=int, default=None, help="per run, warm-up included")
    parser.add_argument(
        "--loggers", action="store_true", help="the Trainer logs to TensorBoard and MLflow too"
    )
    args = parser.parse_args()
    with_loggers = " + TensorBoard + MLflow" if args.loggers else ""
    if not logging.getLogger().handlers:  # quiet runs: fit() prints its summary otherwise
        logging.basicConfig(level=logging.WARNING, format="thrifty: %(message)s")
    for which in args.only or ["mlp", "gpt2"]:
        rounds = args.rounds or DEFAULTS[which][0]
        steps = args.steps or DEFAULTS[which][1]
        with tempfile.TemporaryDirectory() as tmp:
            if which == "demo":
                ours, plain, name = demo_runs(tmp, rounds, steps, args.loggers)
            else:
                case = gpt2_case(steps) if which == "gpt2" else mlp_case(steps, which != "mlp")
                ours, plain = run_case(case, tmp, rounds, steps, args.loggers)
                name = case.name
        report(name + with_loggers, ours, plain, TARGETS[which])


if __name__ == "__main__":
    main()
