"""The "$50K -> $18K" training-cost case study, recomputed from its stated inputs.

The article: a ranking model trained on 8 A100 GPUs for 72 hours per run, two runs a month (24 a
year) at AWS on-demand prices, then moved to spot, BF16 (72 -> 48 h), a larger batch made
possible by gradient checkpointing (48 -> 40 h) and early stopping of 4 of the 24 yearly runs at
60% of their runtime. Its yearly figures fix the run count: $905,952 = 24 x $37,748 and
$436,800 = 24 x $18,200, so the case study is recomputed per year.
The same article's Chinchilla example prices a "$50K budget"; its dollars are checked here too.
Its published figures are checked against each other and against a dated catalog price, line by
line. Every number below is computed from PUBLISHED, none is typed in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from rich.console import Console
from rich.markup import escape

from thrifty.console import Table
from thrifty.errors import ConfigError
from thrifty.plan.catalog import Catalog, Instance, load_catalog
from thrifty.plan.levers import LeverInputs, LeverPlan, apply_levers
from thrifty.plan.tables import levers_table, print_assumptions
from thrifty.plan.units import fmt_dollars, fmt_pct

DEFAULT_INSTANCE = "p4d.24xlarge@v7"
NEWER_INSTANCE = "p4d.24xlarge"
# The article's hours (72 -> 48 -> 40 h) were measured on A100s; another GPU runs them at an
# unknown speed, so only A100 instances can price them.
ARTICLE_GPU = "A100"

# Figures as the article prints them.
PUBLISHED = {
    "gpus": 8,
    "hours": 72.0,
    "on_demand_per_run": 37_748.0,
    "spot_per_run": 13_512.0,
    "spot_saving": 24_236.0,
    "spot_saving_pct": 0.64,
    "bf16_hours": 48.0,
    "bf16_saving_pct": 0.33,
    "batch_hours": 40.0,
    "batch_saving_pct": 0.17,
    "runs_per_month": 2,  # text: "Two runs per month"
    "runs_per_year": 24,  # table: "24 runs x 40h"; text: "4 of the 24 monthly runs"
    "early_stop_label_runs_per_month": 4,  # table: "Early stopping (4 runs/month)"
    "early_stopped_runs": 4,
    "early_stop_at": 0.60,
    "early_stop_saving": 4_512.0,
    "per_run_after": 18_200.0,
    "per_run_saving_pct": 0.52,
    "monthly_before": 75_496.0,
    "monthly_after": 21_800.0,
    "monthly_saving": 53_696.0,
    "monthly_saving_pct": 0.71,
    "annual_before": 905_952.0,
    "annual_after": 436_800.0,
    "annual_saving": 469_152.0,
    # The Chinchilla example: budget_flops = 50_000 / 9.83 * 3600 * 8 * 312e12 * 0.30,
    # then spot_cost_usd = a100_hours * 9.83 with a100_hours in single-GPU hours.
    "chinchilla_example_budget": 50_000.0,
    "chinchilla_example_spot_per_hour": 9.83,  # "us-east-1 p4d.24xlarge: $9.83/h spot"
    "chinchilla_example_gpus": 8,
    "chinchilla_example_peak_flops": 312e12,
    "chinchilla_example_mfu": 0.30,
    "chinchilla_example_docstring_flops": 1e21,  # "1e21 for ~$50K on A100s"
}
PERIOD = "year"


@dataclass(frozen=True, slots=True)
class Check:
    """One published claim against what its own inputs or the catalog give."""

    claim: str
    published: str
    recomputed: str
    agrees: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseStudy:
    """The case study recomputed per year at a catalog price and at the article's own prices."""

    instance: str
    price_source: str
    catalog_levers: LeverPlan
    article_levers: LeverPlan
    checks: list[Check]
    assumptions: list[str] = field(default_factory=list)

    @property
    def disagreements(self) -> list[str]:
        """One line per published figure that disagrees, with the numbers."""
        return [
            f"{c.claim}: published {c.published}; {c.recomputed}"
            for c in self.checks
            if not c.agrees
        ]

    def as_dict(self) -> dict[str, object]:
        return {
            "instance": self.instance,
            "price_source": self.price_source,
            "runs_per_year": PUBLISHED["runs_per_year"],
            "catalog_levers": self.catalog_levers.as_dict(),
            "article_levers": self.article_levers.as_dict(),
            "checks": [asdict(c) for c in self.checks],
            "disagreements": self.disagreements,
            "assumptions": self.assumptions,
        }


