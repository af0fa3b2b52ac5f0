"""IsoFLOP runs laid out for you: for each model size and each FLOP budget C, one run trained
on D = C / (6N) tokens, run as a sweep (spot-safe, resumable, several workers), ready for
`thrifty plan fit`.

The size knob is a key of the config (`task.model_args.n_embd`, or the depth); N is counted by
building the model at each size (trainable parameters, as the run's summary counts them), not
by a formula. It is built on PyTorch's meta device: shapes without storage, so a size whose
weights would not fit in memory is counted all the same, in milliseconds. A model whose code
cannot run on the meta device (it reads its weights' values while being built) is built for
real instead. D becomes `run.max_steps` through the tokens one optimizer step trains: the
effective batch times the tokens of one sample, read from the training data as the run counts
them (its `loss_mask`, else its `input_ids`). Each run's schedule ends at its own last step, as
Chinchilla's runs did: a run cut short of its schedule would read a higher loss than its size
and tokens earn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from thrifty.config import TrainConfig, apply_overrides
from thrifty.errors import ConfigError
from thrifty.search.sweep.space import read_config

STEPS_KEY = "run.max_steps"
MIN_STEPS = 10  # fewer, and warm-up and noise are most of what a run measures
MAX_SIZE = 1e9  # a width or a depth: past any model built
MAX_FLOPS = 1e30  # a budget: ten thousand times the largest runs trained


@dataclass(frozen=True, slots=True, kw_only=True)
class IsoRun:
    """One run of the grid: `size` of the knob, `params` built, trained `steps` steps of
    `tokens_per_step` tokens, for the budget `flops` (6*N*D comes out within a step of it)."""

    size: int | float
    params: int
    flops: float
    steps: int
    tokens_per_step: int

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens": self.tokens}


def parse_sizes(text: str) -> tuple[str, list[int | float]]:
    """`KEY=V1,V2,...` (e.g. task.model_args.n_embd=64,96,128): the knob and its sizes."""
    key, _, values = text.partition("=")
    key = key.strip()
    if not key or not values:
        raise ConfigError(
            f"--size {text!r} is not KEY=V1,V2,...: e.g. --size task.model_args.n_embd=64,96,128"
        )
    sizes: list[int | float] = []
    for item in values.split(","):
        try:
            number = float(item)
        except ValueError:
            raise ConfigError(f"--size {text!r}: {item.strip()!r} is not a number") from None
        if not (math.isfinite(number) and 0 < number <= MAX_SIZE):
            raise ConfigError(
                f"--size {text!r}: sizes must be above 0 and at most {MAX_SIZE:g}, got "
                f"{item.strip()[:40]!r}"
            )
        sizes.append(int(number) if number.is_integer() else number)
    if len(set(sizes)) < 3:
        raise ConfigError(
            f"--size {text!r}: give at least 3 different sizes: a budget's parabola of loss "
            "against size needs 3 points"
        )
    return key, sorted(set(sizes))


def layout(
    config: str | Path | Mapping[str, Any],
    key: str,
    sizes: Sequence[int | float],
    budgets: Sequence[float],
    overrides: Sequence[str] = (),
) -> list[IsoRun]:
    """The grid's runs, smallest budget first: every size at every budget in `budgets`. Raises
    ConfigError (one line) for a knob the config does not set, or a run under MIN_STEPS."""
    if not budgets or any(not (math.isfinite(c) and 0 < c <= MAX_FLOPS) for c in budgets):
        raise ConfigError(
            f"--flops needs FLOP budgets above 0 and at most {MAX_FLOPS:g}, e.g. --flops "
            "1e13,3e13,1e14"
        )
    given = read_config(config, overrides)
    built = {size: _measure(given, key, size) for size in sizes}
    runs = []
    for flops in sorted(set(budgets)):
        for size in sizes:
            params, per_step = built[size]
            steps = round(flops / (6.0 * params) / per_step)
            if steps < MIN_STEPS:
                raise ConfigError(
                    f"--flops {flops:.3g} buys {steps} steps at {key}={size} ({params:,} "
                    f"parameters, {per_step:,} tokens a step); the least is {MIN_STEPS}: give "
                    "larger budgets or smaller sizes"
                )
            runs.append(
                IsoRun(size=size, params=params, flops=flops, steps=steps, tokens_per_step=per_step)
            )
    return runs


def space(key: str, runs: Sequence[IsoRun]) -> dict[str, Any]:
    """The sweep's space: the sizes and the step counts the grid uses, as choices."""
    return {
        key: {"choices": sorted({r.size for r in runs})},
        STEPS_KEY: {"choices": sorted({r.steps for r in runs})},
    }


