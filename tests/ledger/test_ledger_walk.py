"""The ledger's walk over a folder of runs as people keep them: a `latest` link, links back up
the tree, FIFOs where a run's files should be, damaged figures from another version. Each run
is counted once, nothing hangs, and what is set aside is one line naming the file and field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from thrifty.cli import main

HANG_GUARD = 60  # seconds: a walk that loops or a FIFO that blocks fails here, not forever


def cli(capsys, *argv: str) -> tuple[int, dict, str]:
    code = main(["runs", *argv, "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def thrifty(*argv: str) -> subprocess.CompletedProcess:
    """`thrifty ARGV` in a child process, stopped after HANG_GUARD seconds."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.run(
        [sys.executable, "-m", "thrifty", *argv],
        capture_output=True, text=True, env=env, timeout=HANG_GUARD,
    )  # fmt: skip


def ten_dollar_run(team, where: Path) -> Path:
    """The team's plain run, its summary made a $10 bill: 12 s at $3,000 an hour."""
    shutil.copytree(team.root / "plain", where)
    summary = where / "summary.json"
    data = json.loads(summary.read_text())
    data["cost"].update(seconds=12.0, usd=10.0, usd_per_hour=3000.0, wasted_seconds=0.0)
    data["cost"]["on_demand_usd"] = 30.0
    summary.write_text(json.dumps(data))
    return where


def test_a_latest_link_counts_the_run_once_with_its_dollars_once(team, tmp_path, capsys):
    runs = tmp_path / "runs"
    ten_dollar_run(team, runs / "demo-1")
    (runs / "latest").symlink_to("demo-1")
    code, data, err = cli(capsys, str(runs))
    assert code == 0 and err == ""
    (run,) = data["runs"]
    assert run["usd"] == pytest.approx(10.0) and data["total"]["usd"] == pytest.approx(10.0)
    assert len(run["machines"]) == 1 and run["wasted_usd"] in (None, 0, 0.0)
    assert run["machines"][0]["run_dir"] == str(runs / "demo-1")  # the folder, not the link
    # The table a person reads: $10, not $20, and nothing thrown away.
    assert main(["runs", str(runs)]) == 0
    table = capsys.readouterr().out
    assert "thrifty runs: 1 run(s)" in table and "$10" in table and "$20" not in table
    total = next(line for line in table.splitlines() if line.strip().startswith("total"))
    assert "$10" in total and total.split()[-5] == "-"  # thrown away: none


def test_the_run_given_twice_through_a_link_is_counted_once(team, tmp_path, capsys):
    runs = tmp_path / "runs"
    ten_dollar_run(team, runs / "demo-1")
    (runs / "latest").symlink_to("demo-1")
    code, data, _ = cli(capsys, str(runs), str(runs / "latest"), str(runs / "demo-1"))
    assert code == 0 and data["total"]["usd"] == pytest.approx(10.0) and len(data["runs"]) == 1


def test_links_up_the_tree_end_the_walk_and_count_each_run_once(team, tmp_path):
    runs = tmp_path / "runs"
    ten_dollar_run(team, runs / "demo-1")
    ten_dollar_run(team, runs / "team" / "demo-2")
    (runs / "self").symlink_to(".")
    (runs / "x").mkdir()
    (runs / "x" / "a").symlink_to("..")
    (runs / "x" / "b").symlink_to("..")
    (runs / "team" / "up").symlink_to("../..")
    (runs / "team" / "root").symlink_to("/")
    done = thrifty("runs", str(runs), "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert sorted(r["machines"][0]["run_dir"] for r in data["runs"]) == [
        str(runs / "demo-1"), str(runs / "team" / "demo-2")
    ]  # fmt: skip
    assert data["total"]["usd"] == pytest.approx(20.0)
    # `thrifty report` draws the same ledger: the two runs, $20 in all.
    page = tmp_path / "team.html"
    done = thrifty("report", str(runs), "--out", str(page))
    assert done.returncode == 0, done.stderr
    table = page.read_text().split('data-section="ledger"', 1)[1].split("</table>", 1)[0]
    assert table.count("<td>$10.00</td>") == 2 and "<td>$20.00</td>" in table


def test_a_link_to_a_run_outside_the_folder_is_followed_once(team, tmp_path, capsys):
    ten_dollar_run(team, tmp_path / "elsewhere" / "big")
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "big").symlink_to(tmp_path / "elsewhere" / "big")
    (runs / "big-again").symlink_to(tmp_path / "elsewhere" / "big")
    code, data, _ = cli(capsys, str(runs))
    assert code == 0 and data["total"]["usd"] == pytest.approx(10.0) and len(data["runs"]) == 1


