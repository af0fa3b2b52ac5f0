"""`thrifty sweep` end to end: real trials of a tiny model, each a `thrifty train` run in its own
process, on the real command line.

- A sweep stopped by SIGKILL and run again resumes its unfinished trial from that trial's own
  checkpoint, never from step 0, runs no finished trial again, and ends with the same curves,
  values and pruner decisions as the same sweep never stopped.
- A SIGTERM to the sweep's whole process group puts the running trial back in the queue (never
  FAILED), exits 75 with one line, and the same command finishes it.
- sweep.json holds every trial, the best, compute and dollars; best.toml holds the best
  parameters; a shared study through a real PostgreSQL server takes trials from two processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

TESTS = Path(__file__).resolve().parent

CONFIG = """
[run]
name = "sweep"
max_steps = {steps}
device = "cpu"
seed = 3
log_every = 5

[precision]
mode = "fp32"

[batch]
micro = 16
effective = 16

[optimizer]
lr = 0.01

[schedule]
warmup_steps = 2

[eval]
every = 10

[checkpoint]
every = 10

[data]
num_workers = 0

[cost]
usd_per_gpu_hour = 3.6
gpus = 1

[task]
model = "dist_task:model"
train_data = "dist_task:train_data"
val_data = "dist_task:val_data"
loss_fn = "dist_task:cross_entropy"
"""

SPACE = """
["optimizer.lr"]
low = 0.001
high = 0.3
log = true
"""


def write_inputs(folder: Path, steps: int) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    config, space = folder / "base.toml", folder / "space.toml"
    config.write_text(CONFIG.format(steps=steps))
    space.write_text(SPACE)
    return config, space


def env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    # The trials train on the CPU: no GPU for them to share out, so the sweep's own process
    # need not import torch to count the GPUs.
    return {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}


def sweep_command(config: Path, space: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "thrifty", "sweep", str(config), "--space", str(space),
        "--out", str(out), *extra,
    ]  # fmt: skip


def run(command: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env=env(), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def record(out: Path) -> dict[str, Any]:
    return json.loads((out / "sweep.json").read_text())


def newest_checkpoint_step(run_dir: Path) -> int:
    found = [int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("step-*")]
    return max(found, default=0)


def start_and_wait_for(
    command: list[str], run_dir: Path, step: int, timeout: float = 180
) -> subprocess.Popen[str]:
    """The sweep started in a session of its own, once `run_dir` holds a checkpoint at `step`."""
    proc = subprocess.Popen(
        command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while newest_checkpoint_step(run_dir) < step:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the trial never reached step {step}: {err[-2000:]}")
        time.sleep(0.1)
    return proc


def study_states(out: Path) -> dict[int, str]:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "study.journal"))
    )
    study = optuna.load_study(study_name=out.name, storage=storage)
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def outcome(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What the sweep decided, trial by trial: what must not depend on a stop in between."""
    return [
        (t["number"], t["state"], t["params"], t["value"], t["curve"], (t.get("pruned") or {}).get("step"))
        for t in data["trials"]
    ]


