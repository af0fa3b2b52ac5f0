"""`thrifty report` on a folder of runs draws the ledger: spend stacked by run, savings beside."""

from __future__ import annotations

import re

import pytest

from thrifty.cli import main
from thrifty.ledger.book import read_ledger
from thrifty.ledger.groups import total
from thrifty.ledger.tables import fmt_usd
from thrifty.reporting import ledger


def test_a_folder_of_runs_gets_the_ledger_whose_stack_ends_at_the_total(team, tmp_path, capsys):
    out = tmp_path / "team.html"
    assert main(["report", str(team.root), "--out", str(out)]) == 0
    page = out.read_text()
    assert 'data-section="ledger"' in page and 'id="chart-ledger-ledger-spend"' in page
    jobs = read_ledger([str(team.root)]).jobs
    spent = total("total", jobs).usd
    assert re.search(rf"<td>total</td>.*?<td>{re.escape(fmt_usd(spent))}</td>", page)
    # The stack's top edge at the last moment is every run's dollars; the savings' is the
    # spot saving plus the forecast's.
    chart = ledger.spend_chart(jobs, [j.name for j in jobs])
    assert len(chart.series) == len(jobs) == 5
    assert sum(s.points[-1][1] for s in chart.series) == pytest.approx(spent)
    saved = ledger.savings_chart(jobs)
    spot = sum(j.on_demand_usd - j.usd for j in jobs)
    stops = sum(j.saved.usd for j in jobs if j.saved)
    assert sum(s.points[-1][1] for s in saved.series) == pytest.approx(spot + stops)
