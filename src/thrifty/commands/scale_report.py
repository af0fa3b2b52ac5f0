"""`thrifty scale`'s report: throughput, speed-up and efficiency per process count against the
smallest, beside the planner's prediction, as a dict (scale.json, --json) and as a table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from thrifty.console import dash
from thrifty.plan.scaling import (
    DDP_GRAD_BYTES_PER_PARAM,
    efficiency_against_baseline,
    overlap_applies,
    scaling_conclusion,
)

if TYPE_CHECKING:
    from thrifty.commands.scale import ScalePlan


def compare(
    plan: ScalePlan, summaries: Mapping[int, Mapping[str, Any]], bus: Mapping[int, float]
) -> dict[str, Any]:
    """Throughput, speed-up and efficiency per count against the smallest, beside the planner's
    prediction. `bus` holds the bus bandwidth (GB/s per direction) of each count above 1."""
    base_n = plan.counts[0]
    base = summaries[base_n]
    key, unit = throughput_key(base)
    params = base["parameters"]
    one_process = base["step_seconds"] * base_n  # the whole global batch on one process
    overlap, why = overlap_applies(plan.device, params * DDP_GRAD_BYTES_PER_PARAM)
    throughput = {n: summaries[n][key] for n in plan.counts}
    model = efficiency_against_baseline(params, throughput, one_process, bus, overlap)
    rows = []
    for n in plan.counts:
        s = summaries[n]
        rows.append(
            {
                "processes": n,
                "run_dir": str(plan.run_dir(n)),
                "strategy": s.get("strategy"),
                "omp_num_threads": plan.threads(n),
                "accumulation_steps": s.get("accumulation_steps"),
                "steps": s.get("steps"),
                "step_seconds": s["step_seconds"],
                "breakdown": s.get("breakdown"),  # mean seconds per step, by phase
                "throughput": s[key],
                **model[n],
            }
        )
    return {
        "config": plan.config,
        "out": str(plan.out),
        "steps": plan.steps,
        "device": plan.device,
        "backend": plan.backend,
        "global_batch": plan.effective,
        "global_batch_from": "the config's batch.effective"
        if plan.effective_from_config
        else f"batch.effective unset: micro x lcm({', '.join(map(str, plan.counts))})",
        "micro": plan.micro,
        "cpus": plan.cpus,
        "omp_from_environment": plan.user_omp is not None and plan.device == "cpu",
        "parameters": params,
        "gradient_bytes": params * DDP_GRAD_BYTES_PER_PARAM,
        "unit": unit,
        "baseline_processes": base_n,
        "prediction_applies": "overlap" if overlap else "no_overlap",
        "prediction_applies_because": why,
        "counts": rows,
        "conclusion": scaling_conclusion(rows, overlap, unit),
    }


def throughput_key(summary: Mapping[str, Any]) -> tuple[str, str]:
    """Tokens per second for a token task, else samples per second: (summary key, unit)."""
    if summary["tokens_per_second"]:
        return "tokens_per_second", "tokens/s"
    return "samples_per_second", "samples/s"


def print_report(report: Mapping[str, Any]) -> None:
    from rich.markup import escape

    from thrifty.console import Table, console

    out = console()
    rows = report["counts"]
    out.print(
        escape(
            f"thrifty scale: {report['config']}, global batch {report['global_batch']}, "
            f"{report['steps']} steps per count, {report['device']} ({report['backend']})"
        ),
        style="bold",
    )
    table = Table(pad_edge=False)
    applies = report["prediction_applies"]
    columns = ["processes", "strategy", "threads", "accum", "ms/step", report["unit"], "speedup"]
    columns += ["efficiency", "predicted\nno overlap", "predicted\noverlap", "bus\nGB/s"]
    for name in columns:
        if name.endswith("\n" + applies.replace("_", " ")):
            name = name.replace("\n", " *\n")  # the prediction that applies
        table.add_column(name, justify="left" if name == "strategy" else "right")
    for r in rows:
        table.add_row(
            str(r["processes"]),
            str(r["strategy"] or "-"),
            dash(r["omp_num_threads"]),
            dash(r["accumulation_steps"]),
            f"{r['step_seconds'] * 1e3:,.1f}",
            f"{r['throughput']:,.0f}",
            f"{r['speedup']:.2f}x",
            f"{r['efficiency']:.0%}",
            f"{r['predicted_efficiency_no_overlap']:.0%}",
            f"{r['predicted_efficiency_overlap']:.0%}",
            "-" if r["bus_gbs"] is None else f"{r['bus_gbs']:.3g}",
        )
    out.print(table)
    base = report["baseline_processes"]
    if report["device"] == "cpu":
        threads = (
            "OMP_NUM_THREADS from your environment, the same at every count"
            if report["omp_from_environment"]
            else f"OMP_NUM_THREADS = {report['cpus']} CPUs // processes"
        )
    else:
        threads = "OMP_NUM_THREADS left as the launcher sets it (CUDA run)"
    notes = [
        f"threads: {threads}",
        f"global batch: {report['global_batch']} samples per step at every count (micro "
        f"{report['micro']}; {report['global_batch_from']})",
        f"efficiency: {report['unit']} at N / (N/{base} x {report['unit']} at {base})",
        f"predicted: thrifty.plan.scaling with {report['parameters']:,} parameters x "
        f"{DDP_GRAD_BYTES_PER_PARAM} bytes of gradients and the compute of one step = "
        f"{rows[0]['step_seconds'] * base * 1e3:,.1f} ms / N (the step at {base} x {base}/N)",
        f"* applies: {report['prediction_applies_because']}",
        f"bus bandwidth: {report['bus_source']}",
    ]
    for note in notes:
        out.print(f"  {escape(note)}", soft_wrap=True)
    out.print(escape(report["conclusion"]), soft_wrap=True)