def test_a_killed_sweep_resumes_its_trial_from_its_checkpoint_and_decides_as_if_never_stopped(
    tmp_path: Path,
) -> None:
    config, space = write_inputs(tmp_path, steps=80)
    # Two trials: the second one the pruner compares with the first (its rung's best) at step 10.
    args = ("--trials", "2", "--pruner", "asha")

    # The same sweep twice: never stopped, and SIGKILLed while its first trial trains.
    whole = run(sweep_command(config, space, tmp_path / "whole", *args))
    assert whole.returncode == 0, whole.stderr
    killed = tmp_path / "killed"
    command = sweep_command(config, space, killed, *args)
    proc = start_and_wait_for(command, killed / "trials" / "0000", step=30)
    os.kill(proc.pid, signal.SIGKILL)  # the sweep alone: its trial dies with it (the tether)
    proc.communicate(timeout=60)
    assert study_states(killed) == {0: "RUNNING"}  # not failed: orphaned, for the next worker

    again = run(command)
    assert again.returncode == 0, again.stderr
    assert "trial 0: resumed" in again.stderr
    log = (killed / "trials" / "0000" / "train.log").read_text()
    # From its newest complete checkpoint: the one at step 30 may have been cut short by the
    # kill (then it is not trusted and the one at 20 is), never from step 0.
    assert int(log.split("resumed from step ")[1].split()[0]) >= 20

    # Bit for bit: every trial's curve, value and the pruner's decisions are those of the
    # sweep that never stopped.
    assert outcome(record(killed)) == outcome(record(tmp_path / "whole"))
    assert set(study_states(killed).values()) <= {"COMPLETE", "PRUNED"}

    # Run once more: every trial is finished, none runs again.
    logs = {p: p.read_text() for p in killed.glob("trials/*/train.log")}
    third = run(command)
    assert third.returncode == 0, third.stderr
    assert "trial" not in third.stderr.replace("thrifty sweep:", "")
    assert {p: p.read_text() for p in killed.glob("trials/*/train.log")} == logs


def test_a_sigterm_to_the_group_requeues_the_trial_exits_75_and_the_same_command_finishes(
    tmp_path: Path,
) -> None:
    config, space = write_inputs(tmp_path, steps=80)
    out = tmp_path / "sweep"
    command = sweep_command(config, space, out, "--trials", "1", "--pruner", "none")
    proc = start_and_wait_for(command, out / "trials" / "0000", step=20)
    os.killpg(proc.pid, signal.SIGTERM)  # a scheduler signals the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    lines = [line for line in err.splitlines() if "sweep stopped" in line]
    assert len(lines) == 1 and "run the same command" in lines[0]
    assert "Traceback" not in err
    assert study_states(out) == {0: "WAITING"}  # never FAILED
    assert record(out)["trials"][0]["state"] == "waiting"

    again = run(command)
    assert again.returncode == 0, again.stderr
    log = (out / "trials" / "0000" / "train.log").read_text()
    assert int(log.split("resumed from step ")[1].split()[0]) >= 20
    assert record(out)["trials"][0]["state"] == "complete"


