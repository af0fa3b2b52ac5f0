"""Charts drawn as inline SVG from the data they are given: no script and no chart library, so
the report is one file that opens anywhere, offline.

A `Chart` holds its series (data coordinates: x is the optimizer step) and its marks; `svg()`
draws them. The root <svg> carries the mapping from data to pixels (`data-plot`: left, top,
width, height of the plot area in pixels; `data-x-domain`, `data-y-domain`: the data values at
its edges), so what is drawn can be read back: a polyline point (px, py) is the data point
x = x0 + (px - left) / width * (x1 - x0), y = y0 + (top + height - py) / height * (y1 - y0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from html import escape

# The viewBox of each size, in pixels: the page scales a chart to its column, so each size is
# about the width it is shown at and the text keeps one size across the page.
SIZES = {"wide": (1080, 280), "half": (530, 240), "small": (350, 170)}
LEFT, RIGHT, TOP, BOTTOM = 62, 14, 12, 34  # the plot area's margins, in pixels
MAX_POINTS = 800  # points drawn per series; longer series keep each bucket's extremes
DOT_POINTS = 60  # series this short get a dot (and a tooltip) at each point
PALETTE = ("#2563eb", "#e8590c", "#0f9d58", "#c2255c", "#7048e8", "#0c8599", "#b08900", "#495057")
MARK_COLORS = {
    "resumed": "#1c7ed6",
    "rollback": "#e03131",
    "checkpoint": "#495057",
    "event": "#ae3ec9",
}
MARK_NAMES = {"resumed": "resume", "rollback": "rollback", "checkpoint": "checkpoint"}
STOP_GLYPH = "✕"  # where a series stopped early (a pruned trial)


@dataclass(frozen=True, slots=True)
class Series:
    """One line (or one layer of a stacked chart): `points` are (x, y) in data units;
    `band`, when given, is (x, low, high) drawn as a shaded range behind the line. `bold`: the
    line to look at, drawn thicker; `stop`, when given, marks the line's last point with a
    cross (it stopped there early) and is the cross's tooltip."""

    name: str
    points: tuple[tuple[float, float], ...]
    color: str = ""
    dashed: bool = False
    band: tuple[tuple[float, float, float], ...] = ()
    bold: bool = False
    stop: str = ""


@dataclass(frozen=True, slots=True)
class Mark:
    """Something that happened at step `x`: a resume, a rollback, a checkpoint save or
    another event; `label` is its tooltip."""

    x: float
    kind: str
    label: str


@dataclass(frozen=True, slots=True)
class Chart:
    """A line chart (or, `stacked`, layers whose values add up) over the optimizer step.

    `y_format`: "number", "percent" (values are fractions) or "usd"; `from_zero`: the y axis
    starts at 0 (rates, dollars, seconds), else it fits the data (a loss). `y_max`, when given,
    is where the y axis ends at most: a value above it is drawn on the axis' top edge (its
    tooltip keeps the value), so one series far above the rest does not flatten them."""

    id: str
    title: str
    y_label: str
    series: tuple[Series, ...]
    marks: tuple[Mark, ...] = ()
    stacked: bool = False
    from_zero: bool = True
    y_format: str = "number"
    x_label: str = "step"
    note: str = ""
    size: str = "wide"
    y_max: float | None = None

    @property
    def has_data(self) -> bool:
        return any(s.points for s in self.series)

    def color(self, index: int) -> str:
        own = self.series[index].color
        return own or PALETTE[index % len(PALETTE)]

    def svg(self) -> str:
        return _draw(drawable(self))

    def html(self, anchor: str = "") -> str:
        """The chart in a <figure> (id `chart-<anchor><id>`), with its legend: the series,
        then the kinds of marks; the points too far out to draw are left out and said
        (`drawable`)."""
        return _figure(drawable(self), anchor)


