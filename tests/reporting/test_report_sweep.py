"""`thrifty report DIR` on a sweep's --out: one page with every trial's validation curve (a
pruned trial's ending at its pruned step, marked there; the best bold), the trials table, the
best trial and the command that runs it, the parameter importances (or why there are none),
each trial's cost and what pruning saved, as sweep.json holds them. Bad input is one line or a
noted omission; text is escaped; a report.html thrifty did not write is never replaced.

sample_sweep.json is the sweep.json of a real sweep: 8 trials of 60 steps, evaluated every 10,
trial 7 pruned at step 40 by the median pruner, trial 4 diverged, no price.
"""

from __future__ import annotations

import copy
import json
import logging
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from html import escape
from pathlib import Path
from typing import Any

import pytest

from reporting.report_helpers import SVG, data_mapping, drawn
from thrifty import cli
from thrifty.errors import ThriftyError
from thrifty.plan.units import fmt_usd
from thrifty.reporting import Sweep, load, render_report
from thrifty.reporting.figures import fmt_seconds

SAMPLE = json.loads((Path(__file__).parent / "sample_sweep.json").read_text())
USD_PER_SECOND = 0.002


def sweep_dir(tmp_path: Path, data: dict[str, Any] | None = None, name: str = "out") -> Path:
    """A sweep's --out as `thrifty sweep` leaves it: sweep.json (the sample, or `data`), a
    folder per trial and best.toml."""
    out = tmp_path / name
    for trial in SAMPLE["trials"]:
        (out / "trials" / f"{trial['number']:04d}").mkdir(parents=True)
    (out / "sweep.json").write_text(json.dumps(SAMPLE if data is None else data, indent=1))
    (out / "best.toml").write_text("# Written by thrifty sweep: the best trial (5)\n")
    return out


def variant(**changes: Any) -> dict[str, Any]:
    """A copy of the sample with top-level keys replaced."""
    data = copy.deepcopy(SAMPLE)
    data.update(changes)
    return data


def priced() -> dict[str, Any]:
    """The sample as if its config had a price: each trial's dollars its seconds at one rate."""
    data = copy.deepcopy(SAMPLE)
    for t in data["trials"]:
        t["cost"] = t["seconds"] * USD_PER_SECOND
        t["unpruned_cost"] = t["unpruned_seconds"] * USD_PER_SECOND
    cost = sum(t["cost"] for t in data["trials"])
    unpruned = sum(t["unpruned_cost"] for t in data["trials"])
    data["compute"].update(cost=cost, unpruned_cost=unpruned, saved_cost=unpruned - cost)
    return data


def page_of(out: Path) -> str:
    assert render_report(out) == out / "report.html"
    return (out / "report.html").read_text()


def section_of(page: str, name: str) -> str:
    found = re.search(rf'<section id="{name}" data-section="{name}">(.*?)</section>', page, re.S)
    assert found, f"no {name} section"
    return found.group(1)


def svg_of(page: str, chart: str) -> str:
    found = re.search(rf'<svg [^>]*data-chart="{chart}".*?</svg>', page, re.S)
    assert found, f"no {chart} chart"
    return found.group(0)


def trial_number(series_name: str) -> int:
    found = re.fullmatch(r"trial (\d+)( \(.*\))?", series_name)
    assert found, series_name
    return int(found.group(1))


def rows_of(page: str) -> list[list[str]]:
    """The trials table's cells, as text (entities decoded)."""
    table = ET.fromstring(re.search(r"<table>.*?</table>", section_of(page, "trials"), re.S)[0])
    return [["".join(td.itertext()) for td in tr] for tr in table.iter("tr")][1:]


def test_every_trial_has_one_curve_with_each_of_its_points(tmp_path):
    page = page_of(sweep_dir(tmp_path))
    lines = drawn(svg_of(page, "curves"))
    assert sorted(trial_number(n) for n in lines) == [t["number"] for t in SAMPLE["trials"]]
    top = float(ET.fromstring(svg_of(page, "curves")).get("data-y-domain").split()[1])
    for name, points in lines.items():
        trial = SAMPLE["trials"][trial_number(name)]
        assert len(points) == len(trial["curve"])
        assert [x for x, _ in points] == pytest.approx([s for s, _ in trial["curve"]])
        expected = [min(v, top) for _, v in trial["curve"]]  # a diverged trial: on the top edge
        assert [y for _, y in points] == pytest.approx(expected, rel=1e-3, abs=1e-3)