def run_grid(
    config: str | Path | Mapping[str, Any],
    key: str,
    runs: Sequence[IsoRun],
    out: str | Path,
    *,
    workers: int = 1,
    storage: str | None = None,
    overrides: Sequence[str] = (),
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the grid as a sweep in `out` (its trials are the grid's runs, never pruned: every
    run's final loss is a point of the fit) and return the sweep's record. The same call
    continues a grid stopped part way."""
    from thrifty.search.sweep.plan import SweepOptions, make_sweep
    from thrifty.search.sweep.runner import run_sweep

    options = SweepOptions(
        trials=len(runs),
        pruner="none",
        workers=workers,
        storage=storage,
        overrides=[
            f"{STEPS_KEY}={min(r.steps for r in runs)}",
            *overrides,
        ],  # each run sets its own
    )
    plan = make_sweep(config, space(key, runs), Path(out), options, say=say)
    for run in runs:  # a grid's points, not a sampler's: queued once, whatever the restarts
        plan.study.enqueue_trial({key: run.size, STEPS_KEY: run.steps}, skip_if_exists=True)
    return run_sweep(plan)


def _measure(given: Mapping[str, Any], key: str, size: int | float) -> tuple[int, int]:
    """Trainable parameters of the model built at `size`, and the tokens one step trains."""
    from thrifty.levers.accumulation import count_tokens
    from thrifty.run.task import call_factory, import_object

    *tables, last = key.split(".")
    table: Any = given
    for part in tables:
        table = table.get(part) if isinstance(table, Mapping) else None
    if not isinstance(table, Mapping) or last not in table:
        raise ConfigError(f"--size {key}: the config does not set {key}; set it there first")
    config = TrainConfig.from_dict(apply_overrides(given, [(key, size), (STEPS_KEY, MIN_STEPS)]))
    t = config.task
    if t.model is None or t.train_data is None:
        raise ConfigError(
            "an IsoFLOP grid builds the config's task: set task.model and task.train_data"
        )
    params = count_params(import_object(t.model, "task.model"), t.model_args)
    data = call_factory(
        import_object(t.train_data, "task.train_data"),
        t.data_args,
        "task.train_data",
        "task.data_args",
    )
    sample = data[0] if hasattr(data, "__getitem__") else next(iter(data))
    per_sample = count_tokens(sample)
    if per_sample == 0:
        raise ConfigError(
            "an IsoFLOP grid counts tokens, and the training data's samples carry none: give them "
            "an input_ids (or loss_mask) tensor"
        )
    batch = config.batch.effective if config.batch.effective is not None else config.batch.micro
    assert isinstance(batch, int)  # micro = "auto" needs batch.effective
    return params, per_sample * batch


def count_params(factory: Callable[..., Any], args: Mapping[str, Any]) -> int:
    """Trainable parameters of `factory(**args)`, built on the meta device (no storage is
    allocated, whatever the size); built for real only if the model cannot be built there."""
    import torch

    from thrifty.run.task import call_factory

    try:
        with torch.device("meta"):
            model = call_factory(factory, dict(args), "task.model", "task.model_args")
    except (NotImplementedError, RuntimeError):  # it reads a weight's value while being built
        model = call_factory(factory, dict(args), "task.model", "task.model_args")
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
