"""A `thrifty sweep` --out as report sections: every trial's validation curve on one chart (a
pruned trial's ending where it stopped, marked, and the best trial's drawn bold), the trials
table, the best trial and the command that runs it, Optuna's parameter importances, and what
each trial cost with what pruning saved.

Reads sweep.json as `runs.load_sweep` checked it (thrifty.search.sweep.results.sweep_record), never
the sweep itself: a sweep can be reported without Optuna, long after it ran.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from thrifty.plan.units import fmt_usd
from thrifty.reporting.charts import PALETTE, Chart, Series
from thrifty.reporting.figures import Figure, fmt_seconds
from thrifty.reporting.runs import Sweep
from thrifty.reporting.series import number

STATES = ("complete", "pruned", "failed", "running", "waiting")
BEST_COLOR, OTHER_COLORS = PALETTE[0], PALETTE[1:]
STOPPED = ("pruned", "failed")  # the states whose curve ends early, marked where it stopped
FENCE = 3.0  # a trial diverged: its lowest loss is above Q3 + FENCE × IQR of the trials' lowest
ROW, LABEL_WIDTH, BAR_WIDTH, VALUE_WIDTH = 26, 150, 700, 230  # pixels of the bar charts
SAVED_OPACITY = 0.3
NO_PRICE = (
    "No dollars: the sweep's config had no price (set [cost] instance or usd_per_gpu_hour), so "
    "compute is counted in seconds."
)


def trials(sweep: Sweep) -> list[dict[str, Any]]:
    """The trials, by number."""
    return sorted(sweep.data.get("trials") or [], key=lambda t: t["number"])


def best(sweep: Sweep) -> dict[str, Any] | None:
    """sweep.json's best trial (number, value, params); None before any trial finished."""
    found = sweep.data.get("best")
    return found if isinstance(found, dict) and isinstance(found.get("number"), int) else None


def _best_number(sweep: Sweep) -> int | None:
    found = best(sweep)
    return None if found is None else int(found["number"])


def counts(sweep: Sweep) -> dict[str, int]:
    """How many trials are in each state (the known states first, then any other)."""
    states = [str(t.get("state") or "unknown") for t in trials(sweep)]
    known = {s: states.count(s) for s in STATES}
    return {**known, **{s: states.count(s) for s in states if s not in known}}


def _table(value: Any) -> dict[str, Any]:
    """`value` where it is a table (the checked sweep.json keeps nulls), else {}."""
    return value if isinstance(value, dict) else {}


def _loss(value: Any, spec: str = ".4g") -> str:
    found = number(value)
    return "-" if found is None else format(found, spec)


def _param(value: Any) -> str:
    """A parameter's value, short: floats to four significant figures."""
    if isinstance(value, float):
        return format(value, ".4g")
    return value if isinstance(value, str) else json.dumps(value)


def _exact(value: Any) -> str:
    """A parameter's value as the trial ran it."""
    return value if isinstance(value, str) else json.dumps(value)


def _params(params: Any) -> str:
    """A trial's parameters on one line: "optimizer.lr=0.0284, batch.micro=16"."""
    if not isinstance(params, dict) or not params:
        return "-"
    return ", ".join(f"{name}={_param(value)}" for name, value in params.items())


# --------------------------------------------------------------------------------------------
# The headline


def headline(sweep: Sweep) -> list[Figure]:
    """The study, its trials by state, the best loss, compute, what pruning saved, dollars."""
    d = sweep.data
    found, top = counts(sweep), best(sweep)
    others = ", ".join(f"{n} {state}" for state, n in found.items() if n and state != "complete")
    compute = _table(d.get("compute"))
    seconds, unpruned, saved = (
        number(compute.get(k)) for k in ("seconds", "unpruned_seconds", "saved_seconds")
    )
    usd, saved_usd = number(compute.get("cost")), number(compute.get("saved_cost"))
    return [
        Figure("study", str(d.get("study") or sweep.name), str(d.get("objective") or "")),
        Figure("trials", f"{found['complete']} of {sum(found.values())}", others or "complete"),
        Figure(
            "best loss",
            _loss((top or {}).get("value")),
            "no trial finished yet" if top is None else f"trial {top['number']}",
        ),
        Figure("compute", fmt_seconds(seconds), f"of {fmt_seconds(unpruned)} unpruned"),
        _saving_figure(saved, unpruned),
        Figure("dollars", fmt_usd(usd), _dollars_note(usd, saved_usd)),
        Figure("budget", str(d.get("budget") or "none")),
    ]