def _levers(on_demand: float, spot: float | None) -> LeverPlan:
    """The article's levers over one year of runs, at the given 8-GPU prices (USD per hour)."""
    p = PUBLISHED
    return apply_levers(
        LeverInputs(
            hours_per_run=p["hours"],
            on_demand_per_hour=on_demand,
            runs=p["runs_per_year"],
            spot_per_hour=spot,
            precision_speedup=p["hours"] / p["bf16_hours"],
            microbatch_speedup=p["bf16_hours"] / p["batch_hours"],
            early_stopped_runs=p["early_stopped_runs"],
            early_stop_fraction=p["early_stop_at"],
            period=PERIOD,
        )
    )


def case_study(
    instance: str | Instance = DEFAULT_INSTANCE, *, catalog: Catalog | None = None
) -> CaseStudy:
    """Recompute the case study lever by lever at `instance`'s dated catalog price (8 GPUs)."""
    catalog = catalog or load_catalog()
    found = catalog.instance(instance)
    _require_article_gpu(found, catalog)
    newer = catalog.instances.get(NEWER_INSTANCE)
    p = PUBLISHED
    # The article's own hourly rates for the 8-GPU fleet, implied by its per-run figures.
    article_od = p["on_demand_per_run"] / p["hours"]
    article_spot = p["spot_per_run"] / p["hours"]
    fleet = p["gpus"] / found.gpu_count  # instances needed for 8 GPUs
    od = found.on_demand_per_hour * fleet
    spot = found.spot_per_hour * fleet if found.spot_per_hour is not None else None
    checks = (
        _lever_checks()
        + _run_count_checks()
        + _early_stop_checks(article_spot)
        + _catalog_checks(found, fleet, newer, article_od, article_spot)
        + _chinchilla_example_checks(found)
    )
    return CaseStudy(
        instance=found.name,
        price_source=found.dated_source,
        catalog_levers=_levers(od, spot),
        article_levers=_levers(article_od, article_spot),
        checks=checks,
        assumptions=[
            _price_assumption(found, fleet),
            f"{p['runs_per_year']} runs a year: the article's {p['runs_per_month']} runs a month"
            f" x 12, as its yearly {fmt_dollars(p['annual_before'])} = {p['runs_per_year']} x "
            f"{fmt_dollars(p['on_demand_per_run'])} shows",
            "article prices: the hourly rates its per-run figures imply "
            f"(${article_od:,.2f}/h on-demand, ${article_spot:,.2f}/h spot for 8 GPUs)",
            "no interruption overhead on spot: the article states none",
        ],
    )


def _require_article_gpu(found: Instance, catalog: Catalog) -> None:
    """Refuse an instance whose GPU is not an A100: the article's hours hold only on A100s."""
    if found.gpu.name.startswith(ARTICLE_GPU):
        return
    choices = ", ".join(
        i.name for i in catalog.instances.values() if i.gpu.name.startswith(ARTICLE_GPU)
    )
    raise ConfigError(
        f"instance {found.name!r} carries {found.gpu.name} GPUs, but the case study's "
        f"72 -> 48 -> 40 h were measured on {ARTICLE_GPU}s; choose an {ARTICLE_GPU} instance: "
        f"{choices}"
    )


def _price_assumption(found: Instance, fleet: float) -> str:
    """The catalog prices used, and whether the spot lever applies."""
    fleet_note = f"8 GPUs = {fleet:g} x {found.name}"
    if found.spot_per_hour is None:
        spot_note = "no spot price in the catalog, so the spot lever does not apply"
    else:
        spot_note = f"spot ${found.spot_per_hour:,.2f}/h (the catalog's typical spot price)"
    return (
        f"catalog price: {found.name} ${found.on_demand_per_hour:,.2f}/h on-demand, {spot_note}; "
        f"{fleet_note}; {found.dated_source}"
    )