def test_a_sweep_records_every_trial_its_dollars_and_writes_best_toml(tmp_path: Path) -> None:
    config, space = write_inputs(tmp_path, steps=40)
    out = tmp_path / "sweep"
    done = run(sweep_command(config, space, out, "--trials", "3", "--workers", "2", "--json"))
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    data = record(out)
    assert printed == data
    trials = data["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2]
    for t in trials:
        assert t["state"] == "complete" and t["steps"] == 40
        assert [step for step, _ in t["curve"]] == [10, 20, 30, 40]
        assert t["value"] == t["curve"][-1][1]
        assert t["run_dir"].endswith(f"trials/{t['number']:04d}")
        summary = json.loads((Path(t["run_dir"]) / "summary.json").read_text())
        # Its wall seconds (start-up included) at its run's own price.
        price = summary["cost"]["usd_per_hour"] / 3600
        assert t["cost"] == pytest.approx(t["seconds"] * price, rel=1e-6)
        assert t["cost"] > summary["cost"]["usd"] > 0
        assert 0.001 <= t["params"]["optimizer.lr"] <= 0.3
    best = min(trials, key=lambda t: t["value"])
    assert data["best"] == {"number": best["number"], "value": best["value"], "params": best["params"]}
    c = data["compute"]
    assert c["cost"] == pytest.approx(sum(t["cost"] for t in trials))
    assert c["seconds"] == pytest.approx(sum(t["seconds"] for t in trials))
    assert c["unpruned_seconds"] == pytest.approx(c["seconds"])  # nothing pruned

    from thrifty.config import load_config

    cfg = load_config(out / "best.toml")
    assert cfg.optimizer.lr == best["params"]["optimizer.lr"]
    assert cfg.run.max_steps == 40 and cfg.run.out is None


def test_two_processes_share_one_sweep_through_a_real_postgresql_server(
    tmp_path: Path, postgres_db: str
) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    common = ("--trials", "2", "--storage", postgres_db, "--study", "shared", "--pruner", "none")
    procs = [
        subprocess.Popen(
            sweep_command(config, space, tmp_path / f"machine{i}", *common),
            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for i in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    for proc, (_, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert postgres_db.split("@")[0].split(":")[-1] not in err  # the password
    study = optuna.load_study(study_name="shared", storage=postgres_db)
    trials = study.get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == [0, 1]
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # Each trial ran on one machine only: its run directory is under that machine's --out.
    dirs = sorted(t.user_attrs["thrifty.run_dir"] for t in trials)
    assert len(set(dirs)) == 2


def test_hyperband_pauses_the_early_arrivals_and_stops_as_many_as_its_bracket_prescribes(
    tmp_path: Path,
) -> None:
    # eval.every 10, 30 steps: a first bracket of 3 trials compared at step 10, keeping 1.
    config, space = write_inputs(tmp_path, steps=30)
    out = tmp_path / "sweep"
    done = run(sweep_command(config, space, out, "--trials", "3", "--pruner", "hyperband"))
    assert done.returncode == 0, done.stderr
    trials = record(out)["trials"]
    states = sorted(t["state"] for t in trials)
    assert states == ["complete", "pruned", "pruned"]
    survivor = next(t for t in trials if t["state"] == "complete")
    assert survivor["steps"] == 30
    assert survivor["curve"][0][1] == min(t["curve"][0][1] for t in trials)  # best at step 10
    for t in trials:
        if t["state"] == "pruned":
            assert t["pruned"]["step"] == 10 and t["pruned"]["pruner"] == "hyperband"
            assert t["pruned"]["bound"] == survivor["curve"][0][1]
            assert [step for step, _ in t["curve"]] == [10]
    # The trials that reached step 10 before the last of their bracket were paused there (a
    # checkpoint, exit 75), and the one that went on resumed from that checkpoint.
    assert done.stderr.count(": paused (at step 10") == 2
    if survivor["number"] != 2:
        log = (out / "trials" / f"{survivor['number']:04d}" / "train.log").read_text()
        assert "resumed from step 10" in log


def test_the_python_api_takes_dicts_and_a_budget_stops_starting_trials_it_cannot_pay_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import thrifty
    from thrifty.config import toml_loads

    monkeypatch.setenv("PYTHONPATH", env()["PYTHONPATH"])  # the trials import dist_task
    said: list[str] = []
    data = thrifty.sweep(
        toml_loads(CONFIG.format(steps=20)),
        {"optimizer.lr": {"low": 0.001, "high": 0.3, "log": True}},
        tmp_path / "sweep",
        trials=5,
        budget="$0.000001",
        say=said.append,
    )
    assert data == record(tmp_path / "sweep")
    # The first trial starts (nothing to expect a cost from yet) and is never cut off; after
    # it, one more would cost more than the budget has left.
    assert [t["state"] for t in data["trials"]] == ["complete"]
    assert data["trials"][0]["steps"] == 20
    assert any("no new trial" in line for line in said)
    assert data["compute"]["cost"] == data["trials"][0]["cost"] > 0.000001
    assert data["budget"] == "$0.00"


def test_two_processes_share_one_sweeps_journal_on_one_machine(tmp_path: Path) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    out = tmp_path / "sweep"
    command = sweep_command(config, space, out, "--trials", "3", "--pruner", "none")
    procs = [
        subprocess.Popen(command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    states = study_states(out)
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "COMPLETE"}  # none twice, none lost
    runs = sorted(p.parent.name for p in out.glob("trials/*/summary.json"))
    assert runs == ["0000", "0001", "0002"]
