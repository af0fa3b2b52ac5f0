"""What `thrifty plan` does once its options are parsed.

`run_plan` turns options into planner inputs, computes each section the inputs allow, then prints
them as tables (with the assumptions under each) or as one JSON object.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from thrifty.commands.plan.pricing import (
    commitment_section,
    hours_section,
    priced_hardware,
    rate_given,
    spot_plan,
    spot_section,
    usd_per_hour,
)
from thrifty.errors import ConfigError
from thrifty.plan.catalog import Catalog, load_catalog
from thrifty.plan.estimate import (
    Estimate,
    Hardware,
    ModelShape,
    estimate,
    resolve_hardware,
    tokens_from_steps,
)
from thrifty.plan.spot import SpotPlan

if TYPE_CHECKING:
    from thrifty.plan.chinchilla import Allocation
    from thrifty.plan.lawfit import ScalingFit
    from thrifty.plan.lawpredict import Prediction

Model = float | ModelShape
SHAPE_FLAGS = ("layers", "hidden", "heads", "vocab", "seq")


@dataclass
class Sections:
    """Computed results in print order, as (key, result) pairs."""

    items: list[tuple[str, Any]] = field(default_factory=list)

    def add(self, key: str, result: Any) -> None:
        self.items.append((key, result))


def run_plan(args: argparse.Namespace) -> int:
    catalog = load_catalog(args.catalog)
    if args.plot and not (args.levers or args.case_study):
        raise ConfigError("--plot draws the lever waterfall: add --levers or --case-study")
    if args.case_study:
        return _case_study(args, catalog)
    sections = Sections()
    if args.config is not None:
        _config_sections(args, catalog, sections)
        _print(args, sections)
        return 0
    model = _model(args)
    budget = any(
        v is not None for v in (args.budget_flops, args.budget_gpu_hours, args.budget_dollars)
    )
    if args.hours is not None:
        if model is not None or budget:
            raise ConfigError(
                "--hours prices hours of work on an instance: give it without a model "
                "(--params, a shape) or a budget, or give those without --hours"
            )
        hours_section(args, catalog, sections)
        _print(args, sections)
        return 0
    if model is None and not budget:
        raise ConfigError(
            "thrifty plan needs a model (--params, or --layers/--hidden/--heads/--vocab/--seq) "
            "with data (--tokens, or --steps/--batch) and hardware (--instance or --gpu), a budget "
            "(--budget-flops/--budget-gpu-hours/--budget-dollars), or --case-study"
        )
    if model is not None:
        _job_sections(args, catalog, model, sections)
    if budget:
        _chinchilla_section(args, catalog, sections)
    _print(args, sections)
    return 0


def _config_sections(args: argparse.Namespace, catalog: Catalog, sections: Sections) -> None:
    """`thrifty plan CONFIG.toml`: the job's estimate on --instance or --gpu, its spot
    economics (the rate given, else the 5-10% advisor bucket) and the commitments."""
    from thrifty.commands.plan.config_job import plan_config
    from thrifty.plan.estimate import priced_gpu

    given = [f"--{k}" for k in ("params", "tokens", "steps", "batch", "hours") if getattr(args, k)]
    given += [f"--{k}" for k in SHAPE_FLAGS if getattr(args, k) is not None]
    if given:
        raise ConfigError(
            f"{args.config} gives the model and the budget: leave out {', '.join(given)} "
            "(or drop the config and give them alone)"
        )
    if args.instance is None and args.gpu is None:
        raise ConfigError(
            f"pricing {args.config} needs hardware: --instance NAME (e.g. g5.xlarge) or "
            "--gpu NAME (e.g. A10G, priced on the cheapest catalog instance with it)"
        )
    if args.instance is not None:
        hardware = priced_hardware(args, catalog, "pricing a config")
    else:
        hardware = priced_gpu(args.gpu, args.count, catalog)
    est = plan_config(args, hardware)
    sections.add("estimate", est)
    if hardware.instance is None:
        return
    if hardware.instance.spot_per_hour is not None:
        sections.add("spot", spot_plan(args, hardware, est.hours, default_bucket="5-10%"))
    commitment_section(args, hardware, est.hours, sections)


def _model(args: argparse.Namespace) -> float | ModelShape | None:
    given = {name: getattr(args, name) for name in SHAPE_FLAGS if getattr(args, name) is not None}
    shape_given = {k for k in given if k != "seq"}
    if args.params is not None and shape_given:
        flags = ", ".join(f"--{k}" for k in sorted(shape_given))
        raise ConfigError(f"give --params or the transformer shape ({flags}), not both")
    if shape_given:
        missing = [f"--{k}" for k in SHAPE_FLAGS if k not in given]
        if missing:
            raise ConfigError(f"a transformer shape needs {', '.join(missing)} as well")
        return ModelShape(**given)
    return args.params


def _tokens(args: argparse.Namespace) -> float | None:
    if args.tokens is not None and (args.steps is not None or args.batch is not None):
        raise ConfigError("give --tokens or --steps with --batch, not both")
    if args.tokens is not None:
        return args.tokens
    if args.steps is None and args.batch is None:
        return None
    if args.steps is None or args.batch is None or args.seq is None:
        raise ConfigError("data as steps x batch needs --steps, --batch (sequences) and --seq")
    return tokens_from_steps(args.steps, args.batch, args.seq)


def _job_sections(
    args: argparse.Namespace, catalog: Catalog, model: float | ModelShape, sections: Sections
) -> None:
    if args.instance is None and args.gpu is None:
        raise ConfigError("planning a job needs hardware: --instance NAME (priced) or --gpu NAME")
    if args.instance is not None and args.gpu is not None:
        raise ConfigError("give --instance or --gpu, not both (an instance names its GPU)")
    hardware = resolve_hardware(
        instance=args.instance, gpu=args.gpu, count=args.count, catalog=catalog
    )
    tokens = _tokens(args)
    if tokens is None and (rate_given(args) or args.levers):
        what = "--levers" if args.levers else "spot economics"
        raise ConfigError(f"{what} need the job's length: add --tokens (or --steps/--batch/--seq)")
    est = None
    if tokens is not None:
        est = estimate(
            model,
            tokens,
            instance=hardware.instance,
            gpu=None if hardware.instance else hardware.gpu,
            count=args.count,
            dtype=args.dtype,
            mfu=args.mfu,
            recompute=args.recompute,
            catalog=catalog,
        )
        sections.add("estimate", est)
    _memory_section(args, catalog, model, hardware, sections)
    _scaling_section(args, model, hardware, sections)
    spot = spot_section(args, hardware, est, sections)
    if args.levers:
        _levers_section(args, model, hardware, est, spot, sections)


def _memory_section(
    args: argparse.Namespace, catalog: Catalog, model: Model, hardware: Hardware, sections: Sections
) -> None:
    from thrifty.plan.memory import memory

    shards = hardware.gpus if args.zero else 1
    sections.add(
        "memory",
        memory(
            model,
            gpu=hardware.gpu,
            dtype=args.dtype,
            optimizer=args.optimizer,
            zero_stage=args.zero,
            shards=shards,
            micro_batch=args.micro_batch,
            recompute=args.recompute,
            attention=args.attention,
            catalog=catalog,
        ),
    )


def _scaling_section(
    args: argparse.Namespace, model: Model, hardware: Hardware, sections: Sections
) -> None:
    from thrifty.plan.estimate import DEFAULT_MFU
    from thrifty.plan.scaling import scaling, step_compute_seconds

    seq = model.seq if isinstance(model, ModelShape) else args.seq
    if hardware.gpus < 2 or seq is None:
        return
    params = model.params if isinstance(model, ModelShape) else model
    if args.batch is not None:
        tokens_per_gpu = args.batch * seq / hardware.gpus
    else:
        tokens_per_gpu = args.micro_batch * args.grad_accum * seq
    mfu = args.mfu if args.mfu is not None else DEFAULT_MFU
    peak = hardware.gpu.peak_flops(args.dtype)
    compute = step_compute_seconds(model, tokens_per_gpu, peak, mfu, recompute=args.recompute)
    nodes, per_node, placement = _nodes(hardware)
    network = args.network_bandwidth
    if network is None and hardware.instance is not None:
        network = hardware.instance.network_gbs
    result = scaling(
        params,
        gpus_per_node=per_node,
        nodes=nodes,
        compute_seconds=compute,
        intra_node_gbs=args.bus_bandwidth or hardware.gpu.usable_bus_gbs,
        inter_node_gbs=network,
        grad_bytes_per_param=float(args.grad_bytes),
    )
    result.assumptions.extend(
        [
            placement,
            f"{tokens_per_gpu:,.0f} tokens per GPU per optimizer step; compute at MFU {mfu:.0%} "
            "of the FLOPs the job estimate counts (6*N per token, plus attention for a shape "
            "and recompute)",
        ]
    )
    if args.zero == 3:
        result.assumptions.append(
            "modelled as a DDP all-reduce; ZeRO-3/FSDP also all-gathers the weights, up to "
            "~1.5x this traffic with 16-bit gradients"
        )
    sections.add("scaling", result)


def _nodes(hardware: Hardware) -> tuple[int, int, str]:
    """(nodes, GPUs per node, why): an instance is one node; bare GPUs fill nodes of one NVLink
    domain each, or PCIe servers for GPUs without NVLink."""
    from thrifty.plan.scaling import node_layout, node_size

    if hardware.instance is not None:
        instance = hardware.instance
        return hardware.count, instance.gpu_count, f"one node per {instance.name}"
    gpu = hardware.gpu
    size = node_size(gpu)
    nodes, per_node = node_layout(hardware.gpus, size)
    domain = (
        f"one NVLink domain ({gpu.nvlink_domain_source})"
        if gpu.nvlink_domain > 1
        else "one PCIe server (no NVLink)"
    )
    return nodes, per_node, f"--gpu without an instance: nodes of at most {size} GPUs, {domain}"


def _levers_section(
    args: argparse.Namespace,
    model: Model,
    hardware: Hardware,
    est: Estimate | None,
    spot: SpotPlan | None,
    sections: Sections,
) -> None:
    from thrifty.plan.estimate import training_flops
    from thrifty.plan.levers import LeverInputs, apply_levers, plot_waterfall

    if est is None or hardware.instance is None:
        raise ConfigError(
            "--levers needs a priced job: --instance NAME and --tokens (or --steps/--batch)"
        )
    baseline = args.baseline_dtype if args.baseline_dtype in hardware.gpu.peak_tflops else "fp32"
    speedup = args.precision_speedup or (
        hardware.gpu.peak_flops(args.dtype) / hardware.gpu.peak_flops(baseline)
    )
    inputs = LeverInputs(
        hours_per_run=est.hours * speedup,
        on_demand_per_hour=usd_per_hour(hardware, "on-demand"),
        runs=args.runs,
        spot_per_hour=hardware.price_per_hour("spot"),
        spot_overhead=spot.overhead_factor if spot else 1.0,
        precision_speedup=speedup,
        microbatch_speedup=args.microbatch_speedup,
        compile_speedup=args.compile_speedup,
        early_stopped_runs=args.early_stop,
        early_stop_fraction=args.early_stop_at,
        period="run" if args.runs == 1 else f"{args.runs:g} runs",
    )
    plan = apply_levers(inputs)
    how = "given" if args.precision_speedup else f"{args.dtype}/{baseline} peak ratio at equal MFU"
    plan.assumptions.append(
        f"precision speed-up {speedup:.3g}x ({how}); measure and pass --precision-speedup"
    )
    extra = training_flops(model, 1.0, recompute="full")
    plan.assumptions.append(
        f"full activation recompute adds {extra.recompute / (extra.dense + extra.attention):.0%}"
        " FLOPs: "
        "a larger micro-batch pays only if throughput rises by more (--microbatch-speedup is net)"
    )
    if spot is None and hardware.instance.spot_per_hour is not None:
        plan.assumptions.append(
            "spot without interruption overhead: give --interruptions-per-hour or --advisor"
        )
    sections.add("levers", plan)
    if args.plot:
        plot_waterfall(plan, args.plot, title=f"Cost levers on {hardware.instance.name}")


def _chinchilla_section(args: argparse.Namespace, catalog: Catalog, sections: Sections) -> None:
    from thrifty.commands.plan.options import budget_from_args
    from thrifty.plan.chinchilla import FIT_NAMES, chinchilla

    flops, notes = budget_from_args(args, catalog)
    if args.fit not in FIT_NAMES:  # a saved fit, or a folder of runs
        _own_fit_section(args, flops, notes, sections)
        return
    chosen = chinchilla(flops, fit=args.fit)
    chosen.assumptions.extend(notes)
    others = [chinchilla(flops, fit=f) for f in FIT_NAMES if f != args.fit]
    sections.add("chinchilla", (chosen, others))


@dataclass
class OwnFit:
    """A law fitted to the user's runs, at the budget: what its section prints."""

    label: str
    fit: ScalingFit
    prediction: Prediction
    others: list[Allocation]  # the named fits'
    notes: list[str]