def _lever_checks() -> list[Check]:
    """Each lever's published saving against its own inputs, and the per-run total."""
    p = PUBLISHED
    chain = p["spot_per_run"] * p["bf16_hours"] / p["hours"] * p["batch_hours"] / p["bf16_hours"]
    return [
        _saving_check(
            "spot saving $ = on-demand - spot", "spot_saving", "on_demand_per_run", "spot_per_run"
        ),
        _pct_check(
            "spot saving %", p["spot_saving_pct"], p["spot_saving"] / p["on_demand_per_run"]
        ),
        _pct_check(
            "BF16 72 -> 48 h saving", p["bf16_saving_pct"], 1 - p["bf16_hours"] / p["hours"]
        ),
        _pct_check(
            "larger batch 48 -> 40 h saving",
            p["batch_saving_pct"],
            1 - p["batch_hours"] / p["bf16_hours"],
        ),
        _check(
            "cost per run after spot, BF16 and larger batch",
            fmt_dollars(p["per_run_after"]),
            f"its own levers give {fmt_dollars(p['spot_per_run'])} x 48/72 x 40/48 = "
            f"{fmt_dollars(chain)} (-{fmt_pct(1 - chain / p['on_demand_per_run'])})",
            abs(chain - p["per_run_after"]) < 0.01 * p["per_run_after"],
        ),
        _check(
            "reduction: text vs table",
            f"-{p['per_run_saving_pct']:.0%} per run (text)",
            f"the table says -{p['monthly_saving_pct']:.0%} per month "
            f"({fmt_dollars(p['monthly_before'])} -> {fmt_dollars(p['monthly_after'])}); the "
            f"yearly {fmt_dollars(p['annual_before'])} -> {fmt_dollars(p['annual_after'])} is "
            f"-{fmt_pct(1 - p['annual_after'] / p['annual_before'])}",
            abs(p["per_run_saving_pct"] - p["monthly_saving_pct"]) < 0.01,
        ),
    ]


def _run_count_checks() -> list[Check]:
    """The yearly figures are 24 runs (2 a month x 12); the table labels that count monthly."""
    p = PUBLISHED
    runs, per_month = p["runs_per_year"], p["runs_per_month"]
    monthly_from_annual = p["annual_after"] / 12
    return [
        _check(
            "annual before = 12 x monthly",
            fmt_dollars(p["annual_before"]),
            f"12 x {fmt_dollars(p['monthly_before'])} = {fmt_dollars(12 * p['monthly_before'])}",
            p["annual_before"] == 12 * p["monthly_before"],
        ),
        *(
            _check(
                f"annual {when} = {runs} runs x cost per run",
                fmt_dollars(p[annual]),
                f"{runs} x {fmt_dollars(p[per_run])} = {fmt_dollars(runs * p[per_run])}",
                p[annual] == runs * p[per_run],
            )
            for when, annual, per_run in (
                ("before", "annual_before", "on_demand_per_run"),
                ("after", "annual_after", "per_run_after"),
            )
        ),
        _saving_check("annual saving", "annual_saving", "annual_before", "annual_after"),
        _check(
            "early stopping: runs a month",
            f"'(4 runs/month)' beside '{runs} runs x 40h' (table); '4 of the {runs} monthly runs'"
            " (text)",
            f"{runs} is the yearly count ({per_month} runs a month x 12 = {per_month * 12}; "
            f"{fmt_dollars(p['annual_before'])} = {runs} x {fmt_dollars(p['on_demand_per_run'])})"
            f": 4 of {runs} runs a year, {p['early_stopped_runs'] / 12:.2g} a month",
            # The label is right only if the table's run count is the article's monthly one.
            runs == per_month,
        ),
        _check(
            "monthly cost after the levers",
            f"{fmt_dollars(p['monthly_after'])} (table)",
            f"the annual {fmt_dollars(p['annual_after'])} / 12 = "
            f"{fmt_dollars(monthly_from_annual)}",
            abs(monthly_from_annual - p["monthly_after"]) < 0.01 * p["monthly_after"],
        ),
    ]


def _early_stop_checks(article_spot: float) -> list[Check]:
    """The hours early stopping saves a year, and their price at the article's spot rate."""
    p = PUBLISHED
    runs = p["runs_per_year"]
    whole_runs_h = p["early_stopped_runs"] * p["batch_hours"]
    at_60_h = whole_runs_h * (1 - p["early_stop_at"])
    return [
        _check(
            "early stopping: hours saved a year",
            f"'terminated at {p['early_stop_at']:.0%} runtime' = {at_60_h:g} h",
            f"the table drops whole runs ({runs} -> {runs - p['early_stopped_runs']} runs x 40 h)"
            f" = {whole_runs_h:g} h",
            at_60_h == whole_runs_h,
        ),
        _check(
            "early stopping saving",
            f"~{fmt_dollars(p['early_stop_saving'])}",
            f"at its spot rate ${article_spot:,.2f}/h: {fmt_dollars(at_60_h * article_spot)} "
            f"({at_60_h:g} h) or {fmt_dollars(whole_runs_h * article_spot)} ({whole_runs_h:g} h)",
            min(abs(h * article_spot - p["early_stop_saving"]) for h in (at_60_h, whole_runs_h))
            < 0.05 * p["early_stop_saving"],
        ),
    ]


