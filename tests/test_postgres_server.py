"""The throwaway PostgreSQL server (tests/postgres_server.py) holds an Optuna study that separate
processes share, as `thrifty sweep --storage postgresql://...` does."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import optuna
import psycopg
import pytest
from sqlalchemy.engine import make_url

TRIALS_PER_PROCESS = 4

# One sweep process: loads the study, asks and tells its trials, and prints what it told.
SWEEP_PROCESS = """
import json, sys
import optuna
optuna.logging.set_verbosity(optuna.logging.WARNING)
url, study_name, worker, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
study = optuna.load_study(study_name=study_name, storage=url)
told = []
for index in range(n):
    trial = study.ask()
    x = trial.suggest_float("x", -10.0, 10.0)
    trial.set_user_attr("worker", worker)
    trial.set_user_attr("index", index)
    value = 1000.0 * worker + index + x / 100.0
    study.tell(trial, value)
    told.append({"number": trial.number, "worker": worker, "index": index, "value": value})
print(json.dumps(told))
"""


def connect(url: str) -> psycopg.Connection:
    """A psycopg connection to the database a SQLAlchemy URL names."""
    parsed = make_url(url)
    return psycopg.connect(
        host=parsed.host,
        port=parsed.port,
        user=parsed.username,
        password=parsed.password,
        dbname=parsed.database,
        connect_timeout=10,
    )


def test_url_names_a_password_protected_loopback_server(postgres_url: str) -> None:
    parsed = make_url(postgres_url)
    assert parsed.drivername == "postgresql+psycopg"
    assert parsed.host == "127.0.0.1" and parsed.port and parsed.password
    with connect(postgres_url) as connection:
        assert connection.execute("SHOW listen_addresses").fetchone() == ("127.0.0.1",)
        assert connection.execute("SHOW password_encryption").fetchone() == ("scram-sha-256",)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            host=parsed.host,
            port=parsed.port,
            user=parsed.username,
            password="wrong",
            dbname=parsed.database,
            connect_timeout=10,
        )


def test_each_test_gets_a_fresh_empty_database(postgres_url: str, postgres_db: str) -> None:
    name = make_url(postgres_db).database
    assert name and name != make_url(postgres_url).database
    with connect(postgres_db) as connection:
        tables = connection.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchone()
        assert tables == (0,)
        assert connection.execute("SELECT current_database()").fetchone() == (name,)


def test_two_processes_share_one_study(postgres_db: str) -> None:
    # The tables and the study exist before the processes start, as the sweep creates them once.
    study = optuna.create_study(study_name="shared", storage=postgres_db, direction="minimize")
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                SWEEP_PROCESS,
                postgres_db,
                "shared",
                str(worker),
                str(TRIALS_PER_PROCESS),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for worker in (1, 2)
    ]
    told: list[dict[str, float]] = []
    for process in processes:
        try:
            stdout, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise
        assert process.returncode == 0, stderr
        told += json.loads(stdout)

    trials = study.get_trials(deepcopy=False)
    assert len(trials) == len(told) == 2 * TRIALS_PER_PROCESS
    assert sorted(t.number for t in trials) == list(range(2 * TRIALS_PER_PROCESS))
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    by_number = {t.number: t for t in trials}
    for record in told:
        trial = by_number[record["number"]]
        assert trial.value == record["value"]
        assert trial.user_attrs == {"worker": record["worker"], "index": record["index"]}
        assert trial.value == 1000.0 * record["worker"] + record["index"] + trial.params["x"] / 100
    assert {(r["worker"], r["index"]) for r in told} == {
        (w, i) for w in (1, 2) for i in range(TRIALS_PER_PROCESS)
    }


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
@pytest.mark.filterwarnings(
    "ignore:Heartbeat of storage is supposed to be used with Study.optimize"
)
def test_heartbeat_fails_a_trial_whose_process_went_silent(postgres_db: str) -> None:
    storage = optuna.storages.RDBStorage(postgres_db, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage)
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=2)
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE] * 2

    # A trial whose process beat once and then died: stale after the grace period.
    silent = study.ask()
    storage.record_heartbeat(silent._trial_id)
    time.sleep(2.5)
    optuna.storages.fail_stale_trials(study)
    assert study.trials[silent.number].state == optuna.trial.TrialState.FAIL
    storage.remove_session()
    storage.engine.dispose()