def _figure(chart: Chart, anchor: str) -> str:
    """`Chart.html` of a chart that holds only drawable points."""
    items = [
        _legend_item(chart.color(i), s.name, s.dashed, chart.stacked)
        for i, s in enumerate(chart.series)
    ]
    kinds = {m.kind for m in chart.marks}
    items += [_mark_legend_item(k) for k in MARK_COLORS if k in kinds]
    if any(s.stop for s in chart.series):
        items.append(f'<span class="key"><b>{STOP_GLYPH}</b> stopped early</span>')
    note = f'<p class="note">{escape(chart.note)}</p>' if chart.note else ""
    return (
        f'<figure class="chart" id="chart-{escape(anchor + chart.id)}">'
        f"<figcaption>{escape(chart.title)}</figcaption>{_draw(chart)}"
        f'<div class="legend">{"".join(items)}</div>{note}</figure>'
    )


def _legend_item(color: str, name: str, dashed: bool, area: bool = False) -> str:
    style = "dashed" if dashed else "solid"
    swatch = f"border:5px solid {color};width:10px" if area else f"border-top:3px {style} {color}"
    return f'<span class="key"><i style="{swatch}"></i>{escape(name)}</span>'


def _mark_legend_item(kind: str) -> str:
    color, name = MARK_COLORS.get(kind, MARK_COLORS["event"]), MARK_NAMES.get(kind, "event")
    if kind in ("checkpoint", "event"):
        glyph = "▲" if kind == "checkpoint" else "◆"
        return f'<span class="key"><b style="color:{color}">{glyph}</b> {escape(name)}</span>'
    return _legend_item(color, name, True)


# --------------------------------------------------------------------------------------------
# Points too far out to draw

# A value this many times the chart's typical magnitude (its median, at least 1) is left out:
# a loss of 1e308 beside losses near 2 would flatten every other point onto the axis.
EXTREME_FACTOR = 1e12
# Past this, the axis' own arithmetic (a span, a tick's power of ten) overflows a float.
MAX_MAGNITUDE = 1e150
_SHOWN_EXAMPLES = 3


def drawable(chart: Chart) -> Chart:
    """`chart` without the points it cannot draw: not finite (NaN, ±infinity), or beyond its
    limit (`EXTREME_FACTOR` × its typical magnitude, `MAX_MAGNITUDE` at most); its note says
    how many were left out and the first few (series, step, value). In a stacked chart a step
    with any such layer is left out of every layer, so the layers still add up."""
    limit = _limit(chart)
    bad = [(s.name, x, y) for s in chart.series for x, y in s.points if not _fits(x, y, limit)]
    bands = sum(
        1 for s in chart.series for b in s.band if not all(_fits(b[0], v, limit) for v in b[1:])
    )
    if not bad and not bands:
        return chart
    gone = {x for _, x, _ in bad}
    series = tuple(
        replace(
            s,
            points=tuple(
                (x, y)
                for x, y in s.points
                if (x not in gone if chart.stacked else _fits(x, y, limit))
            ),
            band=tuple(b for b in s.band if all(_fits(b[0], v, limit) for v in b[1:])),
        )
        for s in chart.series
    )
    marks = tuple(m for m in chart.marks if _fits(m.x, 0.0, limit))
    return replace(chart, series=series, marks=marks, note=_left_out_note(chart, bad, limit))


