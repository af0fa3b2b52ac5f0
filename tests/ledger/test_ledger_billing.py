"""What a run is billed for: the wall time of every attempt (set-up, evaluations, checkpoint
waits and the steps), at the price of every GPU. The ledger, the run's summary and the live
meter agree on it, for a run extended by a second `thrifty train` too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from run_dir_helpers import job
from thrifty.cli import main
from thrifty.rundir.files import read_metrics

USD_PER_GPU_HOUR = 3600.0  # a dollar a GPU-second: dollars read as seconds


def priced_job(folder: Path, steps: int) -> Path:
    """The tiny demo job, evaluated every 5 steps (at step 0 and at its last too), a
    checkpoint every 5, at USD_PER_GPU_HOUR."""
    config = job(folder, steps=steps)
    text = config.read_text().replace('every = "off"', "every = 5")
    text = text.replace("[task]\n", '[task]\nval_data = "thrifty.demo:val_dataset"\n')
    text += "[eval]\nevery = 5\nbatches = 2\n[cost]\nusd_per_gpu_hour = 3600.0\n"
    config.write_text(text.replace("report = true", "report = false"))
    return config


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def test_a_run_extended_by_a_second_train_is_billed_both_attempts_wall_time(tmp_path, capsys):
    config, run = priced_job(tmp_path, 10), tmp_path / "run"
    assert main(["train", str(config), "--out", str(run)]) == 0
    first = summary(run)
    assert main(["train", str(config), "--out", str(run), "--steps", "20"]) == 0
    second = summary(run)
    capsys.readouterr()
    walls = first["wall_seconds"] + second["wall_seconds"]  # each attempt's, as recorded
    assert first["cost"]["seconds"] == pytest.approx(first["wall_seconds"], rel=1e-6)
    # The summary bills every attempt's wall time, set-up and evaluations included: more than
    # the training clock, which leaves them out.
    assert second["cost"]["seconds"] == pytest.approx(walls, rel=1e-6)
    assert second["cost"]["usd"] == pytest.approx(walls * USD_PER_GPU_HOUR / 3600, rel=1e-6)
    assert second["cost"]["seconds"] > second["training_seconds"] + second["wall_seconds"] / 10
    # The ledger shows the summary's dollars: both attempts, not the second alone.
    assert main(["runs", str(tmp_path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["runs"]
    assert row["usd"] == pytest.approx(second["cost"]["usd"], rel=1e-9)
    assert row["seconds"] == pytest.approx(walls, rel=1e-6)
    assert row["seconds"] > second["wall_seconds"] + first["training_seconds"]
    # The live meter's last figure is the same bill as of its last record: short of the
    # summary's by the attempt's time after that record only.
    last = [r["cost"] for r in read_metrics(run / "metrics.jsonl") if "cost" in r][-1]
    assert last["usd"] <= second["cost"]["usd"]
    assert last["usd"] == pytest.approx(
        (last["elapsed_seconds"] + last["overhead_seconds"]) * USD_PER_GPU_HOUR / 3600
    )
