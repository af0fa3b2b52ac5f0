"""`thrifty sweep` end to end: real trials of a tiny model, each a `thrifty train` run in its own
process, on the real command line.

- A SIGTERM to the sweep's whole process group puts the running trial back in the queue (never
  FAILED), exits 75 with one line, and the same command resumes it.
- A sweep stopped by SIGKILL and run again resumes its unfinished trial from that trial's own
  checkpoint, never from step 0, runs no finished trial again, and ends with the same curves,
  values and pruner decisions as the same sweep never stopped.
- sweep.json holds every trial, the best, compute and dollars; best.toml holds the best
  parameters; two processes share a sweep through its journal on one machine, or through a
  real PostgreSQL server.

The sweeps a test does not signal run in the test's own process (`thrifty.cli.main`); their
trials are processes of their own all the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from thrifty import cli
from thrifty.checkpointing.store.manifest import MANIFEST

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


@pytest.fixture
def here(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`thrifty sweep` run in this process, with the environment `env()` gives the command's
    own process: `here(command)` is (exit code, stdout, stderr)."""
    for key in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.setenv(key, env()[key])

    def run(command: list[str]) -> tuple[int, str, str]:
        assert command[:4] == [sys.executable, "-m", "thrifty", "sweep"]
        code = cli.main(command[3:])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def record(out: Path) -> dict[str, Any]:
    return json.loads((out / "sweep.json").read_text())


def newest_checkpoint_step(run_dir: Path) -> int:
    """The newest published checkpoint: a step's folder appears before its manifest, and a
    kill in between leaves nothing to resume from."""
    found = [
        int(p.parent.name.split("-")[1])
        for p in (run_dir / "checkpoints").glob(f"step-*/{MANIFEST}")
    ]
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


def resumed_from(run_dir: Path) -> int:
    """The step the trial's last session resumed from (each session appends to train.log)."""
    log = (run_dir / "train.log").read_text()
    return int(log.rsplit("resumed from step ", 1)[1].split()[0])


def study_states(out: Path) -> dict[int, str]:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "study.journal"))
    )
    study = optuna.load_study(study_name=out.name, storage=storage)
    return {t.number: t.state.name for t in study.get_trials(deepcopy=False)}


def outcome(data: dict[str, Any]) -> list[tuple[Any, ...]]:
    """What the sweep decided, trial by trial: what must not depend on a stop in between."""
    return [
        (
            t["number"],
            t["state"],
            t["params"],
            t["value"],
            t["curve"],
            (t.get("pruned") or {}).get("step"),
        )
        for t in data["trials"]
    ]


def test_a_sigterm_then_a_sigkill_resume_the_trial_from_its_checkpoint_as_if_never_stopped(
    tmp_path: Path, here
) -> None:
    config, space = write_inputs(tmp_path, steps=80)
    # Two trials: the second one the pruner compares with the first (its rung's best) at step 10.
    args = ("--trials", "2", "--pruner", "asha")

    # The same sweep twice: never stopped, and stopped twice while its first trial trains: by a
    # SIGTERM to its process group, then, resumed by the same command, by a SIGKILL.
    code, _, err = here(sweep_command(config, space, tmp_path / "whole", *args))
    assert code == 0, err
    stopped = tmp_path / "stopped"
    command = sweep_command(config, space, stopped, *args)
    trial = stopped / "trials" / "0000"

    proc = start_and_wait_for(command, trial, step=20)
    os.killpg(proc.pid, signal.SIGTERM)  # a scheduler signals the whole process group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    lines = [line for line in err.splitlines() if "sweep stopped" in line]
    assert len(lines) == 1 and "run the same command" in lines[0]
    assert "Traceback" not in err
    assert study_states(stopped) == {0: "WAITING"}  # never FAILED
    assert record(stopped)["trials"][0]["state"] == "waiting"

    # The same command resumes the trial; killed once it has saved a checkpoint past the one
    # it resumed from.
    proc = start_and_wait_for(command, trial, step=newest_checkpoint_step(trial) + 1)
    os.kill(proc.pid, signal.SIGKILL)  # the sweep alone: its trial dies with it (the tether)
    _, err = proc.communicate(timeout=60)
    assert "trial 0: resumed" in err
    assert resumed_from(trial) >= 20  # the SIGTERM's checkpoint, never step 0
    assert study_states(stopped) == {0: "RUNNING"}  # not failed: orphaned, for the next worker

    code, _, err = here(command)
    assert code == 0, err
    assert "trial 0: resumed" in err
    # From its newest complete checkpoint: the one the SIGKILL came after may have been cut
    # short by it (then it is not trusted and the one before is), never from step 0.
    assert resumed_from(trial) >= 20

    # Bit for bit: every trial's curve, value and the pruner's decisions are those of the
    # sweep that never stopped.
    assert outcome(record(stopped)) == outcome(record(tmp_path / "whole"))
    assert set(study_states(stopped).values()) <= {"COMPLETE", "PRUNED"}
    assert record(stopped)["trials"][0]["state"] == "complete"

    # Run once more: every trial is finished, none runs again.
    logs = {p: p.read_text() for p in stopped.glob("trials/*/train.log")}
    code, _, err = here(command)
    assert code == 0, err
    assert "trial" not in err.replace("thrifty sweep:", "")
    assert {p: p.read_text() for p in stopped.glob("trials/*/train.log")} == logs