def _limit(chart: Chart) -> float:
    values = sorted(abs(y) for s in chart.series for _, y in s.points if math.isfinite(y))
    typical = values[len(values) // 2] if values else 1.0
    return min(MAX_MAGNITUDE, EXTREME_FACTOR * max(typical, 1.0))


def _fits(x: float, y: float, limit: float) -> bool:
    return math.isfinite(x) and abs(x) <= MAX_MAGNITUDE and math.isfinite(y) and abs(y) <= limit


def _left_out_note(chart: Chart, bad: list[tuple[str, float, float]], limit: float) -> str:
    if not bad:
        return chart.note
    shown = ", ".join(f"{name} at step {x:g}: {y:g}" for name, x, y in bad[:_SHOWN_EXAMPLES]) + (
        ", …" if len(bad) > _SHOWN_EXAMPLES else ""
    )
    said = (
        f"{len(bad)} point{'s' if len(bad) > 1 else ''} left out, not finite or beyond "
        f"±{limit:.3g}, too far out to draw ({shown})."
    )
    return f"{chart.note} {said}" if chart.note else said


# Scales


@dataclass(frozen=True, slots=True)
class Scale:
    """Data values [lo, hi] onto pixels [start, start + size] (y: bottom to top)."""

    lo: float
    hi: float
    start: float
    size: float
    flip: bool = False

    def __call__(self, value: float) -> float:
        share = (value - self.lo) / (self.hi - self.lo)
        return self.start + (1 - share if self.flip else share) * self.size


def nice_ticks(lo: float, hi: float, count: int = 5, whole: bool = False) -> list[float]:
    """About `count` round values (1, 2, 2.5 or 5 times a power of ten apart) covering
    [lo, hi]; `whole`: whole numbers only (steps)."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = max((hi - lo) / max(1, count - 1), 1.0 if whole else 0.0)
    power = 10 ** math.floor(math.log10(raw))
    multiples = (1, 2, 5, 10) if whole and power < 10 else (1, 2, 2.5, 5, 10)
    step = next(m * power for m in multiples if m * power >= raw)
    first = math.floor(lo / step) * step
    ticks = []
    value = first
    while value < hi + step * 0.999:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _domains(chart: Chart) -> tuple[list[float], list[float]]:
    """The ticks of each axis; the first and last ticks are the axis' ends."""
    xs = [x for s in chart.series for x, _ in s.points] + [m.x for m in chart.marks]
    if chart.stacked:
        ys = [sum(v) for v in zip(*[[y for _, y in s.points] for s in chart.series], strict=True)]
    else:
        ys = [y for s in chart.series for _, y in s.points]
        ys += [v for s in chart.series for _, lo, hi in s.band for v in (lo, hi)]
    ys = [y for y in ys if math.isfinite(y)] or [0.0, 1.0]
    y_lo, y_hi = min(ys), max(ys)
    if chart.y_max is not None and y_lo < chart.y_max < y_hi:
        y_hi = chart.y_max
    if chart.from_zero:
        y_lo = min(0.0, y_lo)
    else:  # a little room above and below; around a lone value, a tenth of it
        pad = (y_hi - y_lo) * 0.05 or abs(y_hi) * 0.1 or 1.0
        # The room never crosses zero the data does not: a loss near 0 gets no negative axis.
        y_lo, y_hi = (y_lo - pad if y_lo - pad >= 0 or y_lo < 0 else 0.0), y_hi + pad
    x_ticks = nice_ticks(min(xs), max(xs), 7, whole=True) if xs else [0.0, 1.0]
    y_ticks = nice_ticks(y_lo, y_hi, 5)
    if chart.y_format == "percent" and y_hi <= 1.0 < y_ticks[-1]:
        # A share of a whole (utilization, MFU) ends at 100%, not at the round tick past it.
        y_ticks = [t for t in y_ticks if t < 1.0] + [1.0]
    return x_ticks, y_ticks


def fmt_value(value: float, style: str = "number") -> str:
    """A tick or tooltip value: "12%", "$0.0034", "1.2k", "5.53"."""
    if style == "percent":
        return f"{value * 100:.3g}%"
    if style == "usd":
        return f"${value:,.2f}" if abs(value) >= 10 else f"${value:.3g}"
    magnitude = abs(value)
    for suffix, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if magnitude >= scale * 10 or (suffix != "k" and magnitude >= scale):
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.4g}"


# --------------------------------------------------------------------------------------------
# Drawing


def _draw(chart: Chart) -> str:
    x_ticks, y_ticks = _domains(chart)
    full_width, full_height = SIZES[chart.size]
    width, height = full_width - LEFT - RIGHT, full_height - TOP - BOTTOM
    sx = Scale(x_ticks[0], x_ticks[-1], LEFT, width)
    sy = Scale(y_ticks[0], y_ticks[-1], TOP, height, flip=True)
    body = [_grid(chart, sx, sy, x_ticks, y_ticks)]
    if chart.stacked:
        body.append(_layers(chart, sx, sy))
    else:
        body += [_bands(chart, sx, sy), _lines(chart, sx, sy)]
    body.append(_marks(chart.marks, sx, sy))
    attrs = (
        f'data-chart="{escape(chart.id)}" data-plot="{LEFT} {TOP} {width} {height}" '
        f'data-x-domain="{sx.lo:g} {sx.hi:g}" data-y-domain="{sy.lo:g} {sy.hi:g}"'
    )
    return (
        f'<svg viewBox="0 0 {full_width} {full_height}" role="img" aria-label="{escape(chart.title)}" '
        f'{attrs} xmlns="http://www.w3.org/2000/svg"><title>{escape(chart.title)}</title>'
        f"{''.join(body)}</svg>"
    )