def _catalog_checks(
    found: Instance, fleet: float, newer: Instance | None, article_od: float, article_spot: float
) -> list[Check]:
    """The article's implied on-demand and spot prices against the catalog's."""
    p = PUBLISHED
    gpus = p["gpus"]
    od_gpu = found.on_demand_per_hour / found.gpu_count
    newer_note = ""
    if newer is not None and newer.name != found.name:
        newer_note = f" or ${newer.on_demand_per_hour / newer.gpu_count:.2f}/GPU-h ({newer.name})"
    checks = [
        _check(
            "on-demand price implied by $37,748 for 8 A100 x 72 h",
            f"${article_od / gpus:.2f}/GPU-h (${article_od:,.2f}/h for 8 GPUs)",
            f"catalog ${od_gpu:.2f}/GPU-h ({found.name}){newer_note}: "
            f"{fmt_dollars(found.on_demand_per_hour * fleet * p['hours'])} per run, "
            f"{article_od / (found.on_demand_per_hour * fleet):.1f}x less",
            abs(article_od / gpus - od_gpu) < 0.05 * od_gpu,
        ),
    ]
    if found.spot_per_hour is None:
        return checks
    spot_gpu = found.spot_per_hour / found.gpu_count
    discount = 1 - found.spot_per_hour / found.on_demand_per_hour
    rng = disc_rng = ""
    if found.spot_range is not None:
        low, high = found.spot_range
        rng = f" (range ${low / found.gpu_count:.2f}-${high / found.gpu_count:.2f})"
        hi_d, lo_d = 1 - low / found.on_demand_per_hour, 1 - high / found.on_demand_per_hour
        disc_rng = f", range {fmt_pct(lo_d)}-{fmt_pct(hi_d)}"
    return checks + [
        _check(
            "spot price implied by $13,512 per run",
            f"${article_spot / gpus:.2f}/GPU-h",
            f"catalog ${spot_gpu:.2f}/GPU-h{rng}",
            abs(article_spot / gpus - spot_gpu) < 0.05 * spot_gpu,
        ),
        _check(
            "spot discount",
            f"-{p['spot_saving_pct']:.0%}",
            f"catalog -{fmt_pct(discount)} ({found.name} typical{disc_rng})",
            abs(discount - p["spot_saving_pct"]) < 0.01,
        ),
    ]


def _chinchilla_example_checks(found: Instance) -> list[Check]:
    """The Chinchilla example's dollars: its budget converts at 8 GPUs per instance-hour, but
    its cost prices single-GPU hours at the whole 8-GPU instance's rate."""
    p = PUBLISHED
    budget, rate = p["chinchilla_example_budget"], p["chinchilla_example_spot_per_hour"]
    gpus = p["chinchilla_example_gpus"]
    gpu_flops = p["chinchilla_example_peak_flops"] * p["chinchilla_example_mfu"]  # FLOP/s
    flops = budget / rate * 3600 * gpus * gpu_flops
    gpu_hours = flops / gpu_flops / 3600
    cost = gpu_hours * rate
    doc_flops = p["chinchilla_example_docstring_flops"]
    doc_cost = doc_flops / gpu_flops / 3600 * rate / gpus
    checks = [
        _check(
            "Chinchilla example: FLOPs its $50K budget buys",
            f"{_flops(flops)} FLOP",
            f"{fmt_dollars(budget)} / ${rate:.2f}/h x {gpus} GPUs x 3,600 s x "
            f"{p['chinchilla_example_peak_flops'] / 1e12:g} TFLOP/s x "
            f"{p['chinchilla_example_mfu']:.0%} = {_flops(flops)} FLOP",
            True,
        ),
        _check(
            "Chinchilla example: cost of those FLOPs",
            f"a {fmt_dollars(budget)} budget",
            f"it prices {gpu_hours:,.0f} single-GPU hours at the whole {gpus}-GPU instance's "
            f"${rate:.2f}/h: {fmt_dollars(cost)}, {cost / budget:.0f}x the budget; at "
            f"${rate / gpus:.2f}/GPU-h it is {fmt_dollars(gpu_hours * rate / gpus)}",
            abs(cost - budget) < 0.01 * budget,
        ),
        _check(
            "Chinchilla example: docstring '1e21 for ~$50K on A100s'",
            f"{_flops(doc_flops)} FLOP for ~{fmt_dollars(budget)}",
            f"its own conversion gives {_flops(flops)} FLOP for {fmt_dollars(budget)}, "
            f"{flops / doc_flops:.1f}x more; {_flops(doc_flops)} FLOP costs {fmt_dollars(doc_cost)}",
            abs(flops - doc_flops) < 0.05 * flops,
        ),
    ]
    if found.spot_range is not None and found.name.startswith("p4d"):
        low, high = found.spot_range
        checks.append(
            _check(
                "Chinchilla example: p4d spot price",
                f"${rate:.2f}/h",
                f"catalog range ${low:.2f}-${high:.2f}/h ({found.name})",
                low <= rate <= high,
            )
        )
    return checks


