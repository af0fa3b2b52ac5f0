"""What the ledger refuses or sets aside, each in one line; what a tune's levers and the case
study add up to, on the same real runs."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

import pytest

from thrifty.cli import main
from thrifty.ledger.book import read_ledger
from thrifty.ledger.case_study import case_study


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["runs", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_folder_with_no_runs_is_one_line_and_exit_2(tmp_path, capsys):
    code, out, err = cli(capsys, str(tmp_path))
    assert code == 2 and out == ""
    assert err.strip() == (
        f"thrifty: error: no thrifty run under {tmp_path}: give folders that hold thrifty runs "
        "(default runs/), or a bucket prefix s3://BUCKET/PREFIX"
    )
    code, _, err = cli(capsys, str(tmp_path / "missing"))
    assert code == 2 and "missing does not exist" in err and len(err.splitlines()) == 1


def test_a_malformed_since_and_a_since_after_every_run_are_one_line(team, capsys):
    code, _, err = cli(capsys, str(team.root), "--since", "May 1")
    assert code == 2 and "give a date as YYYY-MM-DD" in err
    code, _, err = cli(capsys, str(team.root), "--since", "2999-01-01")
    assert code == 2 and "started on or after 2999-01-01: give an earlier --since" in err


def a_plain_run_and_one_to_damage(team, tmp_path: Path) -> Path:
    """A folder of runs: the team's plain run, and its forecast run as `damaged/`."""
    runs = tmp_path / "runs"
    shutil.copytree(team.root / "plain", runs / "plain")
    shutil.copytree(team.root / "forecast", runs / "damaged")
    return runs


def only_the_plain_run_counted(capsys, runs: Path) -> str:
    """`thrifty runs RUNS --json` counts the plain run alone; what it said on stderr."""
    code, out, err = cli(capsys, str(runs), "--json")
    assert code == 0
    assert [r["name"] for r in json.loads(out)["runs"]] == ["run"]
    return err.strip()


def test_a_damaged_summary_is_skipped_and_said_while_the_rest_are_counted(team, tmp_path, capsys):
    runs = a_plain_run_and_one_to_damage(team, tmp_path)
    (runs / "damaged/summary.json").write_text('{"steps": 90, "stop_rea')
    assert only_the_plain_run_counted(capsys, runs) == (
        f"thrifty runs: {runs / 'damaged/summary.json'} is damaged (not the JSON object a "
        "finished run writes): skipped; move it away to count the run from its metrics.jsonl"
    )


@pytest.mark.parametrize("steps", ['"x"', "Infinity", "-3", "2.5"])
def test_a_summary_whose_steps_are_not_a_count_is_skipped_in_one_line(
    team, tmp_path, capsys, steps
):
    runs = a_plain_run_and_one_to_damage(team, tmp_path)
    summary = runs / "damaged/summary.json"
    data = json.loads(summary.read_text())
    summary.write_text(json.dumps({**data, "steps": "@"}).replace('"@"', steps))
    assert only_the_plain_run_counted(capsys, runs) == (
        f"thrifty runs: {summary}: its steps are damaged ({json.loads(steps)!r}, not a count): "
        "skipped"
    )


def test_runs_priced_from_different_catalogs_are_said(team, tmp_path, capsys):
    runs = tmp_path / "runs"
    for name, catalog in (("a", "one.toml"), ("b", "two.toml")):
        shutil.copytree(team.root / "plain", runs / name)
        config = runs / name / "config.toml"
        config.write_text(
            config.read_text().replace("[cost]\n", f'[cost]\ncatalog = "{catalog}"\n')
        )
    code, _, err = cli(capsys, str(runs))
    assert code == 0
    assert "runs priced from different catalogs: one.toml (1 run(s)), two.toml (1 run(s))" in err


def test_since_and_by_month_follow_when_each_run_started(team, tmp_path, capsys):
    runs = tmp_path / "runs"
    shutil.copytree(team.root / "plain", runs / "old")
    shutil.copytree(team.root / "forecast", runs / "new")
    march = datetime(2026, 3, 14, tzinfo=timezone.utc).timestamp()
    for path in (runs / "old").rglob("*"):
        os.utime(path, (march, march))
    code, out, _ = cli(capsys, str(runs), "--by", "month", "--json")
    groups = {g["label"]: g["runs"] for g in json.loads(out)["groups"]}
    assert code == 0 and groups["2026-03"] == 1 and sum(groups.values()) == 2
    code, out, _ = cli(capsys, str(runs), "--since", "2026-04-01", "--json")
    assert [r["sweep"] for r in json.loads(out)["runs"]] == [None] and code == 0
    assert json.loads(out)["runs"][0]["reason"] == "forecast"


def test_a_tunes_measured_levers_are_the_dollars_a_run_of_its_winner_saved(team, tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(team.root / "plain", runs / "tuned")
    tune = runs / "tune-job"
    tune.mkdir()
    # A tune whose paired comparisons measured bf16 1.5x and a larger micro-batch 1.2x, and
    # whose winner is the config the run trained (its task and lever settings).
    from thrifty.config import toml_loads

    ran = toml_loads((runs / "tuned/config.toml").read_text())
    (tune / "winner.toml").write_text((runs / "tuned/config.toml").read_text())
    steps = [{"lever": "precision", "measured": {"ratio": 1.5}},
             {"lever": "larger micro-batch", "measured": {"ratio": 1.2}}]  # fmt: skip
    (tune / "tune.json").write_text(json.dumps({"waterfall": {"steps": steps}}))
    (job,) = [j for j in read_ledger([str(runs)]).jobs if j.name == ran["run"]["name"]]
    # Its cost at the untuned pace is 1.5 x 1.2 = 1.8x: 0.8x of it saved, lever by lever.
    assert sum(job.levers.values()) == pytest.approx(0.8 * job.usd)
    assert job.levers["larger micro-batch"] == pytest.approx(0.2 * job.usd)
    assert job.levers["precision"] == pytest.approx(0.6 * job.usd)
    study = case_study([job])
    assert study.basis["precision"].startswith("measured: a tune's paired speed-up, on 1 of 1")
    hours = {s.lever: s for s in study.plan.steps}
    assert hours["precision"].before / hours["precision"].after == pytest.approx(1.5)


def test_the_case_study_lays_out_the_runs_as_the_article_and_says_what_is_estimated(team, capsys):
    code, out, err = cli(capsys, str(team.root), "--case-study", "--json")
    assert code == 0, err
    data = json.loads(out)
    study, article = data["case_study"], data["article"]
    assert study["runs"] == 5 and study["runs_per_year"] == pytest.approx(60)
    # Spot: $9 against $3 an hour saved two thirds of what the runs would have cost.
    levers = {s["lever"]: s for s in study["levers"]["steps"]}
    assert levers["spot instances"]["saving_pct"] == pytest.approx(2 / 3)
    assert study["basis"]["early stopping"].startswith("estimate:")
    assert sum(study["shares"].values()) == pytest.approx(1.0)
    # The article's own figures, recomputed: $905,952 -> $168,149 a year.
    assert round(article["baseline"]) == 905_952 and round(article["final"]) == 168_149
    code, out, _ = cli(capsys, str(team.root), "--case-study")
    assert "article's share" in out and "$905,952 -> $168,149 a year" in out