def _grid(chart: Chart, sx: Scale, sy: Scale, x_ticks: list[float], y_ticks: list[float]) -> str:
    right, bottom = sx.start + sx.size, sy.start + sy.size
    parts = ['<g class="grid">']
    for y in y_ticks:
        py = sy(y)
        parts.append(f'<line x1="{sx.start}" x2="{right}" y1="{py:.1f}" y2="{py:.1f}"/>')
        label = escape(fmt_value(y, chart.y_format))
        parts.append(f'<text x="{sx.start - 6}" y="{py + 4:.1f}" text-anchor="end">{label}</text>')
    for x in x_ticks:
        px = sx(x)
        parts.append(
            f'<line class="tick" x1="{px:.1f}" x2="{px:.1f}" y1="{bottom}" y2="{bottom + 4}"/>'
        )
        parts.append(
            f'<text x="{px:.1f}" y="{bottom + 16}" text-anchor="middle">{fmt_value(x)}</text>'
        )
    parts.append(f'<line class="axis" x1="{sx.start}" x2="{right}" y1="{bottom}" y2="{bottom}"/>')
    parts.append(
        f'<text class="label" x="{right}" y="{bottom + 30}" text-anchor="end">'
        f"{escape(chart.x_label)}</text>"
    )
    parts.append(
        f'<text class="label" x="12" y="{sy.start + sy.size / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {sy.start + sy.size / 2:.0f})">{escape(chart.y_label)}</text>'
    )
    parts.append("</g>")
    return "".join(parts)


