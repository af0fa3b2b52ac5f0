"""Readable tables (rich) and JSON for the planner's results. Imported only by the commands."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table as _RichTable

from thrifty.console import Table
from thrifty.plan.catalog import GPU, Catalog, Instance
from thrifty.plan.chinchilla import Allocation
from thrifty.plan.commitment import CommitmentPlan
from thrifty.plan.estimate import Estimate
from thrifty.plan.levers import LeverPlan
from thrifty.plan.memory import MemoryPlan
from thrifty.plan.scaling import Scaling
from thrifty.plan.spot import SpotPlan
from thrifty.plan.units import fmt_bytes, fmt_count, fmt_dollars, fmt_hours, fmt_pct, fmt_usd


def _kv(title: str, rows: Iterable[tuple[str, str]]) -> _RichTable:
    table = Table(title=title, show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    for key, value in rows:
        table.add_row(key, escape(value))
    return table


def print_assumptions(out: Console, notes: Iterable[str]) -> None:
    for note in notes:
        out.print(f"  [dim]assumed:[/dim] {escape(note)}", soft_wrap=True)
    out.print()


def estimate_table(e: Estimate) -> _RichTable:
    f = e.flops
    rows = [
        ("parameters", fmt_count(e.params)),
        ("tokens", f"{fmt_count(e.tokens)} ({e.tokens / e.params:.1f} per parameter)"),
        ("FLOPs, counted" if f.counted else "FLOPs, 6*N*D", f"{f.dense:.3g}"),
    ]
    if f.attention:
        rows.append(("FLOPs, attention", f"{f.attention:.3g}"))
    if f.recompute:
        rows.append(("FLOPs, recompute", f"{f.recompute:.3g}"))
    rows += [
        ("FLOPs, total", f"{f.total:.3g}"),
        ("hardware", f"{e.gpus} x {e.gpu}" + (f" ({e.instance})" if e.instance else "")),
        ("peak per GPU", f"{e.peak_flops_per_gpu / 1e12:g} TFLOP/s ({e.dtype})"),
        ("MFU", fmt_pct(e.mfu)),
        ("wall-clock time", f"{fmt_hours(e.hours)} ({e.hours / 24:,.1f} days)"),
        ("GPU-hours", f"{e.gpu_hours:,.0f}"),
    ]
    for pricing in ("on-demand", "spot"):
        price = e.price_per_hour[pricing]
        if price is not None:
            cost = e.cost[pricing]
            shown = fmt_usd(cost) if cost is not None and cost < 10 else fmt_dollars(cost)
            rate = f"{price:,.2f}" if price >= 1 else f"{price:.3g}"
            rows.append((f"cost, {pricing}", f"{shown} at ${rate}/h"))
    return _kv("Job estimate", rows)


def memory_table(m: MemoryPlan) -> _RichTable:
    rows = [
        ("bytes per parameter", f"{m.per_param.total:g} (before sharding)"),
        ("weights", fmt_bytes(m.weights)),
        ("gradients", fmt_bytes(m.gradients)),
        (
            "optimizer states",
            fmt_bytes(m.optimizer_states)
            + (" (fp32 master copy included)" if m.per_param.master else ""),
        ),
    ]
    if m.activations is not None:
        rows.append(("activations", f"{fmt_bytes(m.activations)} (micro-batch {m.micro_batch})"))
        rows.append(("logits", fmt_bytes(m.logits or 0.0)))
    rows.append(("total per GPU", fmt_bytes(m.total)))
    if m.layer_activations:
        layer = m.layer_activations
        rows.append(
            (
                "one layer's activations",
                f"{fmt_bytes(layer['stored'])} stored, {fmt_bytes(layer['recomputed'])} recomputed "
                f"(eager attention {fmt_bytes(layer['eager_attention'])}, "
                f"flash {fmt_bytes(layer['flash_attention'])})",
            )
        )
    if m.capacity is not None:
        rows.append(
            ("GPU memory", f"{fmt_bytes(m.capacity)} ({m.gpu}), usable {fmt_bytes(m.usable or 0)}")
        )
        rows.append(("fits", "yes" if m.fits else "NO"))
    if m.max_micro_batch is not None:
        rows.append(
            (
                "largest micro-batch",
                f"{m.max_micro_batch} as configured, "
                f"{m.max_micro_batch_full_recompute} with full recompute",
            )
        )
    return _kv("Memory per GPU", rows)


def scaling_table(s: Scaling) -> _RichTable:
    rows = [
        ("GPUs", f"{s.gpus} ({s.nodes} node{'s' if s.nodes > 1 else ''} x {s.gpus_per_node} GPUs)"),
        ("gradient all-reduce size", fmt_bytes(s.gradient_bytes)),
        ("bus bandwidth", f"{s.bus_gbs:g} GB/s per direction ({s.bus_limited_by})"),
        ("compute per step", f"{s.compute_seconds * 1e3:,.1f} ms"),
        ("ring all-reduce per step", f"{s.allreduce_seconds * 1e3:,.1f} ms"),
        (
            "efficiency, no overlap",
            f"{fmt_pct(s.efficiency_no_overlap)} "
            f"({s.effective_gpus_no_overlap:.1f} effective GPUs)",
        ),
        (
            "efficiency, with overlap",
            f"{fmt_pct(s.efficiency_overlap)} ({s.effective_gpus_overlap:.1f} effective GPUs)",
        ),
    ]
    return _kv("Scaling (data parallel)", rows)


def spot_table(p: SpotPlan) -> _RichTable:
    rows = [
        ("interruption rate", _spot_rate(p)),
        ("checkpoint interval", _interval(p)),
        (
            "Young, Daly",
            f"{p.young_seconds:,.0f} s, {p.daly_seconds:,.0f} s (first-order approximations)",
        ),
        ("expected interruptions", f"{p.expected_interruptions:.2f}"),
        (
            "lost per interruption",
            f"{fmt_hours(p.lost_hours_per_interruption)} (work since the last checkpoint + restart)",
        ),
        ("checkpoint overhead", fmt_hours(p.checkpoint_overhead_hours)),
        (
            "expected wall-clock",
            f"{fmt_hours(p.expected_hours)} vs {fmt_hours(p.on_demand_hours)} on-demand "
            f"({p.overhead_factor:.2f}x; both write the finished model)",
        ),
        ("cost, on-demand", f"{fmt_dollars(p.on_demand_cost)} at ${p.on_demand_per_hour:,.2f}/h"),
        (
            "expected cost, spot",
            f"{fmt_dollars(p.spot_cost)} at ${p.spot_per_hour:,.2f}/h "
            f"({fmt_pct(1 - p.spot_cost / p.on_demand_cost)} saved)",
        ),
        ("break-even rate", _break_even(p)),
        (
            "without checkpoints",
            f"{fmt_hours(p.no_checkpoint_hours)}, "
            f"{fmt_dollars(p.no_checkpoint_cost)} expected (restart from scratch)",
        ),
    ]
    return _kv("Spot economics", rows)


def _interval(p: SpotPlan) -> str:
    """The interval, and how many saves it makes: the last writes the finished model."""
    if p.checkpoints == 1:
        return (
            f"none: the job's {fmt_hours(p.work_hours)} of work is one interval, then the final "
            f"save ({p.interval_source})"
        )
    return (
        f"{p.interval_seconds:,.0f} s ({p.interval_source}): {p.checkpoints - 1:,} checkpoints "
        "and the final save"
    )


def _spot_rate(p: SpotPlan) -> str:
    text = f"{p.rate_per_hour:.4g}/h (one every {fmt_hours(1 / p.rate_per_hour)})"
    if p.instances > 1:
        text += f" = {p.instances} instances x {p.rate_per_instance_per_hour:.4g}/h"
    return text


def _break_even(p: SpotPlan) -> str:
    be = p.break_even_rate_per_hour
    if be is None:
        return "spot never pays"
    text = f"{be:.3g}/h (one every {fmt_hours(1 / be)})"
    if p.instances > 1 and p.break_even_rate_per_instance_per_hour is not None:
        text += f", {p.break_even_rate_per_instance_per_hour:.3g}/h per instance"
    return text + ": above it spot costs more"


def hours_table(h: Any) -> _RichTable:
    """Hours of work on an instance without a spot price (`thrifty plan --hours`)."""
    where = f"{h.instances} x {h.instance}" if h.instances > 1 else h.instance
    return _kv(
        f"{fmt_hours(h.hours)} on {where}",
        [("cost, on-demand", f"{fmt_dollars(h.cost)} at ${h.on_demand_per_hour:,.4g}/h")],
    )


def commitment_table(c: CommitmentPlan) -> _RichTable:
    """Each commitment's price and the share of its hours above which it beats on-demand and
    spot (expected interruptions included)."""
    star = "*" if c.uncertain else ""
    table = Table(title=f"Commitments on {c.instance} (USD per hour; * = uncertain)")
    for column in ("term", "per hour", "off on-demand", "pays vs on-demand", "pays vs spot"):
        table.add_column(column, justify="left" if column == "term" else "right", no_wrap=True)
    for t in c.terms:
        table.add_row(
            t.term,
            f"${t.per_hour:,.4g}{star}",
            fmt_pct(t.discount),
            f"above {fmt_pct(t.break_even_on_demand)} used",
            _versus_spot(t.break_even_spot),
        )
    return table


def _versus_spot(share: float | None) -> str:
    if share is None:
        return "no spot price"
    if share > 1:
        return f"never (needs {fmt_pct(share)})"
    return f"above {fmt_pct(share)} used"


def commitment_lines(c: CommitmentPlan) -> list[str]:
    """The prices compared, and (given a usage) which pays least for it."""
    spot = (
        f"; spot ${c.spot_per_hour:,.4g}/h is ${c.spot_effective_per_hour:,.4g} per hour of "
        "work with its expected interruptions"
        if c.spot_per_hour is not None and c.spot_effective_per_hour is not None
        else ""
    )
    lines = [f"on-demand ${c.on_demand_per_hour:,.4g}/h{spot}", f"committed prices: {c.source}"]
    u = c.usage
    if u is not None:
        costs = ", ".join(f"{k} {fmt_dollars(v)}" for k, v in u.monthly_usd.items())
        lines.append(
            f"{_amount(u.instance_hours)} instance-hours a month ({fmt_pct(u.utilisation)} of "
            f"{u.committed_instances} committed instance{'s' if u.committed_instances > 1 else ''}"
            f"): {costs} a month; cheapest: {u.cheapest}"
        )
    return lines


def _amount(value: float) -> str:
    """A quantity with a comma and one decimal, or three significant figures below 10."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def chinchilla_table(chosen: Allocation, others: list[Allocation], notes: list[str]) -> _RichTable:
    table = Table(title=f"Compute-optimal allocation for {chosen.flops:.3g} FLOPs")
    for column in ("fit", "parameters", "tokens", "tokens/param", "predicted loss", "6*N*D"):
        table.add_column(column, justify="left" if column == "fit" else "right")
    for a in [chosen, *others]:
        label = a.fit + (" (chosen)" if a is chosen else "")
        loss = "-" if a.loss is None else f"{a.loss:.3f}"
        table.add_row(
            label,
            fmt_count(a.params),
            fmt_count(a.tokens),
            f"{a.tokens_per_param:.1f}",
            loss,
            f"{6 * a.params * a.tokens:.3g}",
        )
    return table


