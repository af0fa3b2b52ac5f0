"""`thrifty plan fit`: fit L(N, D) = E + A/N^alpha + B/D^beta to your own runs.

    thrifty plan fit PATH... [--budget-flops C | --budget-gpu-hours H | --budget-dollars USD]
        [--instance NAME | --gpu NAME] [--mfu F] [--bootstrap N] [--seed S] [--robust]
        [--out FIT.json] [--json]

It prints the fitted constants with their bootstrap intervals beside the published fits
(Hoffmann et al. 2022, Epoch AI's replication), approach 2's exponent where the runs form
IsoFLOP groups, and for a budget the compute-optimal N*, D*, tokens per parameter and loss with
their intervals and how far they reach beyond the fitted runs, and the runs that drive the fit
(leaving each out moves the optimum's exponent most). Progress goes to stderr. `--out` saves the fit for
`thrifty plan --budget-flops C --fit FIT.json`. Registering imports neither torch nor rich.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thrifty.commands.plan.options import (
    BUDGET_DOLLARS,
    BUDGET_FLOPS,
    BUDGET_GPU_HOURS,
    DTYPES,
    FRACTION,
)
from thrifty.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from thrifty.plan.chinchilla import Allocation
    from thrifty.plan.lawfit import Influence, ScalingFit
    from thrifty.plan.lawpredict import Prediction

DEFAULT_RESAMPLES = 1000  # thrifty.plan.lawfit.DEFAULT_RESAMPLES, without importing it here
MIN_RESAMPLES, MAX_RESAMPLES = 20, 100_000  # thrifty.plan.lawfit's
FIT_FILE = "scaling-fit.json"  # thrifty.plan.lawfile.FIT_FILE
KEEP = argparse.SUPPRESS  # an option `plan` also has: a value given before `fit` stays


def register_fit(commands: argparse._SubParsersAction) -> None:
    """Add `fit` under `thrifty plan`."""
    fit = commands.add_parser(
        "fit",
        help="fit a scaling law L(N, D) to your own runs",
        description="Fit L(N, D) = E + A/N^alpha + B/D^beta to your own runs (Chinchilla's "
        "approach 3 as Besiroglu et al. 2024 corrected it: Huber loss on log L, L-BFGS from a "
        "grid of starts, bootstrap intervals), compare it with the published fits and, for a "
        "budget, give the compute-optimal size with intervals and its reach beyond your runs.",
    )
    fit.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="a CSV file with columns params,tokens,loss; a run directory (summary.json); a "
        "sweep directory (trials/NNNN/); or a folder of runs, searched 3 levels deep",
    )
    _budget_options(fit)
    fit.add_argument(
        "--bootstrap",
        type=_resamples,
        default=DEFAULT_RESAMPLES,
        metavar="N",
        help=f"bootstrap resamples for the intervals (default {DEFAULT_RESAMPLES}; "
        f"{MIN_RESAMPLES} to {MAX_RESAMPLES:,}); the time grows with runs x resamples",
    )
    fit.add_argument(
        "--robust",
        action="store_true",
        help="leave out the runs whose residual in ln L lies over 3 scaled MADs from the "
        "median, and fit again on the rest (the runs left out are named)",
    )
    fit.add_argument(
        "--seed", type=int, default=0, metavar="S", help="seed of the resampling (default 0)"
    )
    fit.add_argument(
        "--out",
        metavar="FIT.json",
        help="save the fit as JSON for 'thrifty plan --fit FIT.json' (default: print only); "
        f"saved as {FIT_FILE} in a folder of runs, 'thrifty plan --fit FOLDER' finds it",
    )
    fit.add_argument(
        "--catalog",
        metavar="FILE",
        default=KEEP,
        help="TOML file adding to or overriding the built-in catalog (a budget in GPU-hours or USD)",
    )
    fit.add_argument("--json", action="store_true", default=KEEP, help="print JSON, not tables")
    fit.set_defaults(handler=_run_fit)


def _budget_options(fit: argparse.ArgumentParser) -> None:
    """`plan`'s budget options, kept when given before `fit` (KEEP)."""
    budget = fit.add_argument_group("a budget to plan (optional)")
    which = budget.add_mutually_exclusive_group()
    which.add_argument(
        "--budget-flops", type=BUDGET_FLOPS, metavar="C", default=KEEP, help="in FLOPs"
    )
    which.add_argument(
        "--budget-gpu-hours",
        type=BUDGET_GPU_HOURS,
        metavar="H",
        default=KEEP,
        help="in GPU-hours (needs --gpu or --instance)",
    )
    which.add_argument(
        "--budget-dollars",
        type=BUDGET_DOLLARS,
        metavar="USD",
        default=KEEP,
        help="in USD (needs --instance)",
    )
    budget.add_argument("--instance", metavar="NAME", default=KEEP, help="catalog instance")
    budget.add_argument("--gpu", metavar="NAME", default=KEEP, help="catalog GPU (no price)")
    budget.add_argument("--dtype", choices=DTYPES, default=KEEP, help="compute dtype (bf16)")
    budget.add_argument(
        "--mfu", type=FRACTION, metavar="F", default=KEEP, help="model FLOPs utilization (0.35)"
    )
    budget.add_argument(
        "--pricing", choices=("on-demand", "spot"), default=KEEP, help="for dollars (on-demand)"
    )