def test_a_diverged_trial_does_not_flatten_the_others(tmp_path):
    page = page_of(sweep_dir(tmp_path))
    root = ET.fromstring(svg_of(page, "curves"))
    top = float(root.get("data-y-domain").split()[1])
    others = [v for t in SAMPLE["trials"] if t["number"] != 4 for _, v in t["curve"]]
    assert max(others) <= top < 10  # trial 4 goes up to 150.7
    note = section_of(page, "curves")
    assert "trial 4 (up to 150.7) diverged, drawn on its top edge" in note


def test_the_pruned_trials_curve_ends_at_its_pruned_step_marked_there(tmp_path):
    page = page_of(sweep_dir(tmp_path))
    svg = svg_of(page, "curves")
    pruned = SAMPLE["trials"][7]["pruned"]
    assert drawn(svg)["trial 7 (pruned)"][-1][0] == pytest.approx(pruned["step"])
    root = ET.fromstring(svg)
    (stop,) = [g for g in root.iter(f"{SVG}g") if g.get("class") == "stop"]
    assert (float(stop.get("data-x")), float(stop.get("data-y"))) == pytest.approx(
        (pruned["step"], pruned["value"])
    )
    corner = re.match(r"M([\d.]+),([\d.]+)", stop.find(f"{SVG}path").get("d"))
    centre = data_mapping(root)(float(corner[1]) + 5, float(corner[2]) + 5)
    assert centre == pytest.approx((pruned["step"], pruned["value"]), rel=1e-2)
    assert stop.find(f"{SVG}title").text == f"trial 7 pruned at step 40: {pruned['reason']}"
    row = rows_of(page)[7]
    assert row[1:4] == ["pruned", "0.9886", "40 of 60"]
    assert row[7:] == ["40", f"median: {pruned['reason']}"]


def test_the_best_trial_is_marked_and_its_command_given(tmp_path):
    out = sweep_dir(tmp_path)
    page = page_of(out)
    root = ET.fromstring(svg_of(page, "curves"))
    series = [g for g in root.iter(f"{SVG}g") if g.get("class") == "series"]
    assert series[-1].get("data-series") == "trial 5 (best)"  # drawn last, on top
    widths = {g.get("data-series"): g.find(f"{SVG}polyline").get("stroke-width") for g in series}
    assert widths.pop("trial 5 (best)") == "3.5" and set(widths.values()) == {"2"}
    assert [r[0] for r in rows_of(page) if "★" in r[0]] == ["5 ★"]
    best = section_of(page, "best")
    assert 'data-best="5"' in best and "0.764693" in best
    assert "<code>optimizer.lr</code> = 0.028404307244881966" in best
    assert f"<code>thrifty train {out / 'best.toml'}</code> runs it" in best
    assert "is not there" not in best
    bars = ET.fromstring(svg_of(page, "trial-cost"))
    bold = [t.text for t in bars.iter(f"{SVG}text") if t.get("font-weight") == "700"]
    assert bold == ["trial 5"]


def test_the_trials_table_holds_each_trials_figures(tmp_path):
    rows = rows_of(page_of(sweep_dir(tmp_path)))
    assert len(rows) == len(SAMPLE["trials"])
    for row, t in zip(rows, SAMPLE["trials"], strict=True):
        assert row[0].split()[0] == str(t["number"])
        assert row[1] == t["state"]
        assert row[2] == format(t["value"], ".4g")
        assert row[3].split()[0] == str(t["steps"])
        assert row[4] == fmt_seconds(t["seconds"])
        assert row[5] == "-"  # no price
        assert row[6] == f"optimizer.lr={t['params']['optimizer.lr']:.4g}"