def test_a_trial_killed_from_outside_the_sweep_resumes_from_its_checkpoint_not_failed(
    tmp_path: Path,
) -> None:
    """The OOM killer's SIGKILL reaches the trial's warm worker, not the sweep: the work it
    saved is not thrown away as a failure; the same sweep takes the trial up again from its
    checkpoint in a new worker."""
    config, space = write_inputs(tmp_path, steps=200)
    out = tmp_path / "sweep"
    trial = out / "trials" / "0000"
    proc = start_and_wait_for(sweep_command(config, space, out, "--trials", "1"), trial, 10)
    found = subprocess.run(
        ["pgrep", "-P", str(proc.pid), "-f", "thrifty.worker"], capture_output=True, text=True
    )
    pids = [int(pid) for pid in found.stdout.split()]
    assert pids, "the trial's worker process"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "trial 0: resumed" in err and "failed" not in err
    assert resumed_from(trial) >= 10
    step = resumed_from(trial)
    assert (
        f"trial 0: requeued (killed by SIGKILL: it resumes from its checkpoint at step {step})"
        in err
    )
    first, second = (trial / "train.log").read_text().split("--- trial 0: a new session, ")
    assert "checkpoint step 10 written" in first  # the killed session's story is kept
    assert "resumed from step" in second and "resumed from step" not in first
    assert study_states(out) == {0: "COMPLETE"}
    (done,) = record(out)["trials"]
    assert done["state"] == "complete" and done["curve"][-1][0] == 200


def test_a_worker_whose_lease_lapsed_stops_the_trial_another_took_up_and_tells_optuna_nothing(
    tmp_path: Path, here, monkeypatch: pytest.MonkeyPatch
) -> None:
    """This worker's renewals stalled past its lease (a database gone for a minute); another
    worker requeued the trial and took it up. At its next renewal this worker stops its run
    (it saves) instead of training the trial alongside the other and telling its outcome."""
    from thrifty.search.sweep import study as study_module
    from thrifty.search.sweep.leases import requeue
    from thrifty.search.sweep.study import LEASE_KEY, lease

    monkeypatch.setattr(study_module, "LEASE_SECONDS", 1.2)  # renewals every 0.2 s
    config, space = write_inputs(tmp_path, steps=400)
    out = tmp_path / "sweep"
    trial = out / "trials" / "0000"
    theirs = {**lease(time.time()), "until": time.time() + 3600}  # alive, and not ours

    def the_other_worker() -> None:
        deadline = time.monotonic() + 120
        while newest_checkpoint_step(trial) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(out / "study.journal"))
        )
        study = optuna.load_study(study_name=out.name, storage=storage)
        (running,) = study.get_trials(deepcopy=False)
        requeue(storage, running._trial_id)
        assert study.ask().number == 0
        storage.set_trial_user_attr(running._trial_id, LEASE_KEY, theirs)

    other = threading.Thread(target=the_other_worker)
    other.start()
    code, _, err = here(sweep_command(config, space, out, "--trials", "1"))
    other.join()
    assert code == 0, err
    assert "trial 0: another worker took it up after its lease lapsed: its run here stops" in err
    assert "trial 0: taken (another worker took it up after this one's lease lapsed" in err
    assert "complete" not in err and "failed" not in err
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(out / "study.journal"))
    )
    (frozen,) = optuna.load_study(study_name=out.name, storage=storage).get_trials()
    assert frozen.state.name == "RUNNING" and frozen.value is None  # the other's to tell
    assert frozen.user_attrs[LEASE_KEY] == theirs  # never written over
    log = (trial / "train.log").read_text()
    assert "checkpoint step" in log and newest_checkpoint_step(trial) < 400  # stopped, saved