_GROUP = {"price per hour": "price", "hours per run": "hours", "runs needed": "runs"}


def levers_table(
    plan: LeverPlan,
    title: str = "Cost levers, applied in sequence",
    *,
    unit: str = "USD",
    money: Callable[[float], str] = fmt_dollars,
    groups: bool = True,
) -> _RichTable:
    """The waterfall: each lever's before, after and saving, then the total. `money` formats
    an amount in `unit`; `groups` names each lever's group before it."""
    table = Table(title=f"{title} ({unit} per {plan.period})")
    table.add_column("lever: change", no_wrap=True)
    for column in ("before", "after", "saved", "saved %", "of baseline"):
        table.add_column(column, justify="right", no_wrap=True)
    for s in plan.steps:
        group = f"{_GROUP.get(s.group, s.group)}: " if groups else ""
        table.add_row(
            f"{group}{s.lever}\n  [dim]{escape(s.detail)}[/dim]",
            money(s.before),
            money(s.after),
            money(s.saving),
            fmt_pct(s.saving_pct),
            fmt_pct(s.saving / plan.baseline),
        )
    total = (plan.saving_pct, plan.saving_pct)
    table.add_row("total", money(plan.baseline), money(plan.final),
                  money(plan.saving), *map(fmt_pct, total), style="bold")  # fmt: skip
    return table