def test_importances_are_drawn_largest_first(tmp_path):
    page = page_of(sweep_dir(tmp_path))
    (bar,) = ET.fromstring(svg_of(page, "importances")).iter(f"{SVG}g")
    assert bar.get("data-label") == "optimizer.lr" and float(bar.get("data-value")) == 1.0
    two = variant(importances={"batch.micro": 0.25, "optimizer.lr": 0.75})
    page = page_of(sweep_dir(tmp_path, two, "two"))
    bars = list(ET.fromstring(svg_of(page, "importances")).iter(f"{SVG}g"))
    assert [(b.get("data-label"), float(b.get("data-value"))) for b in bars] == [
        ("optimizer.lr", 0.75),
        ("batch.micro", 0.25),
    ]
    assert "75.0%" in section_of(page, "importances")


def test_without_importances_the_page_says_why(tmp_path):
    data = variant(importances=None)
    for t in data["trials"][1:]:
        t["state"], t["value"] = "running", None
    page = page_of(sweep_dir(tmp_path, data))
    section = section_of(page, "importances")
    assert "data-no-importances" in section and 'data-chart="importances"' not in section
    assert "needs at least two finished trials with different parameters" in section
    assert "this sweep has 1 finished" in section


def test_seconds_and_the_saving_without_a_price(tmp_path):
    page = page_of(sweep_dir(tmp_path))
    c = SAMPLE["compute"]
    compute = section_of(page, "compute")
    assert "data-no-price" in compute and "the sweep&#x27;s config had no price" in compute
    line = (
        f"The trials used {fmt_seconds(c['seconds'])}; every trial run to its last step would "
        f"have used {fmt_seconds(c['unpruned_seconds'])}: pruning saved "
        f"{fmt_seconds(c['saved_seconds'])} ({c['saved_seconds'] / c['unpruned_seconds']:.1%})."
    )
    assert f"<li>{line}</li>" in compute
    bars = {b.get("data-label"): b for b in ET.fromstring(svg_of(page, "trial-cost"))}
    for t in SAMPLE["trials"]:
        bar = bars[f"trial {t['number']}"]
        assert float(bar.get("data-value")) == pytest.approx(t["seconds"])
        saved = t["unpruned_seconds"] - t["seconds"]
        assert float(bar.get("data-extra")) == pytest.approx(saved)
    assert "6.04 s saved by pruning" in "".join(bars["trial 7"].itertext())
    headline = section_of(page, "headline")
    assert fmt_seconds(c["saved_seconds"]) in headline and "no price: set [cost]" in headline


def test_dollars_and_the_saving_with_a_price(tmp_path):
    data = priced()
    page = page_of(sweep_dir(tmp_path, data))
    c = data["compute"]
    compute = section_of(page, "compute")
    assert "data-no-price" not in compute and "Cost per trial (USD)" in compute
    line = (
        f"The trials cost {fmt_usd(c['cost'])}; every trial run to its last step would have "
        f"cost {fmt_usd(c['unpruned_cost'])}: pruning saved {fmt_usd(c['saved_cost'])} "
        f"({c['saved_cost'] / c['unpruned_cost']:.1%})."
    )
    assert f"<li>{line}</li>" in compute
    bars = {b.get("data-label"): b for b in ET.fromstring(svg_of(page, "trial-cost"))}
    for t in data["trials"]:
        bar = bars[f"trial {t['number']}"]
        assert float(bar.get("data-value")) == pytest.approx(t["cost"])
        assert float(bar.get("data-extra")) == pytest.approx(t["unpruned_cost"] - t["cost"])
    assert [r[5] for r in rows_of(page)] == [fmt_usd(t["cost"]) for t in data["trials"]]
    headline = section_of(page, "headline")
    assert fmt_usd(c["cost"]) in headline and f"{fmt_usd(c['saved_cost'])} saved" in headline


