"""The report's charts come from the run's records: a run with known metrics (throughput that
halves at a known step, a resume, a rollback, saves) is drawn with those very points, read
back from the SVG's pixels."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from reporting.report_helpers import drawn, flat, mark_steps, step, write_run
from thrifty.reporting import load, render_report
from thrifty.reporting.charts import thin
from thrifty.reporting.figures import comparison, headline, stragglers
from thrifty.reporting.series import rank_charts, run_charts, system_figures
from thrifty.reporting.tunes import trials_table, waterfall_bars
from thrifty.search.tune import session
from thrifty.search.tune.session import make_plan, run_tune
from thrifty.search.tune.trials import from_summary

HALVES_AT = 11  # from this step on each step takes twice as long
RESUMED_AT = 14


def known_run(tmp_path, **options):
    """20 steps of 1,000 tokens: 0.1 s each, 0.2 s from HALVES_AT; a resume at RESUMED_AT."""
    records = []
    for n in range(1, 21):
        seconds = 0.1 if n < HALVES_AT else 0.2
        records.append(step(n, loss=3.0 - n * 0.05, seconds=seconds))
        if n == RESUMED_AT:
            records.append(
                {"step": n, "event": "resumed", "wasted_seconds": 0.4, "redone_steps": 2}
            )
    return write_run(tmp_path / "known", records, **options)


def test_the_throughput_chart_holds_each_steps_rate_and_the_step_where_it_halves(tmp_path):
    run = load(known_run(tmp_path))
    chart = run_charts(run)["throughput"]
    (series,) = chart.series
    expected = [(float(n), 10_000.0 if n < HALVES_AT else 5_000.0) for n in range(1, 21)]
    assert flat(series.points) == pytest.approx(flat(expected))
    (line,) = drawn(chart.svg()).values()
    assert flat(line) == pytest.approx(flat(expected), rel=1e-3)
    assert mark_steps(chart.svg(), "resumed") == pytest.approx([RESUMED_AT], abs=0.01)


def test_the_loss_chart_marks_the_resume_the_rollback_and_each_save(tmp_path):
    records = [step(n, loss=2.0 + n) for n in range(1, 11)]
    records[3]["breakdown"] = {"forward": 0.05, "checkpoint": 0.02, "other": 0.03}
    records.insert(6, {"step": 6, "event": "resumed"})
    rollback = {"from_step": 9, "to_step": 4, "spike_start": 8, "steps_lost": 5}
    records.append({"step": 9, "event": "rollback", **rollback})
    records.append({"step": 10, "val_loss": 1.5})
    run = load(write_run(tmp_path / "run", records, saves=(8, 10)))
    chart = run_charts(run)["loss"]
    assert [(m.kind, m.x) for m in chart.marks] == [
        ("resumed", 6.0),
        ("rollback", 9.0),
        ("checkpoint", 4.0),  # its breakdown spent time saving; the rollback went back to it
        ("checkpoint", 6.0),  # the resume went back to it
        ("checkpoint", 8.0),
        ("checkpoint", 10.0),
    ]
    assert "rolled back from step 9 to the weights of step 4" in chart.marks[1].label
    lines = drawn(chart.svg())
    expected = flat((n, 2.0 + n) for n in range(1, 11))
    assert flat(lines["train loss"]) == pytest.approx(expected, rel=1e-3)
    assert flat(lines["validation loss"]) == pytest.approx([10, 1.5], rel=1e-3)
    assert mark_steps(chart.svg(), "checkpoint") == pytest.approx([4, 6, 8, 10], abs=0.01)
    assert mark_steps(chart.svg(), "rollback") == pytest.approx([9], abs=0.01)


def test_the_breakdown_layers_add_up_to_each_steps_time(tmp_path):
    phases = {"data_wait": 0.01, "forward": 0.03, "backward": 0.05, "optimizer": 0.01}
    records = [step(n, seconds=0.1, breakdown={**phases, "other": 0.0}) for n in range(1, 6)]
    records[2]["breakdown"]["data_wait"] = 0.11  # a slow batch: its step took 0.2 s
    chart = run_charts(load(write_run(tmp_path / "run", records)))["breakdown"]
    by_name = {s.name: s for s in chart.series}
    assert [y for _, y in by_name["data wait"].points] == [0.01, 0.01, 0.11, 0.01, 0.01]
    totals = [sum(s.points[i][1] for s in chart.series) for i in range(5)]
    assert totals == pytest.approx([0.1, 0.1, 0.2, 0.1, 0.1])


def test_a_long_runs_breakdown_is_drawn_as_the_means_of_equal_buckets(tmp_path):
    slow = {"forward": 0.3, "other": 0.0}  # every third step
    records = [
        step(n, breakdown=slow if n % 3 == 0 else {"forward": 0.0, "other": 0.0})
        for n in range(1, 901)
    ]
    chart = run_charts(load(write_run(tmp_path / "run", records)))["breakdown"]
    forward = next(s for s in chart.series if s.name == "forward")
    assert len(forward.points) == 300 and forward.points[0] == (3.0, pytest.approx(0.1))
    assert [y for _, y in forward.points] == pytest.approx([0.1] * 300)
    assert "the mean of 3 steps" in chart.note


def test_system_figures_give_the_mean_and_the_swing_of_each_metric(tmp_path):
    records = [
        step(
            2,
            system={
                "cpu_percent_mean": 50.0,
                "cpu_percent_std": 4.0,
                "gpu_power_watts_mean": 300.0,
            },
        ),
        step(
            4,
            system={
                "cpu_percent_mean": 70.0,
                "cpu_percent_std": 2.0,
                "gpu_power_watts_mean": 500.0,
            },
        ),
    ]
    run = load(write_run(tmp_path / "run", records))
    figures = {f.key: f for f in system_figures(run)}
    assert (figures["cpu_percent"].mean, figures["cpu_percent"].swing) == (60.0, 3.0)
    assert figures["gpu_power_watts"].unit == "W" and figures["gpu_power_watts"].mean == 400.0
    (series,) = run_charts(run)["system-cpu_percent"].series
    assert series.band == ((2.0, 46.0, 54.0), (4.0, 68.0, 72.0))


def test_the_cost_chart_holds_spent_the_projection_and_the_on_demand_counterfactual(tmp_path):
    records = [
        step(n, cost={"usd": 0.5 * n, "projected": {"total_usd": 5.0 + n}}) for n in (1, 2, 3)
    ]
    summary = {"steps": 3, "cost": {"usd": 1.5, "on_demand_usd": 4.5, "pricing": "spot"}}
    chart = run_charts(load(write_run(tmp_path / "run", records, summary=summary)))["cost"]
    spent, projected, on_demand = chart.series
    assert spent.points == ((1.0, 0.5), (2.0, 1.0), (3.0, 1.5))
    assert projected.points == ((1.0, 6.0), (2.0, 7.0), (3.0, 8.0))
    assert flat(on_demand.points) == pytest.approx([1.0, 1.5, 2.0, 3.0, 3.0, 4.5])


def test_an_unfinished_run_is_summed_up_from_its_records(tmp_path):
    """No summary.json (a preempted run): the headline comes from metrics.jsonl."""
    run = load(known_run(tmp_path))
    figures = {f.label: f.value for f in headline(run)}
    assert figures["steps"] == "20" and figures["tokens"] == "20,000"
    # After the first step: 9 steps at 10,000 tokens/s and 10 at 5,000: 19,000 tokens in 2.9 s.
    assert figures["tokens/s"] == f"{19_000 / 2.9:,.0f}"
    assert figures["stop reason"] == "not finished"
    assert figures["micro-batch × accumulation"] == "4 × 2"


def test_several_runs_share_the_axes_and_a_table(tmp_path):
    fast = write_run(tmp_path / "fast", [step(n, seconds=0.1) for n in range(1, 5)])
    slow = write_run(tmp_path / "slow", [step(n, seconds=0.4) for n in range(1, 5)])
    runs = [load(fast), load(slow)]
    header, rows = comparison(runs)
    assert header == ["", "fast", "slow"]
    assert dict((r[0], r[1:]) for r in rows)["tokens/s"] == ["10,000", "2,500"]
    out = render_report([fast, slow], out=tmp_path / "both.html")
    html = out.read_text()
    assert 'data-section="compare"' in html
    assert html.count('data-series="fast"') == 1 and html.count('data-series="slow"') == 1


def test_per_rank_records_show_in_a_table_and_a_line_per_rank(tmp_path):
    straggler = {"rank": 1, "lag": 0.5, "lag_seconds": 0.1}
    ranks = {"work_seconds": [0.2, 0.3]}
    records = [step(1), step(2, straggler=straggler, ranks=ranks), step(4, ranks=ranks)]
    run = load(write_run(tmp_path / "run", records))
    header, rows = stragglers(run)
    assert header == [
        "step",
        "straggler.rank",
        "straggler.lag",
        "straggler.lag_seconds",
        "ranks.work_seconds",
    ]
    assert rows == [["2", "1", "0.5", "0.1", "0.2, 0.3"], ["4", "", "", "", "0.2, 0.3"]]
    (chart,) = rank_charts(run)
    assert [(s.name, s.points) for s in chart.series] == [
        ("rank 0", ((2.0, 0.2), (4.0, 0.2))),
        ("rank 1", ((2.0, 0.3), (4.0, 0.3))),
    ]
    assert 'data-section="ranks"' in render_report([run.path]).read_text()


def test_a_long_series_keeps_its_spikes_when_thinned():
    points = [(float(i), 1.0) for i in range(10_000)]
    points[7_777] = (7_777.0, 50.0)
    kept = thin(points, limit=400)
    assert len(kept) <= 400 and (7_777.0, 50.0) in kept


def test_a_tune_directory_shows_its_trials_and_the_waterfall(tmp_path):
    water = {
        "unit": "USD",
        "period": "run",
        "baseline": 10.0,
        "final": 4.0,
        "saving_pct": 0.6,
        "steps": [
            {"lever": "precision", "detail": "fp32 -> bf16", "before": 10.0, "after": 5.0},
            {"lever": "larger micro-batch", "detail": "8 -> 16", "before": 5.0, "after": 4.0},
        ],
    }
    tune = tmp_path / "tune"
    tune.mkdir()
    data = {"unit": "tokens", "trials": [], "winner": None, "waterfall": water, "price": {}}
    (tune / "tune.json").write_text(json.dumps(data))
    bars = waterfall_bars(water)
    assert [(b.label, b.start, b.end) for b in bars] == [
        ("config as given", 0.0, 10.0),
        ("precision", 5.0, 10.0),
        ("larger micro-batch", 4.0, 5.0),
        ("winner", 0.0, 4.0),
    ]
    html = render_report([tune]).read_text()
    assert 'data-section="tune"' in html and 'data-section="waterfall"' in html
    assert "−$5 (50%)" in html


TUNE_CONFIG = """
[run]
name = "tiny"
max_steps = 300
device = "cpu"

