"""The "$50K -> $18K" training-cost case study, recomputed from its stated inputs.

The article: a ranking model trained on 8 A100 GPUs for 72 hours per run at AWS on-demand
prices, then moved to spot, BF16 (72 -> 48 h), a larger batch made possible by gradient
checkpointing (48 -> 40 h) and early stopping of 4 of 24 monthly runs at 60% of their runtime.
Its published dollar figures are checked here against each other and against a dated catalog
price, line by line. Every number below is computed from PUBLISHED, none is typed in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from thrifty.plan.catalog import Catalog, Instance, load_catalog
from thrifty.plan.levers import LeverInputs, LeverPlan, apply_levers
from thrifty.plan.units import fmt_dollars, fmt_pct

DEFAULT_INSTANCE = "p4d.24xlarge@v7"
NEWER_INSTANCE = "p4d.24xlarge"

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
    "runs_per_month_text": 2,
    "runs_per_month_table": 24,
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
    "chinchilla_example_spot_per_hour": 9.83,
}


@dataclass(frozen=True, slots=True)
class Check:
    """One published claim against what its own inputs or the catalog give."""

    claim: str
    published: str
    recomputed: str
    agrees: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class CaseStudy:
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
            "catalog_levers": self.catalog_levers.as_dict(),
            "article_levers": self.article_levers.as_dict(),
            "checks": [asdict(c) for c in self.checks],
            "disagreements": self.disagreements,
            "assumptions": self.assumptions,
        }


def _levers(on_demand: float, spot: float | None) -> LeverPlan:
    p = PUBLISHED
    return apply_levers(
        LeverInputs(
            hours_per_run=p["hours"],
            on_demand_per_hour=on_demand,
            runs=p["runs_per_month_table"],
            spot_per_hour=spot,
            precision_speedup=p["hours"] / p["bf16_hours"],
            microbatch_speedup=p["bf16_hours"] / p["batch_hours"],
            early_stopped_runs=p["early_stopped_runs"],
            early_stop_fraction=p["early_stop_at"],
            period="month",
        )
    )


def case_study(
    instance: str | Instance = DEFAULT_INSTANCE, *, catalog: Catalog | None = None
) -> CaseStudy:
    """Recompute the case study lever by lever at `instance`'s dated catalog price (8 GPUs)."""
    catalog = catalog or load_catalog()
    found = catalog.instance(instance)
    newer = catalog.instances.get(NEWER_INSTANCE)
    p = PUBLISHED
    # The article's own hourly rates for the 8-GPU fleet, implied by its per-run figures.
    article_od = p["on_demand_per_run"] / p["hours"]
    article_spot = p["spot_per_run"] / p["hours"]
    fleet = p["gpus"] / found.gpu_count  # instances needed for 8 GPUs
    od = found.on_demand_per_hour * fleet
    spot = found.spot_per_hour * fleet if found.spot_per_hour is not None else None
    checks = _internal_checks(article_spot) + _catalog_checks(
        found, fleet, newer, article_od, article_spot
    )
    return CaseStudy(
        instance=found.name,
        price_source=found.dated_source,
        catalog_levers=_levers(od, spot),
        article_levers=_levers(article_od, article_spot),
        checks=checks,
        assumptions=[
            f"catalog price: {found.name} ${found.on_demand_per_hour:.2f}/h on-demand, "
            f"spot ${found.spot_per_hour or 0:.2f}/h (midpoint of the listed range); "
            f"{found.dated_source}",
            f"{p['runs_per_month_table']} runs per month, as the article's early-stopping line and "
            "table assume (its text says two)",
            "article prices: the hourly rates its per-run figures imply "
            f"(${article_od:,.2f}/h on-demand, ${article_spot:,.2f}/h spot for 8 GPUs)",
            "no interruption overhead on spot: the article states none",
        ],
    )


