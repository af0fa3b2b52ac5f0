"""Which signals mean "preempted": SIGTERM, SIGINT and SIGUSR1 (Slurm's `--signal=USR1@N`) by
default, any others through `spot.signals`; and the `--nprocs` launcher forwards them and waits
for the emergency upload before it kills its workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from thrifty.checkpointing.saving.preemption import PreemptionWatcher
from thrifty.config import SpotConfig
from thrifty.errors import ConfigError
from thrifty.strategies.launcher import _shutdown_settings, forwarded_signals, worker_grace_seconds

TIMEOUT = 120  # seconds a training process may take before the test fails instead of hanging

JOB = """
[run]
max_steps = {steps}
log_every = 1
progress = "off"
[batch]
micro = 4
[data]
num_workers = 0
[schedule]
decay = "constant"
[checkpoint]
every = "off"
[spot]
provider = "none"
{signals}
[task]
model = "thrifty.demo:build_model"
train_data = "thrifty.demo:train_dataset"
model_args = {{ n_layer = 2, n_head = 2, n_embd = 32, block_size = 32 }}
data_args = {{ block_size = 32, max_bytes = 100000 }}
"""


def job(tmp_path: Path, signals: list[str] | None = None, steps: int = 400) -> Path:
    config = tmp_path / "job.toml"
    line = "" if signals is None else f"signals = {signals!r}".replace("'", '"')
    config.write_text(JOB.format(steps=steps, signals=line))
    return config


# --- configuration -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signals", "why"),
    [
        (["SIGFOO"], "'SIGFOO' is not a signal on this system"),
        (["SIGTERM", "sigusr1"], "'sigusr1' is not a signal on this system"),
        (["SIGKILL"], "SIGKILL cannot be caught"),
    ],
)
def test_a_name_that_is_not_a_catchable_signal_is_one_line_naming_the_field(signals, why):
    with pytest.raises(ConfigError) as caught:
        SpotConfig(signals=signals)
    assert str(caught.value) == (
        f"spot.signals = {signals!r} is invalid: {why}; use names like SIGTERM, SIGUSR1"
    )


def test_a_bad_signal_in_a_config_file_exits_2_with_one_line(tmp_path, capsys):
    from thrifty.cli import main

    assert main(["train", str(job(tmp_path, ["SIGFOO"]))]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (
        "thrifty: error: spot.signals = ['SIGFOO'] is invalid: 'SIGFOO' is not a signal on this "
        "system; use names like SIGTERM, SIGUSR1"
    )


def test_the_default_signals_are_sigterm_sigint_and_sigusr1():
    assert SpotConfig().signals == ["SIGTERM", "SIGINT", "SIGUSR1"]
    assert PreemptionWatcher("none").signals == (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


# --- the watcher ---------------------------------------------------------------------------------


def test_sigusr1_raises_the_flag_like_sigterm_and_stop_restores_the_handler():
    before = signal.getsignal(signal.SIGUSR1)
    with PreemptionWatcher("none") as watcher:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert watcher.requested
        assert watcher.reason == "received SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before


def test_configured_signals_replace_the_default_ones():
    term_before = signal.getsignal(signal.SIGTERM)
    with PreemptionWatcher("none", signals=["SIGUSR2"]) as watcher:
        assert signal.getsignal(signal.SIGTERM) is term_before  # no longer watched
        os.kill(os.getpid(), signal.SIGUSR2)
        assert watcher.requested and watcher.reason == "received SIGUSR2"


# --- the launcher --------------------------------------------------------------------------------


def test_the_launcher_forwards_the_watched_signals_and_waits_past_the_upload_deadline(
    monkeypatch,
):
    from dataclasses import fields

    from torch.distributed.launcher.api import LaunchConfig

    assert forwarded_signals() == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    assert forwarded_signals(["SIGUSR2"]) == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"
    assert worker_grace_seconds(90.0) == 120  # torch's own default would be 30
    names = {f.name for f in fields(LaunchConfig)}
    monkeypatch.delenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", raising=False)
    settings = _shutdown_settings(names, ["SIGUSR1"], 300.0)
    assert settings == {
        "signals_to_handle": "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1",
        "shutdown_timeout": 330,
    }
    monkeypatch.setenv("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "600")  # the user's choice wins
    assert "shutdown_timeout" not in _shutdown_settings(names, ["SIGUSR1"], 300.0)
    assert _shutdown_settings(set(), ["SIGUSR1"], 300.0) == {}  # a torch without them


def test_a_bad_signal_for_the_launcher_is_refused_before_anything_starts():
    from thrifty.strategies.launcher import launch

    with pytest.raises(ConfigError, match=r"^spot.signals = \['SIGFOO'\] is invalid"):
        launch(2, ["train", "job.toml"], signals=["SIGFOO"])


# --- real processes ------------------------------------------------------------------------------


def signal_after(command: list[str], out: Path, signum: int, steps: int = 3, pid=None):
    """Start `command`, send `signum` once `steps` losses are logged in `out`, wait (bounded).
    `pid(proc)` picks the process to signal (default: the one started)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THRIFTY_SPOT_PROVIDER": "none"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
    )
    try:
        metrics = out / "metrics.jsonl"
        deadline = time.monotonic() + TIMEOUT
        while not (metrics.exists() and metrics.read_text().count('"loss"') >= steps):
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.poll() is not None else "timeout"
            )
            time.sleep(0.05)
        os.kill(proc.pid if pid is None else pid(proc), signum)
        stdout, stderr = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, stdout, stderr


def emergency_checkpoints(out: Path) -> list[str]:
    return [p.parent.name for p in (out / "checkpoints").glob("step-*/manifest.json")]


@pytest.mark.parametrize(
    ("signals", "signum"),
    [
        (None, signal.SIGUSR1),
        (["SIGUSR2"], signal.SIGUSR2),
    ],
)
def test_a_watched_signal_to_thrifty_train_saves_and_exits_75(tmp_path, signals, signum):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "thrifty", "train", str(job(tmp_path, signals))]
    code, stdout, stderr = signal_after([*command, "--out", str(out)], out, signum)
    name = signal.Signals(signum).name
    assert code == 75, stderr[-3000:]
    assert f"received {name}: saving an emergency checkpoint" in stderr
    assert "preempted at step" in stdout
    assert len(emergency_checkpoints(out)) == 1


def test_sigusr1_to_the_nprocs_launcher_reaches_every_rank_and_ends_with_75(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "thrifty", "train", str(job(tmp_path)), "--nprocs", "2"]
    code, _, stderr = signal_after([*command, "--out", str(out)], out, signal.SIGUSR1)
    assert code == 75, stderr[-3000:]
    assert "thrifty: stopped by SIGUSR1; every rank was told to stop, saving a checkpoint" in stderr
    assert "saving an emergency checkpoint" in stderr and "Traceback" not in stderr
    assert len(emergency_checkpoints(out)) == 1
