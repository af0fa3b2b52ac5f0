"""A sweep whose PostgreSQL study goes away for a while keeps every evaluation its trials
report meanwhile and reports them once the server is back: in order, none lost, none twice,
and the pruner judges the trial at its next evaluation. One line says the database is
unreachable, one for how long; Optuna's own words never reach the screen.

A real server of the test's own (tests/postgres_server.py), stopped with `pg_ctl stop` while a
trial runs and started again on the same port. The two trials are queued with fixed learning
rates, so that the second cannot beat the first and the forecast pruner stops it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from postgres_server import (
    COMMAND_TIMEOUT,
    MAINTENANCE_DB,
    SYSTEM_USER,
    ServerUnavailable,
    find_bin_dir,
    run,
    start_postgres_server,
)
from test_sweep import CONFIG, env

STUDY = "outage"
OUTAGE_SECONDS = 6
STEPS, EVERY = 160, 10
SPACE = '["optimizer.lr"]\nlow = 1e-6\nhigh = 0.3\nlog = true\n'


@pytest.fixture(scope="module")
def server():
    """A server of this module's own: the other tests' server is never stopped."""
    psycopg = pytest.importorskip("psycopg")
    try:
        with start_postgres_server() as found:
            with psycopg.connect(**found.conninfo(MAINTENANCE_DB)) as connection:
                data_dir = Path(connection.execute("SHOW data_directory").fetchone()[0])
            yield found, data_dir
    except ServerUnavailable as error:
        pytest.skip(f"no PostgreSQL server for this test: {error}")


def pg_ctl(data_dir: Path, *args: str) -> None:
    """`pg_ctl --wait ARGS` on the server's data directory, as the user that owns it."""
    bin_dir = find_bin_dir()
    assert bin_dir is not None
    as_user = SYSTEM_USER if os.geteuid() == 0 else None
    log = ["--log", str(data_dir.parent / "server.log")] if args[0] == "start" else []
    run(
        [str(bin_dir / "pg_ctl"), f"--pgdata={data_dir}", *log, "--wait", *args],
        timeout=COMMAND_TIMEOUT * 2,
        cwd=data_dir.parent,
        as_user=as_user,
    )


def evaluated(run_dir: Path, step: int) -> bool:
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return False
    return any(f'"step": {step},' in line and "val_loss" in line for line in lines)


def test_evaluations_reported_while_the_database_is_down_are_kept_and_judged(tmp_path, server):
    psycopg = pytest.importorskip("psycopg")
    server, data_dir = server
    with psycopg.connect(**server.conninfo(MAINTENANCE_DB), autocommit=True) as connection:
        connection.execute("CREATE DATABASE outage")
    url = server.url("outage")
    study = optuna.create_study(storage=url, study_name=STUDY, direction="minimize")
    study.enqueue_trial({"optimizer.lr": 0.05})  # learns
    study.enqueue_trial({"optimizer.lr": 1e-6})  # barely moves: cannot beat the first
    text = CONFIG.format(steps=STEPS).replace(
        "every = 10\n\n[checkpoint]\nevery = 10",
        f"every = {EVERY}\n\n[checkpoint]\nevery = {STEPS}",
    )
    text = text.replace(
        'train_data = "dist_task:train_data"',
        'train_data = "dist_task:train_data"\ndata_args = { ms = 4.0 }',
    )
    config, space = tmp_path / "base.toml", tmp_path / "space.toml"
    config.write_text(text)
    space.write_text(SPACE)
    out = tmp_path / "sweep"
    command = [
        sys.executable, "-m", "thrifty", "sweep", str(config), "--space", str(space),
        "--out", str(out), "--storage", url, "--study", STUDY, "--trials", "2",
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    second = out / "trials" / "0001"
    deadline = time.monotonic() + 120
    while not evaluated(second, EVERY):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the second trial never evaluated"
        time.sleep(0.05)
    pg_ctl(data_dir, "stop", "--mode=fast")
    stopped = time.monotonic()
    while not evaluated(second, 3 * EVERY):  # evaluations the database cannot take
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - stopped)))
    pg_ctl(data_dir, "start")
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr

    trials = optuna.load_study(study_name=STUDY, storage=url).get_trials()
    first, pruned = trials
    assert first.state.name == "COMPLETE"
    assert list(first.intermediate_values) == list(range(EVERY, STEPS + 1, EVERY))
    # The second: every evaluation up to the one the pruner stopped it at, in order, once each.
    assert pruned.state.name == "PRUNED", stderr
    stop = max(pruned.intermediate_values)
    assert list(pruned.intermediate_values) == list(range(EVERY, stop + 1, EVERY))
    assert stop > 3 * EVERY  # judged after the database came back
    assert pruned.user_attrs["thrifty.pruned"]["reason"]
    logged = [
        json.loads(line) for line in (second / "metrics.jsonl").read_text().splitlines()
        if '"val_loss"' in line and '"initial"' not in line
    ]  # fmt: skip
    assert {r["step"]: r["val_loss"] for r in logged} == pytest.approx(pruned.intermediate_values)

    down = [
        line
        for line in stderr.splitlines()
        if "trial 1: the study's database is unreachable" in line
    ]
    back = [
        line
        for line in stderr.splitlines()
        if "trial 1: the study's database was unreachable for" in line
    ]
    assert len(down) == 1 and len(back) == 1, stderr
    seconds = int(back[0].split("unreachable for ")[1].split(" s")[0])
    assert seconds >= OUTAGE_SECONDS - 2
    assert "invalid data" not in stderr and "Traceback" not in stderr