def _saving_figure(saved: float | None, unpruned: float | None) -> Figure:
    """What pruning saved against the unpruned sweep, or what it cost more when negative."""
    if saved is not None and saved < 0:
        return Figure("pruning cost more", fmt_seconds(-saved), _share(-saved, unpruned, "more"))
    return Figure("pruning saved", fmt_seconds(saved), _share(saved, unpruned, "of the compute"))


def _dollars_note(usd: float | None, saved_usd: float | None) -> str:
    if usd is None:
        return "no price: set [cost]"
    if saved_usd is not None and saved_usd < 0:
        return f"{fmt_usd(-saved_usd)} more for pruning"
    return f"{fmt_usd(saved_usd)} saved by pruning"


def _share(part: float | None, whole: float | None, what: str) -> str:
    if part is None or not whole:
        return ""
    return f"{part / whole:.1%} {what}"


# --------------------------------------------------------------------------------------------
# The curves


def curves_chart(sweep: Sweep) -> Chart:
    """One validation-loss line per trial that reported one: a pruned (or failed) trial's
    ends where it stopped, with a cross there; the best is drawn last, bold."""
    top = _best_number(sweep)
    drawn = [t for t in trials(sweep) if t.get("curve")]
    ordered = [t for t in drawn if t["number"] != top] + [t for t in drawn if t["number"] == top]
    series = []
    for index, trial in enumerate(ordered):
        is_best = trial["number"] == top
        series.append(
            Series(
                _series_name(trial, is_best),
                tuple((float(s), v) for s, v in trial["curve"]),
                color=BEST_COLOR if is_best else OTHER_COLORS[index % len(OTHER_COLORS)],
                dashed=trial.get("state") == "pruned",
                bold=is_best,
                stop=_stop_tip(trial),
            )
        )
    cap = y_cap([[v for _, v in t["curve"]] for t in drawn])
    return Chart(
        id="curves",
        title="Validation loss of every trial",
        y_label="validation loss",
        series=tuple(series),
        from_zero=False,
        y_max=cap,
        note=_curves_note(sweep, drawn, top, cap),
    )


def _series_name(trial: dict[str, Any], is_best: bool) -> str:
    state = str(trial.get("state") or "")
    if is_best:
        return f"trial {trial['number']} (best)"
    return f"trial {trial['number']}" + (f" ({state})" if state != "complete" else "")


def _stop_tip(trial: dict[str, Any]) -> str:
    """The cross's tooltip for a trial that stopped early; "" for one that did not."""
    state = trial.get("state")
    if state not in STOPPED:
        return ""
    pruned = _table(trial.get("pruned"))
    step = pruned.get("step")
    step = trial["curve"][-1][0] if step is None else step
    why = pruned.get("reason") if state == "pruned" else trial.get("error")
    return f"trial {trial['number']} {state} at step {step}" + (f": {why}" if why else "")


def y_cap(curves: Sequence[Sequence[float]]) -> float | None:
    """Where the curves' y axis ends when some trials diverged, so that they do not flatten the
    rest: at the highest point of the others. A trial diverged when even its lowest loss lies
    far above the other trials' (above the third quartile plus FENCE times the interquartile
    range of the trials' lowest losses; at least four trials). None when none diverged."""
    finite = [[v for v in curve if math.isfinite(v)] for curve in curves]
    finite = [curve for curve in finite if curve]
    if len(finite) < 4:
        return None
    lowest = [min(curve) for curve in finite]
    low, _, high = statistics.quantiles(lowest, n=4)
    fence = high + FENCE * (high - low)
    if all(min(curve) <= fence for curve in finite):
        return None
    return max(v for curve in finite if min(curve) <= fence for v in curve)