def gpus_table(gpus: Iterable[GPU]) -> _RichTable:
    table = Table(title="GPUs (peak dense TFLOP/s per GPU)")
    columns = (
        "name",
        "fp32",
        "tf32",
        "bf16",
        "fp16",
        "fp8",
        "memory",
        "mem GB/s",
        "interconnect GB/s/dir",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "name" else "right")
    for g in gpus:
        peaks = [
            _mark(g, f"peak_tflops.{d}", f"{g.peak_tflops[d]:g}") if d in g.peak_tflops else "-"
            for d in ("fp32", "tf32", "bf16", "fp16", "fp8")
        ]
        link = f"{g.interconnect_gbs_per_direction:g}, {g.interconnect}"
        table.add_row(
            g.name,
            *peaks,
            _mark(g, "memory_gib", f"{g.memory_gib:g} GiB"),
            _mark(g, "memory_bandwidth_gbs", f"{g.memory_bandwidth_gbs:,.0f}"),
            link,
        )
    return table


def instances_table(instances: Iterable[Instance]) -> tuple[_RichTable, list[str]]:
    """The instance table and its numbered price sources."""
    table = Table(title="Instances (USD per hour per instance)")
    right = ("on-demand", "spot (range)", "per GPU-h")
    for column in ("name", "GPUs", *right, "price date", "src"):
        table.add_column(column, justify="right" if column in right else "left", no_wrap=True)
    sources: list[str] = []
    for i in instances:
        source = f"{i.price_source}; {i.provider}, region {i.region}"
        if source not in sources:
            sources.append(source)
        spot = "-"
        if i.spot_per_hour is not None:
            spot = f"{i.spot_per_hour:,.2f}"
            if i.spot_range:
                spot += f" ({i.spot_range[0]:.2f}-{i.spot_range[1]:.2f})"
        table.add_row(
            i.name if i.price_traced else f"{i.name} †",
            f"{i.gpu_count}x {i.gpu.name}",
            f"{i.on_demand_per_hour:,.2f}",
            spot,
            f"{i.on_demand_per_hour / i.gpu_count:,.2f}",
            i.price_date,
            f"({sources.index(source) + 1})",
        )
    return table, [f"({n}) {text}" for n, text in enumerate(sources, start=1)]