def test_pruning_that_cost_more_than_it_saved_says_so_never_saved(tmp_path):
    # The sessions paid 40 s of start-ups; every trial once to its end would have paid less.
    data = priced()
    c = data["compute"]
    unpruned = c["seconds"] - 10.0
    c.update(unpruned_seconds=unpruned, saved_seconds=-10.0, sessions=11, startup_seconds=40.0)
    c.update(unpruned_cost=unpruned * USD_PER_SECOND, saved_cost=-10.0 * USD_PER_SECOND)
    page = page_of(sweep_dir(tmp_path, data))
    compute = section_of(page, "compute")
    assert (
        f"would have used {fmt_seconds(unpruned)}: pruning cost {fmt_seconds(10.0)} more "
        f"({10.0 / unpruned:.1%})."
    ) in compute
    assert f"pruning cost {fmt_usd(10.0 * USD_PER_SECOND)} more" in compute
    assert f"the trials&#x27; 11 sessions paid {fmt_seconds(40.0)} of start-ups" in compute
    headline = section_of(page, "headline")
    assert "pruning cost more" in headline and f"{10.0 / unpruned:.1%} more" in headline
    assert f"{fmt_usd(10.0 * USD_PER_SECOND)} more for pruning" in headline
    said = compute[compute.index("<ul") :]  # the lines under the bars
    assert "pruning saved" not in said + headline and "saved by pruning" not in headline


def test_failed_running_and_waiting_trials(tmp_path):
    data = copy.deepcopy(SAMPLE)
    failed, running, waiting = data["trials"][1], data["trials"][2], data["trials"][3]
    failed.update(state="failed", value=None, curve=failed["curve"][:2], error="CUDA <oom>")
    running.update(state="running", value=None, curve=running["curve"][:3])
    waiting.update(state="waiting", value=None, steps=None, curve=[], seconds=0.0)
    page = page_of(sweep_dir(tmp_path, data))
    lines = drawn(svg_of(page, "curves"))
    assert len(lines["trial 1 (failed)"]) == 2 and len(lines["trial 2 (running)"]) == 3
    assert "trial 3" not in {n.split(" (")[0] for n in lines}
    root = ET.fromstring(svg_of(page, "curves"))
    tips = [g.find(f"{SVG}title").text for g in root.iter(f"{SVG}g") if g.get("class") == "stop"]
    assert "trial 1 failed at step 20: CUDA <oom>" in tips
    assert "No validation loss reported yet by trial(s) 3." in section_of(page, "curves")
    rows = rows_of(page)
    assert rows[1][1:3] == ["failed", "-"] and rows[1][8] == "CUDA <oom>"
    assert [r[1] for r in rows[2:4]] == ["running", "waiting"]
    assert "1 failed, 1 running, 1 waiting" in section_of(page, "headline")


def test_no_trial_finished_yet(tmp_path):
    data = variant(best=None, importances=None, trials=[])
    page = page_of(sweep_dir(tmp_path, data))
    assert "No trial has reported a validation loss yet." in section_of(page, "curves")
    assert "No best trial yet: no trial has finished." in section_of(page, "best")


def test_text_from_sweep_json_is_escaped(tmp_path):
    data = copy.deepcopy(SAMPLE)
    attack = "<script>alert('x')</script>"
    data["study"] = f'study "{attack}"'
    data["trials"][0]["params"] = {"model.act": attack, "<b>name": 'say "hi"'}
    data["trials"][7]["pruned"]["reason"] = f"worse than <em>median</em> {attack}"
    data["best"]["params"] = {"model.act": attack}
    data["importances"] = {"<i>lr": 1.0}
    page = page_of(sweep_dir(tmp_path, data))
    assert "<script" not in page and "<em>" not in page and "<i>lr" not in page
    assert "<b>name" not in page
    assert escape(attack) in section_of(page, "best")
    assert rows_of(page)[0][6] == f'model.act={attack}, <b>name=say "hi"'
    assert rows_of(page)[7][8] == f"median: worse than <em>median</em> {attack}"
    assert escape(f'thrifty report: study "{attack}"') not in page  # the title is the folder
    assert escape(f'study "{attack}"') in section_of(page, "headline")


