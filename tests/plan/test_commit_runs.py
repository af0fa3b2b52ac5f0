"""`thrifty runs` weighs the team's own GPU-hours a month: on-demand, spot or a commitment."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from thrifty.cli import main
from thrifty.plan.spot import HOURS_PER_MONTH, interruption_rate, spot_economics


def _train(tmp_path: Path, out: Path, cost: str) -> None:
    config = tmp_path / f"{out.name}.toml"
    config.write_text(
        '[run]\nmax_steps = 3\nlog_every = 1\nprogress = "off"\n'
        '[batch]\nmicro = 4\n[data]\nnum_workers = 0\n[schedule]\ndecay = "constant"\n'
        '[checkpoint]\nevery = "off"\n[spot]\nprovider = "none"\n'
        f"[cost]\n{cost}\n"
        '[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "thrifty.demo:train_dataset"\n'
        "model_args = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 16 }\n"
        "data_args = { block_size = 16, max_bytes = 20000 }\n"
    )
    assert main(["train", str(config), "--out", str(out)]) == 0


@pytest.fixture(scope="module")
def team(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("team")
    runs = root / "runs"
    _train(root, runs / "a", 'instance = "p4d.24xlarge"')
    _train(root, runs / "b", 'instance = "p4d.24xlarge"')
    return runs


def test_runs_says_which_pricing_pays_for_the_teams_monthly_gpu_hours(team, capsys) -> None:
    assert main(["runs", str(team), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    gpu_hours = data["total"]["gpu_hours"]  # both runs started this month
    c = data["commitment"]
    assert c["instance"] == "p4d.24xlarge" and c["months"] == 1
    assert c["gpu_hours_per_month"] == pytest.approx(gpu_hours)
    instance_hours = gpu_hours / 8
    mean_hours = data["total"]["seconds"] / 2 / 3600
    spot = spot_economics(
        mean_hours,
        on_demand_per_hour=21.96,
        spot_per_hour=8.0001,
        rate_per_hour=interruption_rate(advisor_bucket="5-10%"),
    )
    expected = {
        "on-demand": 21.96 * instance_hours,
        "spot": spot.spot_cost / spot.on_demand_hours * instance_hours,
        "1-year": 14.27 * HOURS_PER_MONTH,  # one instance, billed every hour of the month
        "3-year": 9.66 * HOURS_PER_MONTH,
    }
    assert c["monthly_usd"] == pytest.approx(expected)
    assert c["cheapest"] == "spot"  # minutes a month: no commitment pays
    assert c["utilisation"] == pytest.approx(instance_hours / HOURS_PER_MONTH)


def test_runs_prints_one_line_and_weighs_another_instance_when_asked(team, capsys) -> None:
    assert main(["runs", str(team), "--instance", "g5.xlarge"]) == 0
    out = capsys.readouterr().out
    (line,) = [text for text in out.splitlines() if text.startswith("commitment:")]
    assert "on g5.xlarge:" in line and "cheapest: on-demand" in line
    assert f"3-year ${0.435 * HOURS_PER_MONTH:,.2f}" in line
    assert math.isclose(0.435 * HOURS_PER_MONTH, 317.7675)
