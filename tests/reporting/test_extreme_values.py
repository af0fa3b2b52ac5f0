"""A loss too far out to draw (±1e308, ±infinity, NaN) in metrics.jsonl: the report still
draws its page, the axis fits the other points, and the chart says which it left out."""

from __future__ import annotations

import math
import re
from html import unescape

import pytest

from reporting.report_helpers import drawn, step, write_run
from thrifty import cli


def loss_figure(page: str) -> tuple[str, str]:
    """The loss chart's <svg> and its note, from the page."""
    figure = re.search(r'<figure class="chart" id="chart-[^"]*loss".*?</figure>', page, re.S)
    assert figure is not None
    svg = re.search(r"<svg.*?</svg>", figure.group(0), re.S).group(0)
    note = re.search(r'<p class="note">(.*?)</p>', figure.group(0), re.S)
    return svg, unescape(note.group(1)) if note else ""


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        (-1e308, "train loss at step 5: -1e+308"),
        (1e308, "train loss at step 5: 1e+308"),
        (float("inf"), "train loss at step 5: inf"),
        (float("-inf"), "train loss at step 5: -inf"),
        (float("nan"), "train loss at step 5: nan"),
    ],
)
def test_report_draws_the_page_when_a_loss_is_too_far_out_to_draw(tmp_path, capsys, bad, said):
    losses = [2.0 - 0.05 * n for n in range(1, 11)]
    records = [step(n, loss=bad if n == 5 else losses[n - 1]) for n in range(1, 11)]
    records.append({"step": 10, "val_loss": 1.5})
    run = write_run(tmp_path / "run", records)
    assert cli.main(["report", str(run)]) == 0, capsys.readouterr().err
    page = (run / "report.html").read_text()
    svg, note = loss_figure(page)
    y0, y1 = (float(v) for v in re.search(r'data-y-domain="([^"]+)"', svg).group(1).split())
    assert math.isfinite(y0) and math.isfinite(y1) and 1.0 <= y0 < y1 <= 2.5  # the others' axis
    train = drawn(svg)["train loss"]
    assert [round(x) for x, _ in train] == [1, 2, 3, 4, 6, 7, 8, 9, 10]  # step 5 left out
    assert [y for _, y in train] == pytest.approx(losses[:4] + losses[5:], abs=0.01)
    assert note.startswith("1 point left out, not finite or beyond ±")
    assert note.endswith(f"too far out to draw ({said}).")


def test_a_stacked_chart_leaves_the_step_out_of_every_layer():
    from thrifty.reporting.charts import Chart, Series, drawable

    layers = (
        Series("compute", ((1.0, 0.1), (2.0, 1e308), (3.0, 0.1))),
        Series("data", ((1.0, 0.05), (2.0, 0.05), (3.0, 0.05))),
    )
    chart = drawable(Chart("time", "Step time", "seconds", layers, stacked=True))
    assert [s.points for s in chart.series] == [
        ((1.0, 0.1), (3.0, 0.1)),
        ((1.0, 0.05), (3.0, 0.05)),
    ]
    assert "compute at step 2: 1e+308" in chart.note
    y0, y1 = (float(v) for v in re.search(r'data-y-domain="([^"]+)"', chart.svg()).group(1).split())
    assert y0 == 0.0 and 0.15 <= y1 < 1.0