[precision]
mode = "fp32"

[batch]
micro = 8
effective = 16

[data]
num_workers = 0

[task]
model = "dist_task:model"
train_data = "dist_task:train_data"
optimizer = "dist_task:sgd"
loss_fn = "dist_task:cross_entropy"
"""


class TwiceAsFastInBf16:
    """Trials on a fake clock: 100 samples/s, twice that in bf16; 10 s each."""

    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def __call__(self, candidate, deadline):
        self.now += 10.0
        s = candidate.setting
        rate = 200.0 if s.precision == "bf16" else 100.0
        summary = {
            "tokens_per_second": rate * 32,
            "samples_per_second": rate,
            "step_seconds": 16 / rate,
            "micro_batch": 8,
            "accumulation_steps": 2,
            "num_workers": 0,
            "precision": "fp32" if s.precision == "auto" else s.precision,
        }
        return from_summary(candidate, summary, 10.0, Path("trials") / candidate.name, 2**30)


def test_a_real_tunes_out_shows_its_trials_the_winner_and_the_waterfall(tmp_path):
    config = tmp_path / "job.toml"
    config.write_text(TUNE_CONFIG)
    plan = make_plan(
        session.read_given(config),
        str(config),
        out=tmp_path / "out",
        levers="precision",
        instance="p4d.24xlarge",
    )
    plan = dataclasses.replace(
        plan, space=dataclasses.replace(plan.space, precisions=("bf16", "fp32"))
    )
    fake = TwiceAsFastInBf16()
    result = run_tune(plan, runner=fake, clock=fake.clock)
    tune = load(tmp_path / "out")
    header, rows = trials_table(tune)
    assert [r[0] for r in rows] == ["00-baseline", "01-precision ★"]
    assert [r[header.index("tokens/s")] for r in rows] == ["3,200.0", "6,400.0"]
    water = result.waterfall.to_dict()
    levers = [b for b in waterfall_bars(tune.data["waterfall"]) if b.kind == "lever"]
    assert [(b.label, b.start, b.end) for b in levers] == [
        (s["lever"], s["after"], s["before"]) for s in water["steps"]
    ]
    assert "precision" in [b.label for b in levers]
    assert render_report(tmp_path / "out") == tmp_path / "out" / "report.html"


def test_axes_stay_where_the_figures_can_be(tmp_path):
    """A CPU at 100% with a swing drew an axis to 150%, and a loss near 0 one below zero."""
    from thrifty.reporting.charts import Chart, Series, _domains

    records = [
        step(2, system={"cpu_percent_mean": 96.0, "cpu_percent_std": 30.0}),
        step(4, system={"cpu_percent_mean": 99.0, "cpu_percent_std": 20.0}),
    ]
    cpu = run_charts(load(write_run(tmp_path / "run", records)))["system-cpu_percent"]
    assert cpu.series[0].band == ((2.0, 66.0, 100.0), (4.0, 79.0, 100.0))
    assert max(_domains(cpu)[1]) == 100.0
    loss = Chart(
        "loss", "loss", "loss", (Series("train", ((1.0, 0.9), (9.0, 0.02))),), from_zero=False
    )
    assert min(_domains(loss)[1]) == 0.0
    below = Chart(
        "loss", "loss", "loss", (Series("nll", ((1.0, 0.5), (9.0, -1.0))),), from_zero=False
    )
    assert min(_domains(below)[1]) < -1.0  # a loss that goes negative keeps its axis
    mfu = Chart(
        "mfu", "MFU", "MFU", (Series("MFU", ((1.0, 0.45), (9.0, 0.97))),), y_format="percent"
    )
    assert _domains(mfu)[1][-1] == 1.0


def test_a_resumed_runs_wall_time_is_the_same_figure_in_its_summary_and_its_report(
    tmp_path, capsys
):
    """The report showed 87 s (the training of both attempts) where the summary said 62 s
    (the last attempt's): both now say both, the same way."""
    from types import SimpleNamespace

    from thrifty.reporting.end_of_run import _wall
    from thrifty.reporting.figures import wall_time

    records = [step(1), step(2), {"step": 2, "event": "resumed"}, step(3), step(4)]
    summary = {
        "steps": 4,
        "wall_seconds": 62.0,
        "training_seconds": 87.0,
        "stop_reason": "max_steps",
    }
    run = load(write_run(tmp_path / "run", records, summary=summary))
    figure = wall_time(run)
    assert (figure.value, figure.detail) == (
        "1 min 27 s",
        "training, over 2 attempts; the last took 1 min 2 s",
    )
    assert _wall(SimpleNamespace(wall_seconds=62.0, training_seconds=87.0)) == (
        "62 this attempt; 87 of training in all attempts"
    )
    assert _wall(SimpleNamespace(wall_seconds=62.0, training_seconds=61.9)) == 62.0  # started once


def test_the_validation_curve_starts_at_the_evaluation_before_the_first_step(tmp_path):
    from thrifty.cli import main
    from thrifty.reporting.series import loss_chart

    config = tmp_path / "job.toml"
    config.write_text(
        '[run]\nmax_steps = 4\nlog_every = 2\nprogress = "off"\ndevice = "cpu"\n'
        '[precision]\nmode = "fp32"\n[batch]\nmicro = 16\neffective = 16\n[eval]\nevery = 2\n'
        '[data]\nnum_workers = 0\n[checkpoint]\nevery = "off"\nfinal = false\n'
        '[measure]\nsystem = false\n[task]\nmodel = "dist_task:model"\n'
        'train_data = "dist_task:train_data"\nval_data = "dist_task:val_data"\n'
        'optimizer = "dist_task:sgd"\nloss_fn = "dist_task:cross_entropy"\n'
    )
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 0
    run = load(tmp_path / "run")
    initial = json.loads((tmp_path / "run/summary.json").read_text())["initial_val_loss"]
    assert [s for s, _ in run.evals] == [0, 2, 4]
    assert run.evals[0] == (0, pytest.approx(initial))
    (val,) = [s for s in loss_chart([run]).series if s.name == "validation loss"]
    assert val.points[0] == (0.0, pytest.approx(initial))