@pytest.mark.parametrize("name", ["config.toml", ".thrifty.lock", "metrics.jsonl", "summary.json"])
def test_a_fifo_in_a_run_folder_is_never_opened_and_the_rest_are_counted(team, tmp_path, name):
    runs = tmp_path / "runs"
    ten_dollar_run(team, runs / "good")
    ten_dollar_run(team, runs / "odd")
    fifo = runs / "odd" / name
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    done = thrifty("runs", str(runs), "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        f"thrifty runs: {fifo} is a FIFO (named pipe), not a file thrifty wrote: skipped, never "
        "opened; move it away to count the run"
    )
    data = json.loads(done.stdout)
    assert [r["machines"][0]["run_dir"] for r in data["runs"]] == [str(runs / "good")]
    assert data["total"]["usd"] == pytest.approx(10.0)


def test_a_fifo_named_manifest_json_in_a_checkpoint_folder_is_never_opened(team, tmp_path):
    runs = tmp_path / "runs"
    ten_dollar_run(team, runs / "good")
    step = runs / "good" / "checkpoints" / "step-00000099"
    step.mkdir(parents=True)
    os.mkfifo(step / "manifest.json")
    done = thrifty("runs", str(runs), "--json")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == (
        f"thrifty runs: {step / 'manifest.json'}: a FIFO (named pipe), not a file thrifty "
        "wrote: skipped, never opened"
    )
    assert json.loads(done.stdout)["total"]["usd"] == pytest.approx(10.0)


def _summary(run: Path, change) -> Path:
    file = run / "summary.json"
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data))
    return file


def _set(path: str, value):
    def change(data):
        *parents, leaf = path.split(".")
        for key in parents:
            if not isinstance(data.get(key), dict):
                data[key] = {}
            data = data[key]
        data[leaf] = value

    return change


# (what is damaged, how, the line's field and words after the file)
DAMAGED_SUMMARIES = [
    ("cost.seconds", 1e300, "cost.seconds is 1e+300, not a number of seconds from 0 to a century"),
    ("cost.redone_steps", "x", "cost.redone_steps is 'x', not a whole number, 0 or more"),
    ("cost.usd_per_hour", float("nan"), "cost.usd_per_hour is nan, not a price above 0"),
    ("cost.wasted_seconds", -5.0, "cost.wasted_seconds is -5.0, not a number of seconds from 0 to "
     "a century"),
    ("cost.gpus", "many", "cost.gpus is 'many', not a whole number of GPUs, 1 or more"),
    ("world_size", "8", "world_size is '8', not a whole number of GPUs, 1 or more"),
    ("wall_seconds", float("inf"), "wall_seconds is inf, not a number of seconds from 0 to a "
     "century"),
    ("guard.saved.steps_not_run", 2.5, "guard.saved.steps_not_run is 2.5, not a whole number, 0 "
     "or more"),
]  # fmt: skip


@pytest.mark.parametrize(("field", "value", "words"), DAMAGED_SUMMARIES, ids=lambda v: str(v)[:20])
def test_a_damaged_figure_skips_its_run_in_one_line_naming_the_field(
    team, tmp_path, capsys, field, value, words
):
    runs = tmp_path / "runs"
    ten_dollar_run(team, runs / "good")
    damaged = ten_dollar_run(team, runs / "damaged")
    file = _summary(damaged, _set(field, value))
    code, data, err = cli(capsys, str(runs))
    assert code == 0
    assert err.strip() == f"thrifty runs: {file}: {words}: skipped"
    assert [r["machines"][0]["run_dir"] for r in data["runs"]] == [str(runs / "good")]
    assert data["total"]["usd"] == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ({"loss": 1.0}, "a step record's step is missing, not a whole number, 0 or more"),
        ({"step": -7, "loss": 1.0}, "a step record's step is -7, not a whole number, 0 or more"),
        (
            {"step": 3, "event": "resumed", "redone_steps": "two"},
            "step 3: redone_steps is 'two', not a whole number, 0 or more",
        ),
        (
            {"step": 4, "loss": 1.0, "cost": {"elapsed_seconds": 1e300}},
            "cost.elapsed_seconds at step 4 is 1e+300, not a number of seconds from 0 to a century",
        ),
    ],  # fmt: skip
)
def test_a_damaged_metrics_record_skips_its_run_in_one_line(team, tmp_path, capsys, line, words):
    runs = tmp_path / "runs"
    ten_dollar_run(team, runs / "good")
    damaged = ten_dollar_run(team, runs / "damaged")
    (damaged / "summary.json").unlink()  # a run still going: its records are all there is
    metrics = damaged / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + json.dumps(line) + "\n")
    code, data, err = cli(capsys, str(runs))
    assert code == 0
    assert err.strip() == f"thrifty runs: {metrics}: {words}: skipped"
    assert data["total"]["usd"] == pytest.approx(10.0) and len(data["runs"]) == 1


def test_the_report_of_a_folder_with_a_damaged_run_draws_the_others(team, tmp_path):
    runs = tmp_path / "runs"
    ten_dollar_run(team, runs / "good")
    _summary(ten_dollar_run(team, runs / "damaged"), _set("cost.seconds", 1e300))
    page = tmp_path / "team.html"
    done = thrifty("report", str(runs), "--out", str(page))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    ledger = page.read_text().split('data-section="ledger"', 1)[1]
    assert "<td>total</td>" in ledger and "<td>$10.00</td>" in ledger
