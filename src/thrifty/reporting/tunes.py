"""A `thrifty tune` --out as a report section: the trials table, the waterfall from the config
as given to the winner (drawn as bars, each lever with its paired speed-up and interval), the
paired comparisons, what was pruned or not reached, and the notes.

Reads tune.json (thrifty.search.tune.report.result_dict), so a tune can be reported long after it
ran, without its config or its task importable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from thrifty.plan.units import fmt_usd
from thrifty.reporting.figures import Figure, fmt_seconds
from thrifty.reporting.runs import Tune
from thrifty.reporting.series import number

ROW, LABEL_WIDTH, BAR_WIDTH, VALUE_WIDTH = 34, 200, 700, 180  # pixels
PER = {"tokens": "$/M tokens", "samples": "$/k samples"}


@dataclass(frozen=True, slots=True)
class Bar:
    """One row of the waterfall: from `start` to `end` in the waterfall's unit; `kind` is
    "total" (the baseline, the end) or "lever" (the saving one lever made)."""

    label: str
    start: float
    end: float
    kind: str
    detail: str = ""


def waterfall_bars(waterfall: dict[str, Any]) -> list[Bar]:
    """The baseline, each lever's step down, and where they end."""
    bars = [Bar("config as given", 0.0, float(waterfall["baseline"]), "total")]
    for step in waterfall.get("steps") or []:
        bars.append(
            Bar(
                str(step["lever"]),
                float(step["after"]),
                float(step["before"]),
                "lever",
                str(step.get("detail") or ""),
            )
        )
    bars.append(Bar("winner", 0.0, float(waterfall["final"]), "total"))
    return bars


