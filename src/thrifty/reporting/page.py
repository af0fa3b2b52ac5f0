"""The report as one self-contained HTML page: inline CSS, charts as inline SVG, no script,
no font or image fetched from anywhere.

Each section is a <section data-section="NAME"> (headline, loss, throughput, breakdown,
system, cost, diagnosis, ranks; tune and waterfall for a tune; headline, curves, trials, best,
importances and compute for a sweep; compare for several runs), so the page can be checked
section by section. A section with nothing to show says why.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable, Sequence
from html import escape
from typing import Any

from thrifty.reporting import figures as fig
from thrifty.reporting import series as ser
from thrifty.reporting import sweeps, tunes
from thrifty.reporting.charts import MARK_NAMES, Chart
from thrifty.reporting.runs import Run, Sweep, Tune
from thrifty.rundir.own_files import REPORT_MARK

log = logging.getLogger("thrifty")

RUN_SECTIONS = ("headline", "loss", "throughput", "breakdown", "system", "cost", "diagnosis")
SWEEP_SECTIONS = ("headline", "curves", "trials", "best", "importances", "compute")
TITLES = {
    "headline": "Headline",
    "loss": "Loss",
    "throughput": "Throughput and MFU",
    "breakdown": "Step time",
    "system": "System",
    "cost": "Dollars",
    "diagnosis": "Diagnosis",
    "ranks": "Per-rank figures",
    "tune": "Tuning trials",
    "waterfall": "Waterfall",
    "compare": "Runs compared",
    "ledger": "Ledger: spend and savings",
    "curves": "Validation curves",
    "trials": "Trials",
    "best": "Best trial",
    "importances": "Parameter importances",
    "compute": "Cost per trial, and what pruning saved",
}

CSS = """
:root{--fg:#1f2328;--muted:#656d76;--line:#d8dee4;--bg:#f6f8fa;--card:#fff;--accent:#2563eb}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,
sans-serif;color:var(--fg);background:var(--bg)}
main{max-width:1180px;margin:0 auto;padding:20px 24px 40px}
header h1{font-size:22px;margin:0 0 2px}
header p{margin:0;color:var(--muted);font-size:13px;word-break:break-all}
nav{display:flex;flex-wrap:wrap;gap:4px 14px;margin:12px 0 0;font-size:13px}
nav a{color:var(--accent);text-decoration:none}
h2.run{font-size:19px;margin:30px 0 0;padding-top:8px;border-top:2px solid var(--line)}
section{background:var(--card);border:1px solid var(--line);border-radius:8px;
padding:16px 20px;margin:14px 0}
section>h2{font-size:16px;margin:0 0 12px}
.tiles{display:grid;grid-template-columns:repeat(auto-fill,minmax(160px,1fr));gap:10px}
.tile{border:1px solid var(--line);border-radius:6px;padding:8px 12px;background:#fbfcfd}
.tile .label{font-size:11px;color:var(--muted);text-transform:uppercase;letter-spacing:.04em}
.tile .value{font-size:20px;font-weight:600;font-variant-numeric:tabular-nums;
overflow-wrap:anywhere}
.tile .detail{font-size:12px;color:var(--muted)}
.cols{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:18px}
.small{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:14px}
figure{margin:0}
figcaption{font-weight:600;font-size:13px;margin-bottom:4px}
svg{width:100%;height:auto;display:block}
svg text{font-size:11px;fill:#57606a}
svg .grid line{stroke:#edf0f3}
svg .grid line.axis,svg .grid line.tick{stroke:#8c959f}
svg text.label{fill:#424a53}
#chart-waterfall svg text{font-size:13px}
.compare table{width:auto;min-width:60%}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--muted);margin-top:4px}
.key i{display:inline-block;width:18px;height:0;margin-right:5px;vertical-align:middle}
.note,.muted{color:var(--muted);font-size:12.5px}
table{border-collapse:collapse;width:100%;font-size:13px;font-variant-numeric:tabular-nums;
margin:6px 0}
th,td{padding:5px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{font-weight:600;color:#424a53;background:#f6f8fa}
.scroll{overflow-x:auto}
h3{font-size:14px;margin:14px 0 6px}
ol.recs li{margin:0 0 8px}
.bottleneck{display:inline-block;padding:2px 10px;border-radius:12px;background:#fff4e6;
color:#d9480f;font-weight:600}
ul.plain{margin:6px 0;padding-left:18px}
"""


def render_page(items: Sequence[Run | Tune | Sweep], now: datetime.datetime | None = None) -> str:
    """The whole page for the runs, tunes and sweeps given, in order; with several runs, a
    comparison of them comes first."""
    runs = [i for i in items if isinstance(i, Run)]
    several = len(items) > 1
    body: list[str] = []
    if len(runs) > 1:
        body.append(compare_section(runs))
        body.append(ledger_section(runs))
    for index, item in enumerate(items, 1):
        anchor = f"r{index}-" if several else ""
        if several:
            body.append(f'<h2 class="run" id="{anchor}top">{escape(item.name)}</h2>')
        if isinstance(item, Tune):
            body += tune_sections(item, anchor)
        elif isinstance(item, Sweep):
            body += sweep_sections(item, anchor)
        else:
            body += run_sections(item, anchor)
    title = "thrifty report: " + ", ".join(i.name for i in items)
    stamp = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d %H:%M UTC")
    paths = " · ".join(escape(str(i.path)) for i in items)
    links = "".join(f'<a href="#{s}">{TITLES[s]}</a>' for s in _nav(items))
    if several:
        links += "".join(
            f'<a href="#r{i}-top">{escape(t.name)}</a>' for i, t in enumerate(items, 1)
        )
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">{REPORT_MARK}'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>"
        f"<header><h1>{escape(title)}</h1><p>{paths} · written {stamp}</p>"
        f"<nav>{links}</nav></header>{''.join(body)}</main></body></html>\n"
    )


def _nav(items: Sequence[Run | Tune | Sweep]) -> list[str]:
    if len(items) > 1:
        return ["compare", "ledger"] if sum(isinstance(i, Run) for i in items) > 1 else []
    run = items[0]
    if isinstance(run, Tune):
        return ["headline", "tune", "waterfall"]
    if isinstance(run, Sweep):
        return list(SWEEP_SECTIONS)
    ranks = _drawn(run, TITLES["ranks"], lambda: fig.stragglers(run))
    return [*RUN_SECTIONS, *(["ranks"] if ranks else [])]


def section(name: str, content: str, anchor: str = "") -> str:
    return (
        f'<section id="{anchor}{name}" data-section="{name}">'
        f"<h2>{TITLES[name]}</h2>{content}</section>"
    )


# --------------------------------------------------------------------------------------------
# One run


def run_sections(run: Run, anchor: str = "") -> list[str]:
    charts = _drawn(run, "the charts", lambda: ser.run_charts(run)) or {}
    builders: list[tuple[str, Callable[[], str]]] = [
        ("headline", lambda: tiles(fig.headline(run)) + notes_list(run)),
        ("loss", lambda: _chart(charts, "loss", anchor) + events_table(run)),
        (
            "throughput",
            lambda: (
                f'<div class="cols">{_chart(charts, "throughput", anchor)}'
                f"{_chart(charts, 'mfu', anchor)}</div>"
            ),
        ),
        ("breakdown", lambda: _chart(charts, "breakdown", anchor) + phases_table(run)),
        ("system", lambda: system_content(run, charts, anchor)),
        ("cost", lambda: _chart(charts, "cost", anchor) + cost_lines(run)),
        ("diagnosis", lambda: diagnosis_content(run)),
    ]
    parts = [section(name, _content(run, name, build), anchor) for name, build in builders]
    ranks = _drawn(run, TITLES["ranks"], lambda: fig.stragglers(run))
    if ranks is not None:

        def per_rank() -> str:
            drawn = "".join(c.html(anchor) for c in ser.rank_charts(run) if c.has_data)
            return (f'<div class="cols">{drawn}</div>' if drawn else "") + table(*ranks)

        parts.append(section("ranks", _content(run, "ranks", per_rank), anchor))
    return parts


def _content(item: Run | Tune | Sweep | str, name: str, build: Callable[[], str]) -> str:
    content = _drawn(item, TITLES[name], build)
    if content is not None:
        return str(content)
    return (
        f'<p class="muted">{escape(TITLES[name])}: left out, a value in its files is not what '
        "thrifty writes (see the warning thrifty report printed).</p>"
    )


def _drawn(item: Run | Tune | Sweep | str, what: str, build: Callable[[], Any]) -> Any:
    """`build()`; None, with a warning naming the part, when a value in the files of `item`
    (a run, a tune, or where they are) is not of the type it should be: a part of the page
    left out, never a failed report."""
    try:
        return build()
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError) as exc:
        log.warning(
            "%s: %s left out of the report: a value in its files is not what thrifty "
            "writes (%s: %s)",
            item if isinstance(item, str) else item.path,
            what,
            type(exc).__name__,
            exc,
        )
        return None


def notes_list(run: Run | Sweep) -> str:
    """What was left out of the run's (or sweep's) files, and why: damaged lines, fields of the
    wrong type."""
    if not run.notes:
        return ""
    items = "".join(f"<li>{escape(note)}</li>" for note in run.notes)
    return f'<ul class="plain note" data-notes>{items}</ul>'


WHY_EMPTY = {
    "loss": "No loss recorded.",
    "throughput": "No step was timed.",
    "mfu": "No MFU: the run's FLOPs per step or the device's peak are unknown.",
    "breakdown": "No breakdown: measure.breakdown was off.",
    "cost": "No dollars: the run had no price (set [cost] instance or usd_per_gpu_hour).",
}


def _chart(charts: dict[str, Chart], key: str, anchor: str) -> str:
    chart = charts.get(key)
    if chart is None:
        return f'<p class="muted">{WHY_EMPTY[key]}</p>'
    return chart.html(anchor)


def tiles(figures: Sequence[fig.Figure]) -> str:
    cells = "".join(
        f'<div class="tile"><div class="label">{escape(f.label)}</div>'
        f'<div class="value">{escape(f.value)}</div>'
        f'<div class="detail">{escape(f.detail) or "&nbsp;"}</div></div>'
        for f in figures
    )
    return f'<div class="tiles">{cells}</div>'


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def events_table(run: Run) -> str:
    """What happened along the way: the events, then the saves in one row."""
    marks = sorted(ser.run_marks(run), key=lambda m: m.x)
    rows = [
        (f"{m.x:g}", MARK_NAMES.get(m.kind, "event"), m.label)
        for m in marks
        if m.kind != "checkpoint"
    ]
    if run.checkpoints:
        saved = ", ".join(str(s) for s in run.checkpoints)
        rows.append(("", "checkpoints", f"saved at steps {saved}"))
    if not rows:
        return '<p class="note">No resume, rollback or checkpoint save recorded.</p>'
    return table(("step", "what", "detail"), rows)


def phases_table(run: Run) -> str:
    """The mean seconds per step of each phase and its share of the step."""
    mean = ser.mean_phases(run)
    if not mean:
        return ""
    total = sum(mean.values()) or 1.0
    rows = [
        (p.replace("_", " "), f"{s * 1e3:,.2f} ms", f"{s / total:.0%}") for p, s in mean.items()
    ]
    return table(("phase", "mean per step", "share"), rows)


def system_content(run: Run, charts: dict[str, Chart], anchor: str) -> str:
    found = ser.system_figures(run)
    if not found:
        return '<p class="muted">No system sampling: measure.system was off, or psutil is not installed.</p>'
    rows = [
        (
            f.name,
            f"{fig.fmt_figure(f.mean)} {f.unit}",
            f"± {fig.fmt_figure(f.swing)} {f.unit}",
            f"{fig.fmt_figure(f.low)} – {fig.fmt_figure(f.high)} {f.unit}",
        )
        for f in found
    ]
    small = "".join(
        charts[f"system-{f.key}"].html(anchor) for f in found if f"system-{f.key}" in charts
    )
    note = '<p class="note">Swing: the standard deviation of the samples within each logging interval, averaged.</p>'
    return (
        table(("metric", "mean", "swing", "range of interval means"), rows)
        + note
        + f'<div class="small">{small}</div>'
    )


def cost_lines(run: Run) -> str:
    """Spent, the projection, the on-demand counterfactual and the work thrown away."""
    lines = []
    cost = (run.summary or {}).get("cost")
    last = next((r["cost"] for r in reversed(run.steps) if isinstance(r.get("cost"), dict)), None)
    if isinstance(cost, dict):
        lines.append(
            f"spent {fig.fmt_usd(ser.number(cost.get('usd')))} at {cost.get('pricing')} ({cost.get('source')})"
        )
        if ser.number(cost.get("gpu_hours")) is not None:
            lines.append(f"{cost['gpu_hours']:,.4g} GPU-hours on {cost.get('gpus')} GPU(s)")
        if ser.number(cost.get("on_demand_usd")) is not None and cost.get("pricing") != "on-demand":
            lines.append(f"on-demand would have cost {fig.fmt_usd(cost['on_demand_usd'])}")
        if cost.get("redone_steps"):
            lines.append(
                f"{fig.fmt_usd(ser.number(cost.get('wasted_usd')))} of it paid for {cost['redone_steps']} steps a preemption threw away"
            )
    elif isinstance(last, dict):
        lines.append(f"spent {fig.fmt_usd(ser.number(last.get('usd')))} so far")
    projected = (last or {}).get("projected")
    if isinstance(projected, dict) and not run.finished:
        lines.append(
            f"projected {fig.fmt_usd(ser.number(projected.get('total_usd')))} at the end of the budget"
        )
    if not lines:
        return ""
    return '<ul class="plain">' + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>"


def diagnosis_content(run: Run) -> str:
    d = run.diagnosis
    if d is None:
        return '<p class="muted">No diagnosis.json: it is written when the run ends.</p>'
    parts = [
        f'<p>Bottleneck: <span class="bottleneck">{escape(str(d.get("bottleneck", "-")).replace("_", " "))}</span></p>'
    ]
    recs = [r for r in d.get("recommendations") or [] if isinstance(r, dict)]
    if recs:
        items = "".join(
            f"<li>{escape(str(r.get('text', '')))}"
            + (
                f'<br><span class="note">expected: {escape(str(r["expected"]))}</span>'
                if r.get("expected")
                else ""
            )
            + "</li>"
            for r in recs
        )
        parts.append(
            f'<h3>Recommendations, in the order to try them</h3><ol class="recs">{items}</ol>'
        )
    evidence = [str(e) for e in d.get("evidence") or [] if e is not None]
    if evidence:
        parts.append(
            '<h3>Evidence</h3><ul class="plain">'
            + "".join(f"<li>{escape(e)}</li>" for e in evidence)
            + "</ul>"
        )
    guard = d.get("guard")
    guard = guard if isinstance(guard, dict) else {}
    if guard.get("skipped_steps") or guard.get("rollbacks") or guard.get("diverged"):
        parts.append(f'<p class="note">guard: {escape(_guard_text(guard))}</p>')
    return "".join(parts)


def _guard_text(guard: dict[str, Any]) -> str:
    parts = []
    if guard.get("skipped_steps"):
        parts.append(f"{guard['skipped_steps']} non-finite steps skipped")
    for r in [r for r in guard.get("rollbacks") or [] if isinstance(r, dict)]:
        parts.append(
            f"rolled back {r.get('from_step')} → {r.get('to_step')} ({r.get('steps_lost')} steps lost)"
        )
    if guard.get("diverged"):
        parts.append(f"diverged: {guard['diverged']}")
    return "; ".join(parts)


# --------------------------------------------------------------------------------------------
# Several runs, and a tune


def compare_section(runs: list[Run]) -> str:
    def compared() -> str:
        header, rows = fig.comparison(runs)
        charts = [ser.loss_chart(runs), ser.throughput_chart(runs), ser.cost_chart(runs)]
        drawn = "".join(
            dataclasses.replace(c, size="half").html("compare-") for c in charts if c.has_data
        )
        return f'<div class="compare">{table(header, rows)}</div><div class="cols">{drawn}</div>'

    where = ", ".join(str(r.path) for r in runs)
    return section("compare", _content(where, "compare", compared))


def ledger_section(runs: list[Run]) -> str:
    """The runs as `thrifty runs` counts them (relaunches of one job together), their spend
    over time stacked by run, and what they saved beside it."""
    from thrifty.errors import ThriftyError
    from thrifty.ledger.book import read_ledger
    from thrifty.reporting import ledger

    def counted() -> str:
        try:
            jobs = read_ledger([str(r.path) for r in runs]).jobs
        except ThriftyError as exc:
            return f'<p class="muted">{escape(str(exc))}</p>'
        names = [j.name for j in jobs]
        charts = [ledger.spend_chart(jobs, names), ledger.savings_chart(jobs)]
        drawn = "".join(c.html("ledger-") for c in charts if c.has_data)
        return table(ledger.HEADER, ledger.ledger_rows(jobs)) + f'<div class="cols">{drawn}</div>'

    where = ", ".join(str(r.path) for r in runs)
    return section("ledger", _content(where, "ledger", counted))


def tune_sections(tune: Tune, anchor: str = "") -> list[str]:
    def trials() -> str:
        header, rows = tunes.trials_table(tune)
        notes = "".join(f"<li>{escape(n)}</li>" for n in tunes.tune_notes(tune))
        winner = tune.data.get("winner_toml")
        run_it = (
            f'<p class="note">winner written to {escape(str(winner))}: thrifty train '
            f"{escape(str(winner))}</p>"
            if winner
            else ""
        )
        return table(header, rows) + run_it + f'<ul class="plain note">{notes}</ul>'

    return [
        section(
            "headline", _content(tune, "headline", lambda: tiles(tunes.tune_headline(tune))), anchor
        ),
        section("tune", _content(tune, "tune", trials), anchor),
        section(
            "waterfall", _content(tune, "waterfall", lambda: tunes.waterfall_html(tune)), anchor
        ),
    ]


def sweep_sections(sweep: Sweep, anchor: str = "") -> list[str]:
    """A sweep's sections (SWEEP_SECTIONS), each drawn from its checked sweep.json."""
    builders: list[tuple[str, Callable[[], str]]] = [
        ("headline", lambda: tiles(sweeps.headline(sweep)) + notes_list(sweep)),
        ("curves", lambda: sweeps.curves_html(sweep, anchor)),
        ("trials", lambda: table(*sweeps.trials_table(sweep))),
        ("best", lambda: sweeps.best_html(sweep)),
        ("importances", lambda: sweeps.importances_html(sweep)),
        ("compute", lambda: sweeps.compute_html(sweep)),
    ]
    return [section(name, _content(sweep, name, build), anchor) for name, build in builders]