def _flops(value: float) -> str:
    """1.371e22 -> '1.37e22', the way the article writes FLOP counts."""
    return f"{value:.3g}".replace("e+", "e")


def _check(claim: str, published: str, recomputed: str, agrees: bool) -> Check:
    return Check(claim, published, recomputed, bool(agrees))


def _saving_check(claim: str, saving: str, before: str, after: str) -> Check:
    """A published saving in dollars against its own before and after (keys of PUBLISHED)."""
    p = PUBLISHED
    return _check(
        claim,
        fmt_dollars(p[saving]),
        fmt_dollars(p[before] - p[after]),
        p[saving] == p[before] - p[after],
    )


def _pct_check(claim: str, published: float, recomputed: float) -> Check:
    """Percentages agree when they match to the article's rounding (one percentage point)."""
    return _check(
        claim, f"{published:.0%}", fmt_pct(recomputed), abs(published - recomputed) < 0.01
    )


# --- as printed ----------------------------------------------------------------------------------


def print_case_study(out: Console, study: CaseStudy) -> None:
    """The case study per year (the period its yearly figures fix), then each published claim."""
    cat, art = study.catalog_levers, study.article_levers
    period = cat.period
    out.print(
        "[bold]The '$50K -> $18K' case study[/bold]: 8 A100 x 72 h per run, 2 runs a month "
        "(24 a year), on-demand -> spot, BF16 72 -> 48 h, larger batch 48 -> 40 h, early "
        "stopping of 4 of the 24 yearly runs at 60%.\n"
        f"Recomputed at {escape(study.instance)}: {fmt_dollars(cat.baseline)} -> "
        f"{fmt_dollars(cat.final)} per {period} (-{fmt_pct(cat.saving_pct)}); at the article's "
        f"own prices {fmt_dollars(art.baseline)} -> {fmt_dollars(art.final)} per {period} "
        f"(-{fmt_pct(art.saving_pct)}); the article prints {_published_change('annual')} per "
        f"year and, in its table, {_published_change('monthly')} per month.\n",
        soft_wrap=True,
    )
    out.print(levers_table(cat, f"Recomputed at the catalog price ({study.instance})"))
    out.print(levers_table(art, "Recomputed at the article's own implied prices"))
    table = Table(title="Published figures, line by line")
    for column in ("claim", "published", "recomputed", "verdict"):
        table.add_column(column)
    for c in study.checks:
        verdict = "agrees" if c.agrees else "[bold red]DISAGREES[/]"
        table.add_row(escape(c.claim), escape(c.published), escape(c.recomputed), verdict)
    out.print(table)
    out.print(f"[bold]{len(study.disagreements)} disagreements:[/bold]")
    for line in study.disagreements:
        out.print(f"- {escape(line)}", soft_wrap=True)
    out.print()
    print_assumptions(out, study.assumptions)


def _published_change(period: str) -> str:
    """The article's own before -> after for `period` ('annual' or 'monthly'), e.g. for the
    case study's headline: '$905,952 -> $436,800 (-51.8%)'."""
    before, after = PUBLISHED[f"{period}_before"], PUBLISHED[f"{period}_after"]
    return f"{fmt_dollars(before)} -> {fmt_dollars(after)} (-{fmt_pct(1 - after / before)})"
