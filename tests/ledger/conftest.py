"""A team's runs, made once by thrifty itself for every ledger test: a finished spot run, a
run SIGKILLed mid-training and resumed with the same command, a run the forecast stopped,
and a sweep's two trials. The tests read them; none changes them (a test that must, copies)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from run_dir_helpers import job
from test_guard_in_training import Linear, config, regression
from thrifty import Trainer
from thrifty.cli import main
from thrifty.rundir.files import read_metrics

PRICE = {"usd_per_gpu_hour": 3.0, "pricing": "spot", "on_demand_usd_per_gpu_hour": 9.0}


@dataclass(frozen=True)
class Team:
    """The runs folder and what each run's own files said when it was made."""

    root: Path
    killed_before_resume: list[dict]  # metrics.jsonl of the killed attempt, as it was left


def linear_run(out: Path, steps: int = 20, **sections) -> None:
    """A small regression run of thrifty's Trainer, priced at PRICE."""
    cfg = config(out, steps, cost=PRICE, checkpoint={"every": "off"}, **sections)
    Trainer(Linear(), regression(400), cfg, val_data=regression(64, seed=1)).fit()


def forecast_run(out: Path) -> None:
    """A run that cannot reach its target: the forecast stops it before its 400 steps."""
    cfg = config(
        out, 400, eval={"every": 10}, early_stopping={"target": 0.05}, cost=PRICE,
        checkpoint={"every": "off"}, optimizer={"lr": 1e-3},
    )  # fmt: skip
    train, val = regression(3200, noise=0.3), regression(256, seed=1, noise=0.3)
    assert Trainer(Linear(), train, cfg, val_data=val).fit().stop_reason == "forecast"


def killed_job(folder: Path) -> Path:
    """The tiny demo job of the run directory tests, with no budget to speak of, a checkpoint
    every 40 steps and PRICE."""
    config = job(folder, steps=100000)
    text = (
        config.read_text()
        .replace('every = "off"', "every = 40")
        .replace("report = true", "report = false")
    )
    price = "".join(f"{k} = {json.dumps(v)}\n" for k, v in PRICE.items())
    config.write_text(f"{text}[cost]\n{price}".replace("[run]\n", '[run]\nname = "killed"\n'))
    return config


def killed_and_resumed(folder: Path) -> list[dict]:
    """`thrifty train` SIGKILLed some steps past its checkpoint at step 40, then the same
    command (with a budget just past where it died) resumes it. Returns the killed attempt's
    metrics as it left them."""
    job_file = killed_job(folder.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen(
        [sys.executable, "-m", "thrifty", "train", str(job_file), "--out", str(folder)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if (
            _last_step(folder) >= 45
            and (folder / "checkpoints/step-00000040/manifest.json").exists()
        ):
            break
        time.sleep(0.005)
    child.send_signal(signal.SIGKILL)
    child.wait()
    left = read_metrics(folder / "metrics.jsonl")
    last = max(r["step"] for r in left if "loss" in r)
    assert main(["train", str(job_file), "--out", str(folder), "--steps", str(last + 3)]) == 0
    return left


def _last_step(folder: Path) -> int:
    try:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError):
            continue
    return 0


@pytest.fixture(scope="session")
def team(tmp_path_factory) -> Team:
    root = tmp_path_factory.mktemp("team") / "runs"
    linear_run(root / "plain")
    forecast_run(root / "forecast")
    sweep = root / "sweep-lr"
    for trial in ("0000", "0001"):
        linear_run(sweep / "trials" / trial, steps=10)
    (sweep / "sweep.json").write_text(json.dumps({"trials": [], "best": None}))
    left = killed_and_resumed(root / "killed")
    return Team(root, left)
