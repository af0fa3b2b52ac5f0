"""The three cost levers, applied in sequence: price per hour, hours per run, runs needed.

cost = runs x hours per run x price per hour, so the levers multiply. Each step below changes one
factor and reports the saving against the cost just before it and against the baseline:

1. price per hour: on-demand -> spot (times the expected spot overhead from interruptions);
2. hours per run: precision speed-up, larger micro-batch (made possible by activation
   checkpointing, net of its recompute cost), torch.compile;
3. runs needed: early stopping of K runs (of R) at a fraction f of their runtime:
   R - K*(1 - f) full-run equivalents.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from thrifty.errors import ConfigError
from thrifty.plan.units import fmt_dollars, require_fraction, require_positive


@dataclass(frozen=True, slots=True, kw_only=True)
class LeverInputs:
    """Baseline (on-demand, unoptimised) and the size of each lever. Prices in USD per hour."""

    hours_per_run: float
    on_demand_per_hour: float
    runs: float = 1.0
    spot_per_hour: float | None = None
    spot_overhead: float = 1.0
    precision_speedup: float = 1.0
    microbatch_speedup: float = 1.0
    compile_speedup: float = 1.0
    early_stopped_runs: float = 0.0
    early_stop_fraction: float = 0.6
    period: str = "run"

    def __post_init__(self) -> None:
        for name in (
            "hours_per_run",
            "on_demand_per_hour",
            "runs",
            "spot_overhead",
            "precision_speedup",
            "microbatch_speedup",
            "compile_speedup",
        ):
            require_positive(getattr(self, name), f"levers.{name}")
        if self.spot_per_hour is not None:
            require_positive(self.spot_per_hour, "levers.spot_per_hour")
        if self.spot_overhead < 1:
            raise ConfigError(f"levers.spot_overhead must be >= 1, got {self.spot_overhead!r}")
        if not 0 <= self.early_stopped_runs <= self.runs:
            raise ConfigError(
                f"levers.early_stopped_runs must be between 0 and runs ({self.runs:g}), "
                f"got {self.early_stopped_runs!r}"
            )
        require_fraction(self.early_stop_fraction, "levers.early_stop_fraction", allow_zero=True)


@dataclass(frozen=True, slots=True)
class LeverStep:
    """One lever: cost of the period before and after it, in USD."""

    lever: str
    group: str
    detail: str
    before: float
    after: float

    @property
    def saving(self) -> float:
        return self.before - self.after

    @property
    def saving_pct(self) -> float:
        """Saving as a fraction of the cost just before this lever."""
        return self.saving / self.before if self.before else 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeverPlan:
    """Baseline and final cost per period (USD) and the steps between them."""

    period: str
    baseline: float
    steps: list[LeverStep]
    assumptions: list[str] = field(default_factory=list)

    @property
    def final(self) -> float:
        return self.steps[-1].after if self.steps else self.baseline

    @property
    def saving(self) -> float:
        return self.baseline - self.final

    @property
    def saving_pct(self) -> float:
        return self.saving / self.baseline

    def as_dict(self) -> dict[str, object]:
        steps = [
            {
                **asdict(s),
                "saving": s.saving,
                "saving_pct": s.saving_pct,
                "saving_pct_of_baseline": s.saving / self.baseline,
            }
            for s in self.steps
        ]
        return {
            "period": self.period,
            "baseline": self.baseline,
            "final": self.final,
            "saving": self.saving,
            "saving_pct": self.saving_pct,
            "steps": steps,
            "assumptions": self.assumptions,
        }


def apply_levers(inputs: LeverInputs) -> LeverPlan:
    """Apply price, hours and runs levers in that order; return the cost after each (USD)."""
    i = inputs
    hours, runs = i.hours_per_run, i.runs
    price = i.on_demand_per_hour
    baseline = runs * hours * price
    steps: list[LeverStep] = []
    cost = baseline

    def step(lever: str, group: str, detail: str) -> None:
        nonlocal cost
        after = runs * hours * price
        steps.append(LeverStep(lever, group, detail, cost, after))
        cost = after

    if i.spot_per_hour is not None:
        price = i.spot_per_hour * i.spot_overhead
        overhead = f" x{i.spot_overhead:.3f} (interruptions)" if i.spot_overhead > 1 else ""
        step(
            "spot instances",
            "price per hour",
            f"${i.on_demand_per_hour:,.2f} -> ${i.spot_per_hour:,.2f}/h{overhead}",
        )
    for lever, speedup in (
        ("precision", i.precision_speedup),
        ("larger micro-batch", i.microbatch_speedup),
        ("torch.compile", i.compile_speedup),
    ):
        if speedup != 1.0:
            before = hours
            hours = hours / speedup
            step(lever, "hours per run", f"{before:,.1f} -> {hours:,.1f} h ({speedup:.3g}x)")
    if i.early_stopped_runs:
        before_runs = runs
        runs = runs - i.early_stopped_runs * (1 - i.early_stop_fraction)
        step(
            "early stopping",
            "runs needed",
            f"{i.early_stopped_runs:g} of {before_runs:g} stopped at {i.early_stop_fraction:.0%}: "
            f"{before_runs:g} -> {runs:g} runs",
        )
    notes = [
        f"baseline: {i.runs:g} run(s) x {i.hours_per_run:,.1f} h x ${i.on_demand_per_hour:,.2f}/h"
        f" = {fmt_dollars(baseline)} per {i.period}"
    ]
    if i.spot_per_hour is None:
        notes.append("no spot price: the price lever is not applied")
    return LeverPlan(period=i.period, baseline=baseline, steps=steps, assumptions=notes)


def plot_waterfall(plan: LeverPlan, path: str, title: str = "Cost levers") -> str:
    """Write a waterfall chart of `plan` to `path` (PNG); needs matplotlib (thrifty[plot])."""
    from thrifty.errors import require

    matplotlib = require("matplotlib", "plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def money(value: float) -> str:
        return fmt_dollars(value).replace("$", r"\$")  # a bare $ starts mathtext

    labels = ["baseline"] + [s.lever for s in plan.steps] + ["final"]
    fig, ax = plt.subplots(figsize=(1.6 * len(labels) + 2, 4.5))
    ax.bar(0, plan.baseline, color="#7f7f7f")
    ax.text(0, plan.baseline, money(plan.baseline), ha="center", va="bottom", fontsize=8)
    for index, s in enumerate(plan.steps, start=1):
        color = "#2ca02c" if s.saving >= 0 else "#d62728"
        ax.bar(index, -s.saving, bottom=s.before, color=color)
        label = f"-{money(s.saving)}\n({s.saving_pct:.0%})"
        ax.text(index, max(s.before, s.after), label, ha="center", va="bottom", fontsize=8)
    last = len(labels) - 1
    ax.bar(last, plan.final, color="#1f77b4")
    ax.text(last, plan.final, money(plan.final), ha="center", va="bottom", fontsize=8)
    ax.set_ylim(0, 1.15 * max([plan.baseline] + [s.before for s in plan.steps]))
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylabel(f"USD per {plan.period}")
    change = f"{money(plan.baseline)} to {money(plan.final)} (-{plan.saving_pct:.0%})"
    ax.set_title(f"{title.replace('$', chr(92) + '$')}: {change}")
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=120)
    except OSError as exc:
        raise ConfigError(f"--plot {path!r}: cannot write the chart: {exc.strerror}") from None
    finally:
        plt.close(fig)
    return path
