"""What a fleet job costs before it is submitted: the planner's estimate (thrifty.plan) on the
chosen GPUs, on-demand, spot, and spot with the expected interruptions.

The work is the config's: parameters counted from the task's model built on the meta device
(no memory, no weights), tokens from run.max_tokens or run.max_steps x the effective batch x
the sequence length. The price is the cheapest catalog instance with those GPUs per node (or
`--instance`), the interruption rate `checkpoint.interruption_rate`. Units: hours, USD,
USD per hour.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from thrifty.errors import ConfigError, ThriftyError
from thrifty.plan.units import fmt_usd
from thrifty.redact import redact_text

if TYPE_CHECKING:
    from thrifty.config import TrainConfig
    from thrifty.plan.catalog import Catalog, Instance
    from thrifty.plan.estimate import Estimate
    from thrifty.plan.spot import SpotPlan

# Keys of task.model_args or task.data_args that give a sample's tokens.
_SEQ_KEYS = ("block_size", "seq_len", "seq_length", "max_seq_len", "context_length")


@dataclass(frozen=True, slots=True, kw_only=True)
class Work:
    """The job's size for the planner: parameters, tokens, and how each was found."""

    params: float | None = None
    tokens: float | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True, kw_only=True)
class FleetCost:
    """The planner's estimate and spot economics of the job (either may be missing, with the
    reason in `notes`)."""

    work: Work
    instances: int = 1
    estimate: Estimate | None = None
    spot: SpotPlan | None = None
    notes: list[str] = field(default_factory=list)


def count_params(config: TrainConfig) -> int:
    """Parameters of the task's model, built on the meta device (allocates nothing)."""
    import torch

    from thrifty.run.task import call_factory, import_object

    if config.task.model is None:
        raise ConfigError("task.model is not set")
    factory = import_object(config.task.model, "task.model")
    with torch.device("meta"):
        model = call_factory(factory, config.task.model_args, "task.model", "task.model_args")
    return sum(p.numel() for p in model.parameters())


def sample_tokens(config: TrainConfig) -> tuple[int, str]:
    """Tokens per sample from the task's arguments, and where the figure came from."""
    for where, args in (
        ("task.model_args", config.task.model_args),
        ("task.data_args", config.task.data_args),
    ):
        for key in _SEQ_KEYS:
            value = args.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{where}.{key}"
    return 1, "a sample counts as one token (give --seq for sequences)"


def job_work(
    config: TrainConfig,
    gpus: int,
    *,
    params: float | None = None,
    tokens: float | None = None,
    seq: int | None = None,
) -> Work:
    """The job's parameters and tokens: given, or read from the config (`gpus`: the job's
    processes, which make the effective batch when batch.effective is not set)."""
    notes = []
    if params is None:
        try:
            params = float(count_params(config))
            notes.append(f"{params:,.0f} parameters counted from task.model")
        except Exception as exc:  # a user's factory may fail on the meta device in any way
            reason = redact_text(str(exc))[:120]
            notes.append(f"parameters not counted ({reason}): give --params")
    if tokens is None:
        tokens, note = _budget_tokens(config, gpus, seq)
        notes.append(note)
    return Work(params=params, tokens=tokens, notes=notes)


def _budget_tokens(config: TrainConfig, gpus: int, seq: int | None) -> tuple[float | None, str]:
    """Tokens of the run's budget: run.max_tokens, or run.max_steps x the effective batch x
    the tokens per sample, the fewer when both are set (the first reached ends the run)."""
    run, options = config.run, []
    if run.max_tokens is not None:
        options.append((float(run.max_tokens), "tokens from run.max_tokens"))
    if run.max_steps is not None:
        effective = config.batch.effective or config.batch.fixed_micro * gpus
        per_sample, source = (seq, "--seq") if seq else sample_tokens(config)
        options.append(
            (
                float(run.max_steps * effective * per_sample),
                f"tokens = run.max_steps {run.max_steps:,} x batch {effective:,} x "
                f"{per_sample:,} tokens per sample ({source})",
            )
        )
    if not options:
        return None, "no run.max_steps or run.max_tokens: give --tokens"
    return min(options)


def compute_dtype(config: TrainConfig, have: set[str]) -> str:
    """The planner's dtype for precision.mode on a GPU whose catalog peaks are `have`."""
    mode = config.precision.mode
    if mode == "auto":
        mode = "bf16" if "bf16" in have else "fp16"
    if mode == "fp32" and config.precision.allow_tf32 and "tf32" in have:
        return "tf32"
    return mode


def pick_instance(catalog: Catalog, gpu: str, per_node: int, wanted: str | None) -> Instance | None:
    """`--instance`, checked against the GPUs asked for, or the cheapest catalog instance
    with `per_node` GPUs `gpu` (one with a spot price first); None when there is none."""
    from thrifty.plan.catalog import UnknownNameError

    if wanted is not None:
        try:
            found = catalog.instance(wanted)
        except UnknownNameError as exc:
            raise ConfigError(f"--instance {wanted!r} is invalid: {exc}") from None
        if found.gpu.name != gpu or found.gpu_count != per_node:
            raise ConfigError(
                f"--instance {wanted!r} is invalid: it has {found.gpu_count} x "
                f"{found.gpu.name}, and --gpus asks for {per_node} x {gpu}"
            )
        return found
    rows = [i for i in catalog.instances.values() if i.gpu.name == gpu and i.gpu_count == per_node]
    rows.sort(key=lambda i: (i.spot_per_hour is None, i.on_demand_per_hour))
    return rows[0] if rows else None