def thin(
    points: Sequence[tuple[float, float]], limit: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most about `limit` points: each bucket of a longer series keeps its lowest and highest
    point, so a spike or a dip still shows."""
    if len(points) <= limit:
        return list(points)
    size = math.ceil(len(points) / (limit // 2))
    kept: list[tuple[float, float]] = []
    for start in range(0, len(points), size):
        bucket = points[start : start + size]
        low = min(bucket, key=lambda p: p[1])
        high = max(bucket, key=lambda p: p[1])
        kept += sorted({low, high}, key=lambda p: p[0])
    return kept


def _path(points: Sequence[tuple[float, float]], sx: Scale, sy: Scale) -> str:
    return " ".join(f"{sx(x):.2f},{sy(y):.2f}" for x, y in points)


def _lines(chart: Chart, sx: Scale, sy: Scale) -> str:
    parts = []
    for i, s in enumerate(chart.series):
        points = [(x, y) for x, y in s.points if math.isfinite(y)]
        if not points:
            continue
        color = chart.color(i)
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        shown = [(x, min(y, sy.hi)) for x, y in points]  # above the axis: on its top edge
        parts.append(
            f'<g class="series" data-series="{escape(s.name)}">'
            f'<polyline points="{_path(thin(shown), sx, sy)}" fill="none" stroke="{color}" '
            f'stroke-width="{3.5 if s.bold else 2}" stroke-linejoin="round"{dash}>'
            f"<title>{escape(s.name)}</title></polyline>"
        )
        if len(points) <= DOT_POINTS:
            for (x, y), (_, y_shown) in zip(points, shown, strict=True):
                tip = f"{s.name} at step {fmt_value(x)}: {fmt_value(y, chart.y_format)}"
                parts.append(
                    f'<circle cx="{sx(x):.2f}" cy="{sy(y_shown):.2f}" r="2.6" fill="{color}">'
                    f"<title>{escape(tip)}</title></circle>"
                )
        if s.stop:
            parts.append(_stop(points[-1], shown[-1], s.stop, color, sx, sy))
        parts.append("</g>")
    return "".join(parts)


def _stop(
    point: tuple[float, float],
    shown: tuple[float, float],
    tip: str,
    color: str,
    sx: Scale,
    sy: Scale,
) -> str:
    """A cross where a series stopped early: `point` in data units (kept in data-x, data-y),
    drawn at `shown`."""
    px, py, r = sx(shown[0]), sy(shown[1]), 5
    return (
        f'<g class="stop" data-x="{point[0]:.10g}" data-y="{point[1]:.10g}">'
        f'<path d="M{px - r:.2f},{py - r:.2f}L{px + r:.2f},{py + r:.2f}'
        f'M{px - r:.2f},{py + r:.2f}L{px + r:.2f},{py - r:.2f}" stroke="{color}" '
        f'stroke-width="2.5"/><title>{escape(tip)}</title></g>'
    )


def _bands(chart: Chart, sx: Scale, sy: Scale) -> str:
    parts = []
    for i, s in enumerate(chart.series):
        if not s.band:
            continue
        top = [(x, hi) for x, _, hi in s.band]
        bottom = [(x, lo) for x, lo, _ in reversed(s.band)]
        parts.append(
            f'<polygon class="band" points="{_path(top + bottom, sx, sy)}" '
            f'fill="{chart.color(i)}" fill-opacity="0.15"/>'
        )
    return "".join(parts)


def _layers(chart: Chart, sx: Scale, sy: Scale) -> str:
    """Each series stacked on the ones before it: a polygon from its top edge back along the
    top edge of the layers below."""
    if not chart.series or not chart.series[0].points:
        return ""
    count = len(chart.series[0].points)
    keep = range(0, count, math.ceil(count / MAX_POINTS))
    xs = [chart.series[0].points[k][0] for k in keep]
    below = [0.0] * len(xs)
    parts = []
    for i, s in enumerate(chart.series):
        above = [b + s.points[k][1] for b, k in zip(below, keep, strict=True)]
        edge = list(zip(xs, above, strict=True)) + list(zip(xs, below, strict=True))[::-1]
        parts.append(
            f'<g class="series" data-series="{escape(s.name)}">'
            f'<polygon points="{_path(edge, sx, sy)}" fill="{chart.color(i)}" '
            f'fill-opacity="0.8" stroke="{chart.color(i)}" stroke-width="0.5">'
            f"<title>{escape(s.name)}</title></polygon></g>"
        )
        below = above
    return "".join(parts)


def _marks(marks: Sequence[Mark], sx: Scale, sy: Scale) -> str:
    """Resumes and rollbacks as dashed lines across the plot (drawn last, on top); saves as
    triangles on the x axis; other events as diamonds along the top."""
    parts = ['<g class="marks">']
    bottom = sy.start + sy.size
    for m in sorted(marks, key=lambda m: m.kind in ("resumed", "rollback")):
        px, color = sx(m.x), MARK_COLORS.get(m.kind, MARK_COLORS["event"])
        tip = f"<title>{escape(m.label)}</title>"
        cls = f'class="mark mark-{escape(m.kind)}" data-x="{m.x:g}"'
        if m.kind not in ("resumed", "rollback"):
            top = bottom - 7 if m.kind == "checkpoint" else sy.start - 5
            shape = (
                f"{px:.1f},{top} {px - 4:.1f},{bottom} {px + 4:.1f},{bottom}"
                if m.kind == "checkpoint"
                else f"{px:.1f},{top} {px + 5:.1f},{top + 5} {px:.1f},{top + 10} {px - 5:.1f},{top + 5}"
            )
            parts.append(f'<polygon {cls} points="{shape}" fill="{color}">{tip}</polygon>')
            continue
        parts.append(
            f'<g {cls}><line x1="{px:.1f}" x2="{px:.1f}" y1="{sy.start}" y2="{bottom}" '
            f'stroke="{color}" stroke-width="1.5" stroke-dasharray="4 3"/>'
            f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{sy.start}" y2="{bottom}" stroke="transparent" '
            f'stroke-width="9"/>{tip}</g>'
        )
    parts.append("</g>")
    return "".join(parts)
