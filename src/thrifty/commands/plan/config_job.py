"""`thrifty plan CONFIG.toml`: the cost of a training config before it runs.

The work is the config's own. FLOPs: one sample's forward and backward counted by
`thrifty.measure.flops.count_flops` on the task's model built on the meta device (no memory,
no weights, no arithmetic), times the samples of the budget; where the model cannot be traced
there, 6 x parameters per token. The budget: run.max_steps x the effective batch,
run.max_tokens / tokens per sample, run.max_epochs x the data's length, and run.max_time,
whichever ends the run first. Units: FLOPs, samples, tokens, hours, USD.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thrifty.errors import ConfigError, ThriftyError
from thrifty.redact import redact_text

if TYPE_CHECKING:
    from thrifty.config import TrainConfig
    from thrifty.plan.estimate import Estimate, Hardware

# activation_checkpointing.policy -> the planner's recompute
_RECOMPUTE = {"off": "none", "every_other": "every-other", "all": "full"}


@dataclass
class JobWork:
    """What one sample costs and how many samples the budget trains on."""

    flops_per_sample: float
    tokens_per_sample: int
    samples: float | None  # None: only run.max_time bounds the run
    hours_cap: float | None  # run.max_time, hours
    params: float
    notes: list[str] = field(default_factory=list)


def plan_config(args: argparse.Namespace, hardware: Hardware) -> Estimate:
    """The estimate of the config at `args.config` on `hardware`, with what it assumed."""
    from thrifty.config import load_config
    from thrifty.fleet.cost import compute_dtype
    from thrifty.plan.estimate import estimate

    config = load_config(args.config)
    work = job_work(config, hardware.gpus)
    dtype = compute_dtype(config, set(hardware.gpu.peak_tflops))
    recompute = _recompute(config, work.notes)
    per_token = work.flops_per_sample / work.tokens_per_sample
    priced = functools.partial(
        estimate,
        work.params,
        instance=hardware.instance,
        gpu=None if hardware.instance else hardware.gpu,
        count=hardware.count,
        dtype=dtype,
        mfu=args.mfu,
        recompute=recompute,
        flops_per_token=per_token,
    )
    probe = priced(1.0)  # the throughput at this hardware and MFU: one token's time
    est = priced(_tokens(work, probe.hours))
    est.assumptions[:0] = [f"config {args.config}", *work.notes]
    return est


def _tokens(work: JobWork, hours_per_token: float) -> float:
    """Tokens the run trains on: the budget's samples, or what run.max_time allows, the fewer."""
    options = []
    if work.samples is not None:
        options.append(work.samples * work.tokens_per_sample)
    if work.hours_cap is not None:
        options.append(work.hours_cap / hours_per_token)
        if work.samples is None or options[-1] < options[0]:
            work.notes.append(
                f"run.max_time ({work.hours_cap:g} h) ends the run first: "
                f"{options[-1]:,.0f} tokens at this throughput"
            )
    return min(options)


def job_work(config: TrainConfig, gpus: int) -> JobWork:
    """FLOPs per sample and the samples of the budget, for a run on `gpus` processes."""
    notes: list[str] = []
    model, data, counted = _build(config, notes)
    params = float(sum(p.numel() for p in model.parameters()))
    notes.append(f"{params:,.0f} parameters in task.model")
    tokens_per_sample, where = _sample_tokens(config, data)
    notes.append(f"{tokens_per_sample:,} tokens per sample ({where})")
    flops = counted
    if flops is None:
        flops = 6.0 * params * tokens_per_sample
        notes.append("FLOPs per sample = 6 x parameters x tokens per sample")
    samples = _budget_samples(config, gpus, tokens_per_sample, data, notes)
    hours_cap = None if config.run.max_seconds is None else config.run.max_seconds / 3600
    return JobWork(flops, tokens_per_sample, samples, hours_cap, params, notes)


def _build(config: TrainConfig, notes: list[str]) -> tuple[Any, Any, float | None]:
    """The model on the meta device, the training data, and one sample's FLOPs (None where
    they could not be counted: the note says why)."""
    import torch

    from thrifty.run.task import call_factory, import_object

    t = config.task
    if t.model is None or t.train_data is None:
        missing = "task.model" if t.model is None else "task.train_data"
        raise ConfigError(f"{missing} is not set: a config is priced from its [task]")
    factory = import_object(t.model, "task.model")
    with torch.device("meta"):
        model = call_factory(factory, t.model_args, "task.model", "task.model_args")
    data_factory = import_object(t.train_data, "task.train_data")
    data = call_factory(data_factory, t.data_args, "task.train_data", "task.data_args")
    try:
        flops = _count(model, data, config)
    except ThriftyError:
        raise
    except Exception as exc:  # a model the counter cannot trace on meta: fall back to 6N
        notes.append(f"FLOPs not counted on the model ({redact_text(str(exc))[:100]})")
        return model, data, None
    notes.append(
        "FLOPs per sample counted on one sample's forward and backward (PyTorch's "
        "FlopCounterMode, the model on the meta device)"
    )
    return model, data, flops