def test_a_damaged_sweep_json_is_one_line(tmp_path, capsys):
    out = sweep_dir(tmp_path)
    (out / "sweep.json").write_text(json.dumps(SAMPLE)[:500])
    assert cli.main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("thrifty: error: "), err
    assert f"{out / 'sweep.json'} is not valid JSON" in err[0]
    assert "thrifty sweep writes it anew from its study when it next runs" in err[0]
    for damaged in ("[1, 2]", "[" * 100_000):
        (out / "sweep.json").write_text(damaged)
        assert cli.main(["report", str(out)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(out / "sweep.json") in err[0], err
    assert not (out / "report.html").exists()
    with pytest.raises(ThriftyError, match="not valid JSON"):
        render_report(out)


def test_fields_of_the_wrong_type_are_left_out_and_named(tmp_path, caplog):
    data = copy.deepcopy(SAMPLE)
    data["trials"][1]["seconds"] = "slow"
    data["trials"][2] = "trial two"
    data["trials"][3]["number"] = "3"
    data["trials"][4]["curve"] = [[10, "high"], [20, 1.5], "x", [30.5, 1.0]]
    data["trials"][7]["pruned"] = {"step": "forty", "reason": ["worse"]}
    data["compute"]["saved_seconds"] = [6]
    data["best"]["params"] = 3
    data["importances"] = {"optimizer.lr": "most"}
    out = sweep_dir(tmp_path, data)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        assert cli.main(["report", str(out)]) == 0
    where = out / "sweep.json"
    expected = [
        f"{where}: best.params is a number, not a table: left out of the report",
        f"{where}: compute.saved_seconds is a list, not a number: left out of the report",
        f"{where}: importances.optimizer.lr is text, not a number: left out of the report",
        f"{where}: trials[1].seconds is text, not a number: left out of the report",
        f"{where}: trials[2] is text, not a table: the trial is left out",
        f"{where}: trials[3].number is text, not a whole number: the trial is left out",
        f"{where}: trials[4].curve: 3 point(s) that are not [step, loss] left out of the report",
        f"{where}: trials[7].pruned.step is text, not a whole number: left out of the report",
        f"{where}: trials[7].pruned.reason is a list, not text: left out of the report",
    ]
    assert [r.getMessage() for r in caplog.records] == expected
    page = (out / "report.html").read_text()
    assert all(escape(line) in page for line in expected)
    assert "left out, a value in its files" not in page  # every section was drawn
    assert [r[0].split()[0] for r in rows_of(page)] == ["0", "1", "4", "5", "6", "7"]
    assert len(drawn(svg_of(page, "curves"))["trial 4"]) == 1
    assert isinstance(load(out), Sweep)


def test_a_report_html_thrifty_did_not_write_is_never_replaced(tmp_path, capsys):
    out = sweep_dir(tmp_path)
    (out / "report.html").write_text("my notes on the sweep")
    assert cli.main(["report", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "report.html exists and thrifty did not write it" in err[0], err
    assert (out / "report.html").read_text() == "my notes on the sweep"
    elsewhere = tmp_path / "sweep.html"
    assert cli.main(["report", str(out), "--out", str(elsewhere)]) == 0
    assert 'data-section="curves"' in elsewhere.read_text()


def test_its_own_report_is_rewritten_without_overwrite(tmp_path):
    out = sweep_dir(tmp_path)
    (out / "best.toml").unlink()
    first = page_of(out)
    assert "is not there" in section_of(first, "best")
    (out / "sweep.json").write_text(json.dumps(priced()))
    assert "Cost per trial (USD)" in page_of(out)  # thrifty's own page: replaced without a word


def test_the_report_reads_sweep_json_without_the_sweep_or_optuna(tmp_path):
    out = sweep_dir(tmp_path)
    code = (
        "import sys; from thrifty.reporting import render_report; "
        f"render_report({str(out)!r}); "
        "print(sorted(m for m in sys.modules if m.startswith(('thrifty.search.sweep', 'optuna'))))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"
    assert "Validation curves" in (out / "report.html").read_text()


def test_a_sweep_run_again_goes_on_beside_the_report_thrifty_drew_of_it(tmp_path):
    from thrifty.search.sweep.plan import _check_out

    out = sweep_dir(tmp_path)
    page_of(out)
    _check_out(out)  # thrifty sweep with this --out again: its own page is no stranger
    (out / "report.html").write_text("my notes on the sweep")
    with pytest.raises(ThriftyError, match="holds report.html, which thrifty sweep did not"):
        _check_out(out)