def _resamples(text: str) -> int:
    """--bootstrap: a whole number of resamples from MIN_RESAMPLES to MAX_RESAMPLES."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not (value.is_integer() and MIN_RESAMPLES <= value <= MAX_RESAMPLES):
        raise argparse.ArgumentTypeError(
            f"bootstrap must be at least {MIN_RESAMPLES} resamples and at most "
            f"{MAX_RESAMPLES:,}, a whole number (the fit's time grows with runs x resamples), "
            f"got {text!r}"
        )
    return int(value)


def _run_fit(args: argparse.Namespace) -> int:
    from thrifty.console import console, say, to_json
    from thrifty.plan.chinchilla import FIT_NAMES, chinchilla
    from thrifty.plan.lawfile import check_out, save_fit
    from thrifty.plan.lawfit import fit_as_dict, fit_scaling_law
    from thrifty.plan.lawpoints import read_points
    from thrifty.plan.lawpredict import predict

    found = read_points(args.paths)
    flops, notes = _budget(args)  # bad input is refused before the fit's seconds
    if args.out is not None:
        check_out(args.out)
    fit = fit_scaling_law(
        found.points,
        resamples=args.bootstrap,
        seed=args.seed,
        sources=found.sources,
        notes=found.notes,
        robust=args.robust,
        progress=lambda line: say("plan fit", line),
    )
    if args.out is not None:  # before predicting: a fit with no optimum is still worth keeping
        saved = save_fit(fit, args.out)
        say("plan fit", f"saved the fit to {saved}; use it: thrifty plan --fit {saved} ...")
    prediction = predict(fit, flops) if flops is not None else None
    others = [chinchilla(flops, fit=f) for f in FIT_NAMES] if flops is not None else []
    if args.json:
        data: dict[str, Any] = {"fit": fit_as_dict(fit)}
        if prediction is not None:
            data["chinchilla"] = allocation_dict("fitted", fit, prediction, others, notes)
        print(to_json(data))
        return 0
    out = console()
    out.print(constants_table(fit))
    print_fit_notes(out, fit)
    if prediction is not None:
        out.print(allocation_table("fitted (chosen)", prediction, others))
        print_prediction_notes(out, fit, prediction, notes)
    return 0


def _budget(args: argparse.Namespace) -> tuple[float | None, list[str]]:
    """The budget in FLOPs (None: no budget given) and how it was converted, as `plan` does."""
    from thrifty.commands.plan.options import budget_from_args
    from thrifty.plan.catalog import load_catalog

    given = (args.budget_flops, args.budget_gpu_hours, args.budget_dollars)
    if all(v is None for v in given):
        return None, []
    return budget_from_args(
        args, None if args.budget_flops is not None else load_catalog(args.catalog)
    )


def own_fit(text: str) -> tuple[ScalingFit, str]:
    """`--fit FILE` (a saved fit) or `--fit DIR` (its scaling-fit.json if it has one, else the
    runs in it, fitted now with the defaults), and the short label its table row gets."""
    from thrifty.console import say
    from thrifty.plan import lawfit
    from thrifty.plan.lawfile import load_fit
    from thrifty.plan.lawfit import fit_scaling_law
    from thrifty.plan.lawpoints import read_points

    path = Path(text)  # labels are short (a table cell); the fit's source has the whole path
    if path.is_dir():
        if (path / FIT_FILE).exists():  # load_fit refuses anything but a regular file
            return load_fit(str(path / FIT_FILE)), f"{path.name}/{FIT_FILE}"
    elif path.exists():
        return load_fit(text), path.name
    else:
        raise ConfigError(f"--fit {text}: no such file or folder")
    found = read_points([text])
    fitted = fit_scaling_law(
        found.points,
        resamples=lawfit.DEFAULT_RESAMPLES,
        sources=found.sources,
        notes=found.notes,
        progress=lambda line: say("plan", line),
    )
    return fitted, f"{path.name}/ (fitted now)"


# --- tables -------------------------------------------------------------------------------------


def _g(value: float) -> str:
    return f"{value:.4g}"


def _with(value: str, interval: tuple[float, float], fmt: Any) -> str:
    return f"{value} [{fmt(interval[0])}, {fmt(interval[1])}]"


def constants_table(fit: ScalingFit) -> Table:
    """The fitted constants with their intervals, beside Epoch AI's and Hoffmann's."""
    from thrifty.console import Table
    from thrifty.plan.chinchilla import FITS
    from thrifty.plan.lawfit import LAW

    table = Table(title=f"Fitted {LAW} ({fit.points} runs)")
    share = f"{fit.confidence:.0%} interval"
    for column in ("constant", "fitted", share, "epoch", "hoffmann"):
        table.add_column(column, justify="left" if column in ("constant", share) else "right")
    published = [FITS["epoch"], FITS["hoffmann"]]
    for name in ("E", "A", "B", "alpha", "beta"):
        low, high = fit.interval(name)
        cells = [_g(getattr(c, name)) for c in published]
        table.add_row(name, _g(getattr(fit.law, name)), f"[{_g(low)}, {_g(high)}]", *cells)
    low, high = fit.interval("exponent")
    exponents = [_g(c.beta / (c.alpha + c.beta)) for c in published]
    row = ("a: N* ~ C^a", _g(fit.exponent), f"[{_g(low)}, {_g(high)}]", *exponents)
    table.add_row(*row, style="bold")
    return table


def _line(out: Console, label: str, text: str) -> None:
    from rich.markup import escape

    out.print(f"  [dim]{label}:[/dim] {escape(text)}", soft_wrap=True)


def print_fit_notes(out: Console, fit: ScalingFit) -> None:
    """What the fit saw and how it was made, then approach 2 beside approach 3."""
    from thrifty.plan.lawfit import METHOD
    from thrifty.plan.units import fmt_count

    r = fit.ranges
    _line(
        out,
        "runs",
        f"{fit.points} (N {fmt_count(r.params[0])} to {fmt_count(r.params[1])}, D "
        f"{fmt_count(r.tokens[0])} to {fmt_count(r.tokens[1])}, 6*N*D {r.flops[0]:.3g} to "
        f"{r.flops[1]:.3g}, loss {r.loss[0]:.3g} to {r.loss[1]:.3g}) from {', '.join(fit.sources)}",
    )
    _line(out, "method", f"{METHOD}: {len(fit.samples)} resamples, seed {fit.seed}")
    for note in fit.notes:
        _line(out, "note", note)
    for driver in fit.influence:
        _line(out, "driven by", influence_line(fit, driver))
    iso = fit.isoflop
    if iso is None or iso.exponent is None:
        _line(out, "approach 2", f"not available: {iso.why if iso else 'no IsoFLOP groups'}")
    else:
        se = f" +- {iso.exponent_se:.3f}" if iso.exponent_se is not None else ""
        low, high = fit.interval("exponent")
        _line(
            out,
            "approach 2",
            f"IsoFLOP minima of {len(iso.used)} groups give N* ~ C^{iso.exponent:.3f}{se}; "
            f"approach 3 gives C^{fit.exponent:.3f} [{low:.3f}, {high:.3f}]; {fit.agreement()}",
        )
    out.print()


def influence_line(fit: ScalingFit, driver: Influence) -> str:
    """A run that drives the fit: what beta and the exponent a become without it."""
    return (
        f"{driver.source} (residual {driver.residual:+.3f} in ln L): without it beta "
        f"{fit.law.beta:.3f} -> {driver.beta:.3f}, a {fit.exponent:.3f} -> {driver.exponent:.3f}"
    )


def allocation_table(label: str, p: Prediction, others: list[Allocation]) -> Table:
    """The fitted law's N*, D*, D*/N* and loss with intervals, beside the published fits'."""
    from thrifty.console import Table
    from thrifty.plan.units import fmt_count

    table = Table(title=f"Compute-optimal allocation for {p.flops:.3g} FLOPs")
    table.add_column("fit", no_wrap=True)
    for column in ("parameters", "tokens", "tokens/param", "predicted loss", "6*N*D"):
        table.add_column(column, justify="right")

    def ratio(v: float) -> str:
        return f"{v:.1f}"

    def loss(v: float) -> str:
        return f"{v:.3f}"

    iv = p.intervals
    table.add_row(
        label,
        _with(fmt_count(p.params), iv["params"], fmt_count),
        _with(fmt_count(p.tokens), iv["tokens"], fmt_count),
        _with(ratio(p.tokens_per_param), iv["tokens_per_param"], ratio),
        _with(loss(p.loss), iv["loss"], loss),
        f"{6 * p.params * p.tokens:.3g}",
    )
    for a in others:
        table.add_row(
            a.fit,
            fmt_count(a.params),
            fmt_count(a.tokens),
            ratio(a.tokens_per_param),
            "-" if a.loss is None else loss(a.loss),
            f"{6 * a.params * a.tokens:.3g}",
        )
    return table


def print_prediction_notes(out: Console, fit: ScalingFit, p: Prediction, notes: list[str]) -> None:
    """The reach line, the warning past 100x, then the fit, the interval rule and the budget's
    notes."""
    _line(out, "reach", p.reach_line)
    if p.warning is not None:
        from rich.markup import escape

        out.print(f"  [bold]{escape(p.warning)}[/bold]", soft_wrap=True)
    for note in [fit_line(fit), *p.notes, *notes, "C = 6*N*D holds exactly: D* = C / (6*N*)"]:
        _line(out, "assumed", note)
    out.print()


def fit_line(fit: ScalingFit) -> str:
    """Which fit a prediction used: its source and the runs it was fitted to."""
    return f"fit: {fit.law.source} ({fit.points} runs from {', '.join(fit.sources) or '-'})"


def allocation_dict(
    label: str, fit: ScalingFit, p: Prediction, others: list[Allocation], notes: list[str]
) -> dict[str, Any]:
    """The prediction as `thrifty plan --json` gives a named fit's allocation, with intervals."""
    return {
        **p.as_dict(),
        "fit": label,
        "source": fit.law.source,
        "assumptions": [*p.notes, *notes, fit_line(fit)],
        "other_fits": [a.as_dict() for a in others],
    }
