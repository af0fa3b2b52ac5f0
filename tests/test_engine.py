"""The warm trial engine (`thrifty.search.engine`, `thrifty.worker`): trials run one after
another in one long-lived process, and nothing of one trial reaches the next.

- Trial order changes nothing, bit for bit: the same trials in one order and in the other, in
  a worker each, train to the same losses as each in a process of its own.
- A trial that ends its worker (a segfault, an abort, a hang the search ends, a SIGKILL) costs
  a new worker and nothing else: the trials around it end exactly as without it; one that runs
  out of memory fails alone and its worker goes on.
- In a real sweep, a segfaulting trial and a hung one are failed with their reasons, and every
  other trial's result is the one the sweep without the faults found.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import test_sweep
from test_sweep import CONFIG, env, record, sweep_command
from thrifty.search.engine import Engine, TrialSession

here = test_sweep.here  # the fixture

TRIAL = CONFIG.format(steps=20).replace('"dist_task:model"', '"fault_task:model"')
GOOD = (0.01, 0.05, 0.002)


def start(engine: Engine, out: Path, name: str, lr: float, fault: str = "none") -> TrialSession:
    options = ["--out", str(out / name), "--set", f"optimizer.lr={lr}"]
    options += ["--set", f'task.model_args.fault="{fault}"']
    return engine.start(options, TRIAL.encode(), out / f"{name}.log", name)


def finish(session: TrialSession, silent_for: float = 15.0) -> int:
    """Serve the trial to its end; end it (and its worker) once it reports nothing for
    `silent_for` seconds after it was ready, as a search ends a hung trial."""
    pipe, heard = session.pipe, [0, time.monotonic()]

    def turn() -> bool:
        if pipe.steps != heard[0] or pipe.ready is None:
            heard[:] = [pipe.steps, time.monotonic()]
        elif time.monotonic() - heard[1] > silent_for:
            session.kill()
        return False

    code = pipe.serve(session, turn)
    assert code is not None
    return session.wait()


def losses(run: Path) -> tuple[Any, ...]:
    """What a run trained to: every logged loss and its summary's final losses, exactly."""
    summary = json.loads((run / "summary.json").read_text())
    curve = [
        (r["step"], r.get("loss"), r.get("val_loss"))
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if "step" in (r := json.loads(line))
    ]
    return summary["final_val_loss"], summary["train_loss"], curve


def trials_in_a_worker(
    out: Path, plan: list[tuple[float, str]]
) -> tuple[Engine, list[Any], list[tuple[int, int]]]:
    engine = Engine(out / "workers", env())
    sessions = []
    held: list[tuple[int, int]] = []  # (descriptors, threads) of the worker after each trial
    try:
        for i, (lr, fault) in enumerate(plan):
            session = start(engine, out, f"t{i}", lr, fault)
            finish(session)
            sessions.append(session)
            if session.proc.poll() is None:  # what the worker holds once the trial is done
                fd = Path(f"/proc/{session.proc.pid}/fd")
                task = Path(f"/proc/{session.proc.pid}/task")
                held.append((len(list(fd.iterdir())), len(list(task.iterdir()))))
    finally:
        engine.close()
    return engine, sessions, held


def test_trial_order_changes_nothing_bit_for_bit_and_a_trial_is_a_run_of_its_own(tmp_path):
    forward, _, held = trials_in_a_worker(tmp_path / "a", [(lr, "none") for lr in GOOD])
    backward, _, _ = trials_in_a_worker(tmp_path / "b", [(lr, "none") for lr in reversed(GOOD)])
    assert forward.workers_started == backward.workers_started == 1
    # A trial leaves nothing open behind it: no descriptor, no thread.
    assert len(set(held)) == 1, held
    n = len(GOOD)
    for i in range(n):
        assert losses(tmp_path / "a" / f"t{i}") == losses(tmp_path / "b" / f"t{n - 1 - i}")
    # The last of three trials in a worker is the run `thrifty train` makes in a fresh process.
    config = tmp_path / "trial.toml"
    config.write_text(TRIAL)
    alone = tmp_path / "alone"
    command = [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(alone)]
    command += ["--set", f"optimizer.lr={GOOD[-1]}"]
    done = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert losses(tmp_path / "a" / f"t{n - 1}") == losses(alone)
    # Each trial's output is in its own log, none in the worker's.
    for i in range(n):
        assert f"/a/t{i}/checkpoints" in (tmp_path / "a" / f"t{i}.log").read_text()
    assert "checkpoint" not in (tmp_path / "a" / "workers" / "worker-0.log").read_text()


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list[Any]:
    """The two good trials in a worker with no fault between them."""
    out = tmp_path_factory.mktemp("clean")
    trials_in_a_worker(out, [(GOOD[0], "none"), (GOOD[1], "none")])
    return [losses(out / "t0"), losses(out / "t1")]