def _internal_checks(article_spot: float) -> list[Check]:
    """The article's figures against each other: one entry per published claim (data, not logic)."""
    p = PUBLISHED
    chain = p["spot_per_run"] * p["bf16_hours"] / p["hours"] * p["batch_hours"] / p["bf16_hours"]
    whole_runs_h = p["early_stopped_runs"] * p["batch_hours"]
    at_60_h = whole_runs_h * (1 - p["early_stop_at"])
    monthly_from_annual = p["annual_after"] / 12
    return [
        _check(
            "spot saving $ = on-demand - spot",
            fmt_dollars(p["spot_saving"]),
            fmt_dollars(p["on_demand_per_run"] - p["spot_per_run"]),
            p["spot_saving"] == p["on_demand_per_run"] - p["spot_per_run"],
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
            f"({fmt_dollars(p['monthly_before'])} -> {fmt_dollars(p['monthly_after'])})",
            abs(p["per_run_saving_pct"] - p["monthly_saving_pct"]) < 0.01,
        ),
        _check(
            "runs per month",
            f"{p['runs_per_month_text']} (text: {fmt_dollars(p['monthly_before'])}"
            f" = 2 x {fmt_dollars(p['on_demand_per_run'])})",
            f"early stopping and the table use {p['runs_per_month_table']} runs per month",
            p["runs_per_month_text"] == p["runs_per_month_table"],
        ),
        _check(
            "monthly cost after the levers",
            f"{fmt_dollars(p['monthly_after'])} (table)",
            f"the annual {fmt_dollars(p['annual_after'])} / 12 = "
            f"{fmt_dollars(monthly_from_annual)}",
            abs(monthly_from_annual - p["monthly_after"]) < 0.01 * p["monthly_after"],
        ),
        _check(
            "annual before = 12 x monthly",
            fmt_dollars(p["annual_before"]),
            fmt_dollars(12 * p["monthly_before"]),
            p["annual_before"] == 12 * p["monthly_before"],
        ),
        _check(
            "annual saving",
            fmt_dollars(p["annual_saving"]),
            fmt_dollars(p["annual_before"] - p["annual_after"]),
            p["annual_saving"] == p["annual_before"] - p["annual_after"],
        ),
        _check(
            "early stopping: hours saved",
            f"'terminated at {p['early_stop_at']:.0%} runtime' = {at_60_h:g} h",
            f"the table drops whole runs (24 -> 20 runs x 40 h) = {whole_runs_h:g} h",
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
    rng = ""
    if found.spot_range is not None:
        low, high = found.spot_range
        rng = f" (range ${low / found.gpu_count:.2f}-${high / found.gpu_count:.2f})"
        hi_d, lo_d = 1 - low / found.on_demand_per_hour, 1 - high / found.on_demand_per_hour
        disc_rng = f", range {fmt_pct(lo_d)}-{fmt_pct(hi_d)}"
    else:
        disc_rng = ""
    checks += [
        _check(
            "spot price implied by $13,512 per run",
            f"${article_spot / gpus:.2f}/GPU-h",
            f"catalog ${spot_gpu:.2f}/GPU-h{rng}",
            abs(article_spot / gpus - spot_gpu) < 0.05 * spot_gpu,
        ),
        _check(
            "spot discount",
            f"-{p['spot_saving_pct']:.0%}",
            f"catalog -{fmt_pct(discount)} ({found.name} midpoint{disc_rng})",
            abs(discount - p["spot_saving_pct"]) < 0.01,
        ),
    ]
    if found.spot_range is not None:
        low, high = found.spot_range
        example = p["chinchilla_example_spot_per_hour"]
        checks.append(
            _check(
                "p4d spot price in the article's Chinchilla example",
                f"${example:.2f}/h",
                f"catalog range ${low:.2f}-${high:.2f}/h ({found.name})",
                low <= example <= high,
            )
        )
    return checks


def _check(claim: str, published: str, recomputed: str, agrees: bool) -> Check:
    return Check(claim, published, recomputed, bool(agrees))


def _pct_check(claim: str, published: float, recomputed: float) -> Check:
    """Percentages agree when they match to the article's rounding (one percentage point)."""
    return _check(
        claim, f"{published:.0%}", fmt_pct(recomputed), abs(published - recomputed) < 0.01
    )