def _own_fit_section(
    args: argparse.Namespace, flops: float, notes: list[str], sections: Sections
) -> None:
    from thrifty.commands.plan.fit import own_fit
    from thrifty.plan.chinchilla import FIT_NAMES, chinchilla
    from thrifty.plan.lawpredict import predict

    fit, label = own_fit(args.fit)
    others = [chinchilla(flops, fit=f) for f in FIT_NAMES]
    sections.add("own-fit", OwnFit(f"{label} (chosen)", fit, predict(fit, flops), others, notes))


def _case_study(args: argparse.Namespace, catalog: Catalog) -> int:
    from thrifty.commands.plan.case_study import DEFAULT_INSTANCE, case_study, print_case_study
    from thrifty.console import console, to_json
    from thrifty.plan.levers import plot_waterfall

    study = case_study(args.instance or DEFAULT_INSTANCE, catalog=catalog)
    if args.plot:
        plot_waterfall(
            study.catalog_levers, args.plot, title=f"Case study at {study.instance} prices"
        )
    if args.json:
        print(to_json(study.as_dict()))
    else:
        print_case_study(console(), study)
    return 0


def _print(args: argparse.Namespace, sections: Sections) -> None:
    from thrifty.console import console, to_json
    from thrifty.plan import tables as report

    if args.json:
        data: dict[str, Any] = {}
        for key, result in sections.items:
            if key == "chinchilla":
                chosen, others = result
                data[key] = {**chosen.as_dict(), "other_fits": [o.as_dict() for o in others]}
            elif key == "own-fit":
                data["chinchilla"] = _own_fit_dict(result)
            else:
                data[key] = result.as_dict()
        print(to_json(data))
        return
    out = console()
    render: dict[str, Callable[[Any], Any]] = {
        "estimate": report.estimate_table,
        "memory": report.memory_table,
        "scaling": report.scaling_table,
        "spot": report.spot_table,
        "levers": report.levers_table,
        "hours": report.hours_table,
        "commitment": report.commitment_table,
    }
    for key, result in sections.items:
        if key == "chinchilla":
            chosen, others = result
            out.print(report.chinchilla_table(chosen, others, chosen.assumptions))
            report.print_assumptions(out, chosen.assumptions)
            continue
        if key == "own-fit":
            from thrifty.commands.plan.fit import allocation_table, print_prediction_notes

            out.print(allocation_table(result.label, result.prediction, result.others))
            print_prediction_notes(out, result.fit, result.prediction, result.notes)
            continue
        out.print(render[key](result))
        if key == "commitment":
            for line in report.commitment_lines(result):
                out.print(f"  {line}", markup=False, soft_wrap=True)
        report.print_assumptions(out, result.assumptions)


def _own_fit_dict(section: OwnFit) -> dict[str, Any]:
    from thrifty.commands.plan.fit import allocation_dict

    return allocation_dict(
        section.label, section.fit, section.prediction, section.others, section.notes
    )