@pytest.mark.parametrize("fault", ["segfault", "abort", "hang", "kill", "oom"])
def test_a_trial_that_ends_its_worker_costs_a_worker_and_the_others_end_as_without_it(
    tmp_path, clean, fault
):
    plan = [(GOOD[0], "none"), (0.02, fault), (GOOD[1], "none")]
    engine, (before, faulty, after), _ = trials_in_a_worker(tmp_path, plan)
    assert [before.code, after.code] == [0, 0]
    assert [losses(tmp_path / "t0"), losses(tmp_path / "t2")] == clean
    if fault == "oom":  # the run's own error: the worker freed what it held and went on
        assert faulty.code not in (0, None) and not faulty.worker_died
        assert "allocate" in faulty.error_line()
        assert engine.workers_started == 1
        return
    assert faulty.worker_died and engine.workers_started == 2
    expected = {"segfault": "SIGSEGV", "abort": "SIGABRT", "hang": "SIGKILL", "kill": "SIGKILL"}
    assert faulty.signal_name() == expected[fault]
    assert faulty.crashed() == (fault in ("segfault", "abort"))
    if faulty.crashed():  # where it crashed is in the trial's own log
        assert "Fatal Python error" in (tmp_path / "t1.log").read_text()
    # The trial that followed ran in a new worker and wrote to its own log only.
    assert "t2/checkpoints" in (tmp_path / "t2.log").read_text()


def test_a_sweep_fails_a_segfault_and_a_hang_with_their_reasons_and_the_rest_as_without(
    tmp_path, here, monkeypatch
):
    config, space = tmp_path / "base.toml", tmp_path / "space.toml"
    config.write_text(TRIAL.replace('"fault_task:model"', '"fault_task:ticketed_model"'))
    space.write_text(test_sweep.SPACE)
    tickets = tmp_path / "tickets"
    tickets.mkdir()
    monkeypatch.setenv("FAULT_TICKETS", str(tickets))
    options = ("--trials", "4", "--pruner", "none", "--hang-after", "15s")

    code, _, err = here(sweep_command(config, space, tmp_path / "clean", *options))
    assert code == 0, err
    (tickets / "1").write_text("segfault")
    (tickets / "2").write_text("hang")
    code, _, err = here(sweep_command(config, space, tmp_path / "faults", *options))
    assert code == 0, err

    clean, faults = record(tmp_path / "clean")["trials"], record(tmp_path / "faults")["trials"]
    assert [t["state"] for t in faults] == ["failed", "failed", "complete", "complete"]
    assert faults[0]["error"].startswith("its worker died of SIGSEGV")
    assert faults[1]["error"].startswith("hung: it reported no step for 15 s")
    assert "trial 0: failed (its worker died of SIGSEGV" in err
    for mine, theirs in zip(faults[2:], clean[2:], strict=True):
        assert (mine["params"], mine["value"], mine["curve"]) == (
            theirs["params"], theirs["value"], theirs["curve"]
        )  # fmt: skip
    assert not os.listdir(tickets)


def test_a_hang_after_that_is_no_duration_is_one_line_before_anything_is_written(tmp_path, here):
    config, space = tmp_path / "base.toml", tmp_path / "space.toml"
    config.write_text(TRIAL)
    space.write_text(test_sweep.SPACE)
    out = tmp_path / "sweep"
    code, _, err = here(sweep_command(config, space, out, "--hang-after", "soon"))
    assert code == 2
    assert err.strip() == (
        "thrifty: error: --hang-after = 'soon' is invalid: give seconds or a number with s, m, "
        'h or d (e.g. "30m")'
    )
    assert not out.exists()