def _curves_note(
    sweep: Sweep, drawn: list[dict[str, Any]], top: int | None, cap: float | None
) -> str:
    parts = []
    if top is not None:
        parts.append(f"Bold: the best trial ({top}).")
    if any(t.get("state") == "pruned" for t in drawn):
        parts.append("Dashed: pruned; ✕ where a trial stopped.")
    if cap is not None:
        above = [t for t in drawn if any(v > cap for _, v in t["curve"])]
        names = ", ".join(
            f"trial {t['number']} (up to {max(v for _, v in t['curve']):.4g})" for t in above
        )
        parts.append(
            f"The y axis ends near {cap:.3g}, the other trials' highest loss: {names} diverged, "
            "drawn on its top edge above that."
        )
    missing = [str(t["number"]) for t in trials(sweep) if not t.get("curve")]
    if missing:
        parts.append(f"No validation loss reported yet by trial(s) {', '.join(missing)}.")
    return " ".join(parts)


def curves_html(sweep: Sweep, anchor: str = "") -> str:
    chart = curves_chart(sweep)
    if not chart.has_data:
        return '<p class="muted">No trial has reported a validation loss yet.</p>'
    return chart.html(anchor)


# --------------------------------------------------------------------------------------------
# The trials table


def trials_table(sweep: Sweep) -> tuple[list[str], list[list[str]]]:
    """One row per trial: number (★ the best), state, loss, steps, seconds, dollars, its
    parameters, and for one that stopped early where and why."""
    top = _best_number(sweep)
    header = ["trial", "state", "loss", "steps", "seconds", "USD", "parameters"]
    header += ["stopped at step", "why"]
    rows = []
    for t in trials(sweep):
        pruned = _table(t.get("pruned"))
        steps = "-" if t.get("steps") is None else str(t["steps"])
        if t.get("state") == "pruned" and t.get("end_step") is not None:
            steps += f" of {t['end_step']}"
        why = ""
        if t.get("state") == "pruned":
            why = f"{pruned['pruner']}: " if pruned.get("pruner") else ""
            why += str(pruned.get("reason") or "")
        elif t.get("error"):
            why = str(t["error"])
        rows.append(
            [
                f"{t['number']}{' ★' if t['number'] == top else ''}",
                str(t.get("state") or "-"),
                _loss(t.get("value")),
                steps,
                fmt_seconds(number(t.get("seconds"))),
                fmt_usd(number(t.get("cost"))),
                _params(t.get("params")),
                str(pruned.get("step", "")) if t.get("state") == "pruned" else "",
                why,
            ]
        )
    return header, rows


# --------------------------------------------------------------------------------------------
# The best trial


def best_html(sweep: Sweep) -> str:
    """The best trial, its parameters exactly, and the command that trains with them."""
    top = best(sweep)
    if top is None:
        return '<p class="muted">No best trial yet: no trial has finished.</p>'
    params = _table(top.get("params"))
    items = "".join(
        f"<li><code>{escape(str(name))}</code> = {escape(_exact(value))}</li>"
        for name, value in params.items()
    )
    toml = sweep.path / "best.toml"
    command = f"thrifty train {toml}"
    parts = [
        f'<p data-best="{top["number"]}">Trial {top["number"]}: validation loss '
        f"<b>{escape(_loss(top.get('value'), '.6g'))}</b></p>",
        f'<ul class="plain">{items}</ul>' if items else "",
        f"<p><code>{escape(command)}</code> runs it: best.toml is the sweep's config with these "
        "parameters set.</p>",
    ]
    if not toml.is_file():
        parts.append(
            f'<p class="note">{escape(str(toml))} is not there: thrifty sweep writes it beside '
            "sweep.json when the sweep's config is in its study.</p>"
        )
    run_dir = next((t.get("run_dir") for t in trials(sweep) if t["number"] == top["number"]), None)
    if run_dir:
        parts.append(
            f'<p class="note">Its run directory: {escape(str(run_dir))} (thrifty report '
            f"{escape(str(run_dir))} draws it).</p>"
        )
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Bars: the importances, and each trial's cost