def fleet_cost(
    config: TrainConfig,
    work: Work,
    *,
    gpu: str,
    per_node: int,
    nodes: int,
    instance: str | None = None,
    mfu: float | None = None,
) -> FleetCost:
    """The planner's estimate of `work` on `nodes` nodes of `per_node` GPUs `gpu`, priced on
    the catalog instance with those GPUs, and its spot economics at
    `checkpoint.interruption_rate`."""
    from thrifty.plan.catalog import load_catalog
    from thrifty.plan.estimate import estimate

    catalog = load_catalog(config.cost.catalog)
    found = pick_instance(catalog, gpu, per_node, instance)
    if work.params is None or work.tokens is None:
        return FleetCost(work=work, notes=["no estimate without parameters and tokens"])
    dtype = compute_dtype(config, set(catalog.gpu(gpu).peak_tflops))
    if found is None:  # the GPUs' throughput still gives the hours
        est = estimate(
            work.params,
            work.tokens,
            gpu=gpu,
            count=nodes * per_node,
            dtype=dtype,
            mfu=mfu,
            catalog=catalog,
        )
        note = f"no catalog instance has {per_node} x {gpu}: no price (give --instance)"
        return FleetCost(work=work, instances=nodes, estimate=est, notes=[note])
    est = estimate(
        work.params,
        work.tokens,
        instance=found,
        count=nodes,
        dtype=dtype,
        mfu=mfu,
        catalog=catalog,
    )
    if found.spot_per_hour is None:
        note = f"{found.name} has no spot price in the catalog"
        return FleetCost(work=work, instances=nodes, estimate=est, notes=[note])
    spot, note = _spot(config, est, found, nodes)
    return FleetCost(work=work, instances=nodes, estimate=est, spot=spot, notes=[note])


def _spot(
    config: TrainConfig, est: Estimate, found: Instance, nodes: int
) -> tuple[SpotPlan | None, str]:
    from thrifty.plan.spot import interruption_rate, spot_economics

    given = config.checkpoint.interruption_rate
    if isinstance(given, str):
        rate = interruption_rate(advisor_bucket=given)
    else:
        rate = interruption_rate(rate_per_hour=given)
    assert found.spot_per_hour is not None  # the caller checked
    price = functools.partial(
        spot_economics,
        est.hours,
        on_demand_per_hour=found.on_demand_per_hour * nodes,
        spot_per_hour=found.spot_per_hour * nodes,
        rate_per_hour=rate,
        instances=nodes,  # any one interrupted stops the job
    )
    cap = config.checkpoint.max_interval_seconds
    try:
        plan = price()
        if config.checkpoint.every == "auto" and plan.interval_seconds > cap:
            # The run saves at least every checkpoint.max_interval: priced as it will run.
            plan = price(interval_seconds=cap)
    except ThriftyError as exc:
        return None, f"no spot estimate: {exc}"
    return plan, (
        f"checkpoint.interruption_rate {given!r} = {rate:.3g}/h per instance; checkpoint save "
        f"{plan.save_seconds:g} s and restart {plan.restart_seconds:g} s assumed"
    )


def cost_lines(cost: FleetCost) -> list[str]:
    """The estimate as the lines `thrifty launch` prints before anything is submitted."""
    lines = ["Cost (the planner's estimate, thrifty.plan):"]
    est = cost.estimate
    if est is not None:
        on_demand, spot = est.cost["on-demand"], est.cost["spot"]
        where = f"{cost.instances} x {est.instance}" if est.instance else "no instance"
        lines += [
            f"  work       {est.flops.total:.3g} FLOPs: {est.params:,.0f} parameters x "
            f"{est.tokens:,.0f} tokens",
            f"  hardware   {est.gpus} x {est.gpu} ({where}), {est.dtype} at {est.mfu:.0%} MFU",
            f"  time       {_duration(est.hours * 3600)} of work",
        ]
        if cost.spot is not None:  # all three with the final save, as the expected cost has it
            on_demand = cost.spot.on_demand_cost
            spot = cost.spot.spot_per_hour * cost.spot.on_demand_hours
        saved = f", with the final {cost.spot.save_seconds:g} s save" if cost.spot else ""
        if on_demand is not None:
            lines.append(
                f"  on-demand  {fmt_usd(on_demand)} (${est.price_per_hour['on-demand']:,.2f}/h"
                f"{saved})"
            )
        if spot is not None:
            lines.append(
                f"  spot       {fmt_usd(spot)} uninterrupted (${est.price_per_hour['spot']:,.2f}/h"
                f"{saved})"
            )
    if cost.spot is not None:
        s = cost.spot
        every = (
            f"a checkpoint every {_duration(s.interval_seconds)}"
            if s.checkpoints > 1
            else "too short for a checkpoint before the end to pay"
        )
        lines.append(
            f"  expected   {fmt_usd(s.spot_cost)} on spot with interruptions: "
            f"{s.expected_interruptions:.3g} expected in {_duration(s.expected_hours * 3600)}, "
            f"{every}"
        )
    lines += [f"  note       {n}" for n in (*cost.work.notes, *cost.notes)]
    return lines


def _duration(seconds: float) -> str:
    """Seconds as the unit that reads best: s, min or h."""
    if seconds < 120:
        return f"{seconds:.3g} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