def test_two_processes_share_one_sweeps_journal_and_it_records_every_trial_and_writes_best_toml(
    tmp_path: Path, here
) -> None:
    config, space = write_inputs(tmp_path, steps=40)
    out = tmp_path / "sweep"
    command = sweep_command(config, space, out, "--trials", "3")
    procs = [
        subprocess.Popen(
            command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    states = study_states(out)
    assert states == {0: "COMPLETE", 1: "COMPLETE", 2: "COMPLETE"}  # none twice, none lost
    runs = sorted(p.parent.name for p in out.glob("trials/*/summary.json"))
    assert runs == ["0000", "0001", "0002"]

    # The same command once more runs no trial and prints the sweep's record.
    code, printed, err = here([*command, "--json"])
    assert code == 0, err
    assert "trial" not in err.replace("thrifty sweep:", "")
    data = record(out)
    assert json.loads(printed) == data
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
    assert data["best"] == {
        "number": best["number"],
        "value": best["value"],
        "params": best["params"],
    }
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
            env=env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
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
    tmp_path: Path, here
) -> None:
    # eval.every 10, 30 steps: a first bracket of 3 trials compared at step 10, keeping 1.
    config, space = write_inputs(tmp_path, steps=30)
    out = tmp_path / "sweep"
    code, _, err = here(sweep_command(config, space, out, "--trials", "3", "--pruner", "hyperband"))
    assert code == 0, err
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
    assert err.count(": paused (at step 10") == 2
    if survivor["number"] != 2:
        log = (out / "trials" / f"{survivor['number']:04d}" / "train.log").read_text()
        assert "resumed from step 10" in log
    # Each session was measured, and the resumed survivor paid two start-ups; what the sweep
    # is compared with pays one a trial.
    resumed = survivor["number"] != 2
    assert survivor["sessions"] == 1 + resumed
    assert all(t["unpruned_from"] == "sessions" and t["startup_seconds"] > 0 for t in trials)
    compute = record(out)["compute"]
    assert compute["sessions"] == 3 + resumed
    assert compute["startup_seconds"] == pytest.approx(sum(t["startup_seconds"] for t in trials))


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


def test_a_checkpoint_location_in_the_config_gives_each_trial_a_folder_of_its_own(
    tmp_path: Path, here
) -> None:
    # One place for every trial handed trial 1 trial 0's checkpoint to resume, and its
    # learning rate was refused as a change to the run: every trial after the first failed.
    config, space = write_inputs(tmp_path, steps=20)
    place = tmp_path / "saves"
    text = config.read_text()
    config.write_text(text.replace("[checkpoint]\n", f"[checkpoint]\nlocation = '{place}'\n"))
    out = tmp_path / "sweep"
    code, _, err = here(sweep_command(config, space, out, "--trials", "2", "--pruner", "none"))
    assert code == 0, err
    assert [(t["state"], t["steps"]) for t in record(out)["trials"]] == [("complete", 20)] * 2
    for number in ("0000", "0001"):
        assert (place / "sweep" / "trials" / number / "step-00000020" / MANIFEST).is_file()
        assert "resumed" not in (out / "trials" / number / "train.log").read_text()
    assert sorted(p.name for p in place.iterdir()) == ["sweep"]  # the study's name


def test_a_trials_checkpoint_place_is_in_its_config_never_on_its_command_line() -> None:
    from thrifty.search.sweep.trial import TrialSetup, command, trial_config, trial_place

    assert trial_place("s3://b/runs/", "lr", 3) == "s3://b/runs/lr/trials/0003"
    assert trial_place("https://h/p?sig=x", "lr", 12) == "https://h/p/lr/trials/0012?sig=x"
    assert trial_place("/saves", "../up/x y", 1) == "/saves/_up_x_y/trials/0001"
    assert trial_place("/saves", "..", 1) == "/saves/_/trials/0001"
    secret = "s3://key:secret@bucket/saves"
    given = {"run": {"max_steps": 5}, "checkpoint": {"location": secret, "every": 10}}
    setup = TrialSetup(
        config_text=b"", overrides=[f"checkpoint.location={secret}", "run.seed=1"],
        out=Path("out"), env={}, pruner_name="none", pruner=None, storage=None,
        places={"checkpoint.location": secret}, given=given, study="lr",
    )  # fmt: skip
    args = command(setup, {"optimizer.lr": 0.1}, Path("out/trials/0007"))
    assert not [a for a in args if "secret" in a]
    assert args[-4:] == ["--set", "run.seed=1", "--set", "optimizer.lr=0.1"]
    from thrifty.config import toml_loads

    sent = toml_loads(trial_config(setup, 7).decode())
    assert sent["checkpoint"] == {"location": f"{secret}/lr/trials/0007", "every": 10}
    assert given["checkpoint"]["location"] == secret  # the sweep's own copy is left as it was


def test_a_trial_stopped_before_its_first_checkpoint_is_said_to_start_again_from_step_0(
    tmp_path: Path,
) -> None:
    from thrifty.search.sweep.trial import TrialSetup, resumes_from

    setup = TrialSetup(
        config_text=b"", overrides=[], out=tmp_path, env={}, pruner_name="none", pruner=None,
        storage=None,
    )  # fmt: skip
    run = tmp_path / "trials" / "0000"
    (run / "checkpoints" / "step-00000010").mkdir(parents=True)  # its manifest never written
    said = resumes_from(setup, run, 0)
    assert said == "it starts again from step 0: it had published no checkpoint yet"
    remote = TrialSetup(**{**vars(setup), "places": {"checkpoint.location": "s3://b/saves"}})
    assert resumes_from(remote, run, 0) == "it resumes from its newest checkpoint"


def test_trials_checkpoint_to_an_object_store_each_under_its_own_prefix(
    tmp_path: Path, here, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lock_holders import BUCKET, s3_options_for, s3_server

    config, space = write_inputs(tmp_path, steps=20)
    secret = "sweep-s3-secret-7f3a"
    with s3_server() as endpoint:
        options = {**s3_options_for(endpoint, monkeypatch, tmp_path), "secret": secret}
        table = "\n".join(
            [
                "[checkpoint.storage_options]",
                f'key = "{options["key"]}"',
                f'secret = "{secret}"',
                "skip_instance_cache = true",
                "[checkpoint.storage_options.client_kwargs]",
                f'endpoint_url = "{endpoint}"',
                'region_name = "us-east-1"',
            ]
        )
        text = config.read_text().replace(
            "[checkpoint]\n", f'[checkpoint]\nlocation = "s3://{BUCKET}/sweep"\n'
        )
        config.write_text(text + "\n" + table + "\n")
        out = tmp_path / "sweep"
        code, _, err = here(sweep_command(config, space, out, "--trials", "2", "--pruner", "none"))
        assert code == 0, err
        import s3fs

        fs = s3fs.S3FileSystem(**options)
        for number in ("0000", "0001"):
            assert fs.exists(f"{BUCKET}/sweep/sweep/trials/{number}/step-00000020/{MANIFEST}")
    assert [(t["state"], t["steps"]) for t in record(out)["trials"]] == [("complete", 20)] * 2
    written = [p for p in out.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]
    assert written == [] and secret not in err