@dataclass(frozen=True, slots=True)
class Bar:
    """One row of a bar chart: `value` drawn solid from zero, then `extra` drawn light after it
    (what a pruned trial would have gone on to use), both in `color`; `text` is shown to the
    right. `bold`: the row to look at (the best trial), its label bold, its bar in BEST_COLOR."""

    label: str
    value: float
    extra: float = 0.0
    text: str = ""
    bold: bool = False
    color: str = "#868e96"


def bars_svg(name: str, title: str, bars: Sequence[Bar]) -> str:
    """Horizontal bars from zero, one row each, on one scale."""
    top = max((b.value + b.extra for b in bars), default=0.0) or 1.0
    width, height = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH, ROW * len(bars) + 8
    parts = [
        f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" '
        f'data-chart="{escape(name)}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>{escape(title)}</title>"
    ]
    for i, bar in enumerate(bars):
        y = 4 + i * ROW
        end = LABEL_WIDTH + bar.value / top * BAR_WIDTH
        after = end + bar.extra / top * BAR_WIDTH
        color = BEST_COLOR if bar.bold else bar.color
        weight = ' font-weight="700"' if bar.bold else ""
        parts.append(
            f'<g class="bar" data-label="{escape(bar.label)}" data-value="{bar.value:.10g}" '
            f'data-extra="{bar.extra:.10g}">'
            f'<text x="{LABEL_WIDTH - 8}" y="{y + 17}" text-anchor="end"{weight}>'
            f"{escape(bar.label)}</text>"
            f'<rect x="{LABEL_WIDTH}" y="{y + 4}" width="{max(1.0, end - LABEL_WIDTH):.1f}" '
            f'height="{ROW - 8}" rx="3" fill="{color}"><title>{escape(bar.text)}</title></rect>'
        )
        if bar.extra > 0:
            parts.append(
                f'<rect class="saved" x="{end:.1f}" y="{y + 4}" width="{after - end:.1f}" '
                f'height="{ROW - 8}" rx="3" fill="{color}" fill-opacity="{SAVED_OPACITY}">'
                f"<title>{escape(bar.text)}</title></rect>"
            )
        parts.append(f'<text x="{after + 6:.1f}" y="{y + 17}">{escape(bar.text)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)


# --------------------------------------------------------------------------------------------
# Importances


def importances_html(sweep: Sweep) -> str:
    """Optuna's parameter importances as bars, largest first; or why there are none."""
    if "importances" not in sweep.data:
        return '<p class="muted">sweep.json holds no parameter importances.</p>'
    found = sweep.data["importances"]
    shares = sorted(
        ((str(k), s) for k, raw in (found or {}).items() if (s := number(raw)) is not None),
        key=lambda pair: -pair[1],
    )
    if found is None or not shares:
        finished = counts(sweep)["complete"]
        return (
            '<p class="muted" data-no-importances>No parameter importances: Optuna needs at '
            "least two finished trials with different parameters, and this sweep has "
            f"{finished} finished.</p>"
        )
    bars = [Bar(name, share, text=f"{share:.1%}", color=BEST_COLOR) for name, share in shares]
    caption = "Parameter importances (Optuna, fANOVA)"
    note = (
        "Each parameter's share of how much the validation loss varied across the "
        f"{counts(sweep)['complete']} finished trials."
    )
    return (
        f'<figure class="chart" id="chart-importances"><figcaption>{escape(caption)}'
        f"</figcaption>{bars_svg('importances', caption, bars)}"
        f'<p class="note">{escape(note)}</p></figure>'
    )


# --------------------------------------------------------------------------------------------
# Cost and what pruning saved


def priced(sweep: Sweep) -> bool:
    """Whether the sweep's trials had a price (its compute has dollars)."""
    compute = sweep.data.get("compute")
    return isinstance(compute, dict) and number(compute.get("cost")) is not None


def cost_bars(sweep: Sweep) -> list[Bar]:
    """Each trial's dollars (seconds without a price), and for a pruned one what running it to
    its last step would have added: the part pruning saved."""
    money = priced(sweep)
    spent_key, whole_key = ("cost", "unpruned_cost") if money else ("seconds", "unpruned_seconds")
    amount = fmt_usd if money else fmt_seconds
    top = _best_number(sweep)
    bars = []
    for t in trials(sweep):
        spent = number(t.get(spent_key))
        whole = number(t.get(whole_key))
        extra = max(0.0, whole - spent) if spent is not None and whole is not None else 0.0
        text = amount(spent) + (f", {amount(extra)} saved by pruning" if extra > 0 else "")
        bars.append(Bar(f"trial {t['number']}", spent or 0.0, extra, text, bold=t["number"] == top))
    return bars


def compute_html(sweep: Sweep) -> str:
    """Each trial's cost as bars, then what the trials used, what every trial run to its end
    would have used, and what pruning saved, in seconds and (with a price) in dollars."""
    money = priced(sweep)
    parts = []
    bars = cost_bars(sweep)
    if bars:
        caption = f"Cost per trial ({'USD' if money else 'seconds'})"
        legend = (
            '<div class="legend"><span class="key"><i style="border:5px solid #868e96;'
            'width:10px"></i>used</span><span class="key"><i style="border:5px solid '
            f'rgba(134,142,150,{SAVED_OPACITY});width:10px"></i>saved by pruning (what running '
            "it to its last step would have added)</span></div>"
        )
        parts.append(
            f'<figure class="chart" id="chart-trial-cost"><figcaption>{escape(caption)}'
            f"</figcaption>{bars_svg('trial-cost', caption, bars)}{legend}</figure>"
        )
    compute = sweep.data.get("compute")
    if not isinstance(compute, dict):
        parts.append('<p class="muted">sweep.json holds no compute figures.</p>')
        return "".join(parts)
    lines = [_saving_line(compute, "seconds", fmt_seconds, "used")]
    if money:
        lines.append(_saving_line(compute, "cost", fmt_usd, "cost"))
    lines.append(_startups_line(compute))
    items = "".join(f"<li>{escape(line)}</li>" for line in lines)
    parts.append(f'<ul class="plain" data-compute>{items}</ul>')
    if not money:
        parts.append(f'<p class="note" data-no-price>{escape(NO_PRICE)}</p>')
    return "".join(parts)


def _startups_line(compute: dict[str, Any]) -> str:
    """What the comparison counts: the start-ups the sessions paid, against one per trial."""
    sessions, startups = number(compute.get("sessions")), number(compute.get("startup_seconds"))
    line = (
        "Every trial run to its last step means each run once, in a process of its own: one "
        "start-up per trial"
    )
    if sessions is not None and startups is not None:
        line += f"; the trials' {sessions:.0f} sessions paid {fmt_seconds(startups)} of start-ups"
    estimated = number(compute.get("estimated_trials"))
    if estimated:
        line += (
            f"; {estimated:.0f} trial(s) without measured sessions are counted at their step "
            "time, evaluations left out"
        )
    return line + "."


def _saving_line(
    compute: dict[str, Any], key: str, amount: Callable[[float | None], str], verb: str
) -> str:
    """ "The trials used 1 min 40 s; every trial run to its last step would have used
    1 min 46 s: pruning saved 6.04 s (5.7%)." (`key`: seconds or cost); "pruning cost 6.04 s
    more (5.7%)" when the trials paid more than that."""
    spent, whole, saved = (number(compute.get(k)) for k in (key, f"unpruned_{key}", f"saved_{key}"))
    line = f"The trials {verb} {amount(spent)}"
    if whole is not None:
        line += f"; every trial run to its last step would have {verb} {amount(whole)}"
    if saved is not None and saved < 0:
        line += f": pruning cost {amount(-saved)} more" + (
            f" ({-saved / whole:.1%})" if whole else ""
        )
    elif saved is not None:
        line += f": pruning saved {amount(saved)}" + (f" ({saved / whole:.1%})" if whole else "")
    return line + "."