def waterfall_svg(waterfall: dict[str, Any]) -> str:
    """Horizontal bars: totals from zero, each lever the part of the cost it took away."""
    bars = waterfall_bars(waterfall)
    money = waterfall.get("unit") == "USD"
    top = max(b.end for b in bars) or 1.0
    height = ROW * len(bars) + 8
    width = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH
    parts = [
        f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="waterfall" '
        f'data-chart="waterfall" xmlns="http://www.w3.org/2000/svg"><title>From the config as '
        "given to the winner, lever by lever</title>"
    ]
    for i, bar in enumerate(bars):
        y = 4 + i * ROW
        x0 = LABEL_WIDTH + bar.start / top * BAR_WIDTH
        x1 = LABEL_WIDTH + bar.end / top * BAR_WIDTH
        color = "#2563eb" if bar.kind == "total" else "#0f9d58"
        value = (
            _amount(bar.end, money)
            if bar.kind == "total"
            else f"−{_amount(bar.end - bar.start, money)}"
        )
        if bar.kind == "lever" and bar.end:
            value += f" ({(bar.end - bar.start) / bar.end:.0%})"
        tip = escape(f"{bar.label}: {bar.detail}" if bar.detail else f"{bar.label}: {value}")
        parts.append(
            f'<g class="bar bar-{bar.kind}" data-start="{bar.start:g}" data-end="{bar.end:g}">'
            f'<text x="{LABEL_WIDTH - 8}" y="{y + 20}" text-anchor="end">{escape(bar.label)}</text>'
            f'<rect x="{x0:.1f}" y="{y + 4}" width="{max(1.0, x1 - x0):.1f}" height="{ROW - 10}" '
            f'rx="3" fill="{color}"><title>{tip}</title></rect>'
            f'<text x="{x1 + 6:.1f}" y="{y + 20}">{escape(value)}</text></g>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _amount(value: float, money: bool) -> str:
    return fmt_usd(value) if money else fmt_seconds(value * 3600)


def table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def tune_headline(tune: Tune) -> list[Figure]:
    d = tune.data
    trials = d.get("trials") or []
    finished = sum(1 for t in trials if t.get("status") == "ok")
    speedup = number(d.get("speedup"))
    found = d.get("comparisons") or []
    final: dict[str, Any] = next((c for c in found if c.get("stage") == "final"), {})
    against = "over the config as given"
    if final and d.get("winner") == d.get("baseline"):
        against = (
            f"{final.get('candidate')} re-measured {_speedup(final)}: the config as given kept"
        )
    elif final:
        against = f"re-measured {_speedup(final)} paired {against}"
    return [
        Figure(
            "config", str(d.get("config") or "-").rsplit("/", 1)[-1], str(d.get("device") or "")
        ),
        Figure("trials", f"{finished} of {len(trials)}", "finished"),
        Figure("winner", str(d.get("winner") or "none"), d.get("failure") or ""),
        Figure("speed-up", "-" if speedup is None else f"{speedup:.2f}×", against),
        Figure("effective batch", str(d.get("effective_batch") or "-")),
        Figure(
            "search time",
            fmt_seconds(number(d.get("wall_seconds"))),
            f"of {fmt_seconds(number(d.get('budget_seconds')))}",
        ),
    ]


def trials_table(tune: Tune) -> tuple[list[str], list[list[str]]]:
    """One row per trial: its setting as run ("auto" values resolved), then its figures."""
    d = tune.data
    unit = d.get("unit") or "tokens"
    priced = bool((d.get("price") or {}).get("pricing"))
    header = [
        "trial",
        "precision",
        "checkpointing",
        "micro",
        "compile",
        "workers",
        f"{unit}/s",
        "peak memory",
        "MFU",
    ]
    header += [PER.get(unit, "$ per unit"), "job $"] if priced else ["job time"]
    rows = []
    for t in d.get("trials") or []:
        rows.append(_trial_row(t, t.get("name") == d.get("winner"), unit, priced))
    return header, rows


def _trial_row(t: dict[str, Any], best: bool, unit: str, priced: bool) -> list[str]:
    s = t.get("setting") or {}
    accumulation = f" × {t['accumulation_steps']}" if t.get("accumulation_steps") else ""
    policy = s.get("activation_checkpointing.policy", "-")
    cells = [
        f"{t.get('name')}{' ★' if best else ''}",
        str(t.get("precision") or s.get("precision.mode", "-")),
        ",".join(policy) if isinstance(policy, list) else str(policy),
        f"{t.get('micro_batch') or s.get('batch.micro', '-')}{accumulation}",
        str(s.get("compile.mode", "-")),
        str(
            t.get("num_workers")
            if t.get("num_workers") is not None
            else s.get("data.num_workers", "-")
        ),
    ]
    if t.get("status") != "ok":
        return [*cells, str(t.get("status")), *(["-"] * (4 if priced else 3))]
    rate, memory, mfu = (
        number(t.get(f"{unit}_per_second")),
        number(t.get("peak_memory_bytes")),
        number(t.get("mfu")),
    )
    cells += [
        "-" if rate is None else f"{rate:,.1f}",
        "-" if memory is None else f"{memory / 2**30:,.2f} GiB",
        "-" if mfu is None else f"{mfu:.1%}",
    ]
    if priced:
        return [*cells, fmt_usd(number(t.get("usd_per_unit"))), fmt_usd(number(t.get("job_usd")))]
    return [*cells, fmt_seconds(number(t.get("job_seconds")))]


def tune_notes(tune: Tune) -> list[str]:
    """Failed trials, what was pruned or not reached, the waterfall's assumptions, the notes."""
    d = tune.data
    lines = [
        f"{t.get('name')} {t.get('status')}: {t.get('error')}"
        for t in d.get("trials") or []
        if t.get("status") != "ok" and t.get("error")
    ]
    for skipped in (d.get("pruned") or []) + (d.get("not_reached") or []):
        lines.append(
            f"{skipped.get('kind', '').replace('_', ' ')}: {skipped.get('stage')}: {skipped.get('reason')}"
        )
    water = d.get("waterfall") or {}
    lines += [f"assumed: {a}" for a in water.get("assumptions") or []]
    lines += [str(n) for n in d.get("notes") or []]
    return lines


def waterfall_html(tune: Tune) -> str:
    """The waterfall figure (or one line saying why there is none), then the paired
    comparisons its speed-ups come from."""
    return _waterfall_figure(tune.data.get("waterfall")) + comparisons_html(tune)


def _waterfall_figure(water: dict[str, Any] | None) -> str:
    if not water:
        return '<p class="muted">No waterfall: the config as given did not finish, or no trial did.</p>'
    if not water.get("steps"):
        return '<p class="muted">No lever beat the config as given: no waterfall.</p>'
    period = water.get("period") or "run"
    unit = "dollars" if water.get("unit") == "USD" else "hours"
    saving = number(water.get("saving_pct"))
    caption = f"From the config as given to the winner, lever by lever ({unit} per {period})"
    if saving is not None:
        caption += f": {saving:.0%} less"
    money = water.get("unit") == "USD"
    measured = {str(s.get("lever")): s.get("measured") for s in water["steps"]}
    rows = [
        (b.label, b.detail or "-", _speedup(measured.get(b.label)), _amount(b.end - b.start, money))
        for b in waterfall_bars(water)
        if b.kind == "lever"
    ]
    header = ("lever", "what it changed", "speed-up (90% interval)", "saving")
    return (
        f'<figure class="chart" id="chart-waterfall"><figcaption>{escape(caption)}</figcaption>'
        f"{waterfall_svg(water)}</figure>" + table(header, rows)
    )


def comparisons_html(tune: Tune) -> str:
    """One row per paired comparison: what against what, its ratio and interval, its rounds,
    its decision and the line that says it."""
    found = tune.data.get("comparisons") or []
    if not found:
        return ""
    rows = [
        (
            f"{c.get('candidate')} vs {c.get('incumbent')}",
            _speedup(c),
            str(c.get("rounds", "-")),
            str(c.get("decision", "-")),
            str(c.get("line", "")),
        )
        for c in found
    ]
    header = ("comparison", "ratio (90% interval)", "rounds", "decision", "why")
    return "<h3>Paired comparisons</h3>" + table(header, rows)


def _speedup(figures: Any) -> str:
    """ "1.18× (1.10–1.27)", "-" without figures."""
    if not isinstance(figures, dict):
        return "-"
    ratio, low, high = (number(figures.get(k)) for k in ("ratio", "low", "high"))
    if ratio is None:
        return "-"
    interval = f" ({low:.2f}–{high:.2f})" if low is not None and high is not None else ""
    return f"{ratio:.2f}×{interval}"