def committed_line(instances: Iterable[Instance]) -> str | None:
    """Which instances have 1- and 3-year committed prices ($/hour, * where uncertain)."""
    rows = []
    for i in instances:
        prices = [
            f"{price:,.2f}{'*' if key in i.uncertain else ''}"
            for key, price in (
                ("commit_1y", i.commit_1y_per_hour),
                ("commit_3y", i.commit_3y_per_hour),
            )
            if price is not None
        ]
        if prices:
            rows.append(f"{i.name} {' / '.join(prices)}")
    if not rows:
        return None
    return (
        "1-year / 3-year committed $/h ('thrifty prices NAME' shows where each pays): "
        + ", ".join(rows)
    )


def _mark(gpu: GPU, field: str, text: str) -> str:
    return f"{text}*" if field in gpu.uncertain else text


def detail_table(item: GPU | Instance) -> _RichTable:
    kind = "Instance" if isinstance(item, Instance) else "GPU"
    return _kv(f"{kind} {item.name}", [(k, _show(v)) for k, v in item_dict(item).items()])


def _show(value: Any) -> str:
    if value is None or value == () or value == []:
        return "-"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v:g}" for k, v in value.items())
    if isinstance(value, list | tuple):
        return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def item_dict(item: GPU | Instance) -> dict[str, Any]:
    """One catalog entry as plain data (an instance's GPU by name)."""
    from dataclasses import asdict

    data = asdict(item)
    if isinstance(item, Instance):
        data["gpu"] = item.gpu.name
    return data


def catalog_dict(catalog: Catalog, gpus: list[GPU], instances: list[Instance]) -> dict[str, Any]:
    from dataclasses import asdict

    inst = []
    for i in instances:
        data = asdict(i)
        data["gpu"] = i.gpu.name
        inst.append(data)
    return {"files": list(catalog.files), "gpus": [asdict(g) for g in gpus], "instances": inst}
