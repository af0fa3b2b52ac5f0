"""The ledger of real runs: one row a job, dollars summed across a kill and its resume, the
forecast's saving, a sweep's trials under their sweep, and bad input as one line."""

from __future__ import annotations

import json

import pytest

from thrifty.ledger.book import read_ledger


def jobs_by_name(team):
    return {j.last.path.name: j for j in read_ledger([str(team.root)]).jobs}


def test_the_killed_and_resumed_run_is_one_row_whose_dollars_are_its_two_parts(team):
    job = jobs_by_name(team)["killed"]
    assert job.machines == 1  # one run directory, one attempt after another in it
    summary = json.loads((team.root / "killed/summary.json").read_text())
    rate = summary["cost"]["usd_per_hour"] / 3600
    # The parts: the killed attempt paid for its wall time to its last record (set-up and
    # every second it trained); the resumed one for its whole wall time.
    killed = [r for r in team.killed_before_resume if "cost" in r]
    first = (killed[-1]["cost"]["elapsed_seconds"] + killed[-1]["cost"]["overhead_seconds"]) * rate
    second = summary["wall_seconds"] * rate
    # Within 2%, or 50 ms of billing on this sub-second job: the resumed attempt takes the
    # training clock kept from its checkpoint, read a few ms apart from the killed attempt's
    # last record (8 ms on a busy machine, 2.2% of these 0.37 s).
    assert job.usd == pytest.approx(first + second, rel=0.02, abs=0.05 * rate)
    assert job.usd == pytest.approx(summary["cost"]["usd"])
    # What the kill threw away is shown apart: the steps past the checkpoint, redone.
    redone = killed[-1]["step"] - 40
    assert redone > 0
    assert sum(p.redone_steps for p in job.parts) == summary["cost"]["redone_steps"] == redone
    assert job.wasted_usd == pytest.approx(summary["cost"]["wasted_usd"]) and job.wasted_usd > 0


def test_the_forecast_stopped_run_shows_what_it_saved_against_running_to_the_end(team):
    job = jobs_by_name(team)["forecast"]
    summary = json.loads((team.root / "forecast/summary.json").read_text())
    assert (job.state, job.reason) == ("stopped", "forecast")
    assert job.saved is not None and job.saved.by == "forecast"
    assert job.saved.steps_not_run == 400 - job.steps
    assert job.saved.usd == pytest.approx(summary["guard"]["saved"]["usd"]) and job.saved.usd > 0


def test_a_spot_run_is_priced_as_it_ran_with_the_on_demand_price_beside_it(team):
    job = jobs_by_name(team)["plain"]
    assert job.pricing == "spot" and job.state == "finished"
    assert job.on_demand_usd == pytest.approx(3 * job.usd)  # $9 against $3 a GPU-hour
    assert job.gpu_hours == pytest.approx(job.seconds / 3600)


def test_the_cli_prints_a_row_a_run_with_the_totals_their_sum(team, capsys):
    from thrifty.cli import main

    assert main(["runs", str(team.root), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    runs = data["runs"]
    assert sorted(r["name"] for r in runs if not r["sweep"]) == ["killed", "run", "run"]
    assert data["total"]["runs"] == 5
    assert data["total"]["usd"] == pytest.approx(sum(r["usd"] for r in runs))
    assert data["total"]["saved_usd"] == pytest.approx(
        sum(r["saved"]["usd"] for r in runs if r["saved"])
    )
    assert main(["runs", str(team.root)]) == 0
    table = capsys.readouterr().out
    assert "stopped: forecast" in table and "lr/0001" in table and "total" in table


def test_a_sweeps_trials_are_grouped_under_their_sweep(team, capsys):
    from thrifty.cli import main

    assert main(["runs", str(team.root), "--by", "sweep", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    groups = {g["label"]: g for g in data["groups"]}
    trials = [r for r in data["runs"] if r["sweep"] == "sweep sweep-lr"]
    assert len(trials) == 2 and groups["sweep sweep-lr"]["runs"] == 2
    assert groups["sweep sweep-lr"]["usd"] == pytest.approx(sum(r["usd"] for r in trials))
    assert groups["(no sweep)"]["runs"] == 3