def _count(model: Any, data: Any, config: TrainConfig) -> float:
    import torch
    from torch.utils.data import DataLoader, default_collate

    from thrifty.data.sources import first_samples
    from thrifty.levers.accumulation import call_model, to_device
    from thrifty.measure.flops import count_flops
    from thrifty.run.task import import_object

    t = config.task
    collate = import_object(t.collate_fn, "task.collate_fn") if t.collate_fn else None
    if collate is None:
        collate = data.collate_fn if isinstance(data, DataLoader) else default_collate
    loss_fn = import_object(t.loss_fn, "task.loss_fn") if t.loss_fn else None
    batch = to_device(collate(first_samples(data, 1)), torch.device("meta"))
    return count_flops(lambda: call_model(model, batch, loss_fn).backward()).flops


def _sample_tokens(config: TrainConfig, data: Any) -> tuple[int, str]:
    """Tokens per sample: a sequence length in the task's arguments, else the length of the
    first sample's token ids, else 1 (a sample is the unit)."""
    from thrifty.fleet.cost import sample_tokens

    tokens, where = sample_tokens(config)
    if where.startswith("task."):
        return tokens, where
    try:
        ids = _token_ids(data)
    except Exception:  # a sample thrifty cannot read here: the sample is the unit
        ids = None
    if ids is not None:
        return ids, "the first sample's token ids"
    return 1, "no sequence length found: a sample counts as one token"


def _token_ids(data: Any) -> int | None:
    import torch

    from thrifty.data.sources import first_samples

    sample = first_samples(data, 1)[0]
    if isinstance(sample, dict):
        sample = sample.get("input_ids")
    elif isinstance(sample, tuple | list) and sample:
        sample = sample[0]
    if isinstance(sample, torch.Tensor) and not sample.is_floating_point() and sample.dim() == 1:
        return int(sample.numel())
    return None


def _budget_samples(
    config: TrainConfig, gpus: int, tokens_per_sample: int, data: Any, notes: list[str]
) -> float | None:
    """Samples of the budget: the fewest of steps x batch, tokens / tokens per sample and
    epochs x the data's length (None when only run.max_time is set)."""
    run = config.run
    options: list[tuple[float, str]] = []
    effective = config.batch.effective or config.batch.fixed_micro * gpus
    if run.max_steps is not None:
        options.append(
            (
                float(run.max_steps * effective),
                f"run.max_steps {run.max_steps:,} x effective batch {effective:,} samples",
            )
        )
    if run.max_tokens is not None:
        options.append(
            (
                run.max_tokens / tokens_per_sample,
                f"run.max_tokens {run.max_tokens:,} / {tokens_per_sample:,} tokens per sample",
            )
        )
    if run.max_epochs is not None:
        size = _length(data)
        options.append(
            (float(run.max_epochs * size), f"run.max_epochs {run.max_epochs} x {size:,} samples")
        )
    if not options:
        return None
    samples, why = min(options)
    notes.append(f"{samples:,.0f} samples: {why}")
    return samples


def _length(data: Any) -> int:
    try:
        return len(data)
    except TypeError:
        raise ConfigError(
            "run.max_epochs needs the training data's length, and task.train_data has none "
            "(a stream): give run.max_steps or run.max_tokens to price it"
        ) from None


def _recompute(config: TrainConfig, notes: list[str]) -> str | float:
    """The share of layers recomputed: every_nth:N is 1/N; module patterns are priced as all
    (an upper bound: which modules match is known only on the built model)."""
    policy = config.activation_checkpointing.policy
    recompute: str | float = "full"
    if isinstance(policy, str) and policy in _RECOMPUTE:
        recompute = _RECOMPUTE[policy]
    elif isinstance(policy, str) and policy.startswith("every_nth:"):
        recompute = 1 / int(policy.split(":", 1)[1])
    if recompute != "none":
        notes.append(f"activation_checkpointing.policy {policy!r} priced as recompute {recompute}")
    return recompute
