"""`thrifty tune` stopped: a SIGTERM to the tune (or to its whole process group) ends the running
trial, then the tune, with one line and exit code 75; a SIGKILL of the tune takes its trial with
it; and the same command resumes the search without running the finished trials again.

Every test runs the real command in a process of its own, with real trials of a tiny model
from this file; a trial is made slow (its forward sleeps) through TUNE_TEST_SLOW."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dist_task import Net
from test_tune import CONFIG
from thrifty import cli

TESTS = Path(__file__).resolve().parent
PATIENCE = 180.0  # seconds to wait for a trial to reach training on a busy machine
TUNE_BUDGET = 600.0  # the tune's --budget 10m

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="finds the trial's process in /proc"
)


# --------------------------------------------------------------------------------------------
# The model the trials import


class Slow(Net):
    """Sleeps in each forward of a micro-batch of the size TUNE_TEST_SLOW names ("16:600":
    600 s at 16 samples), so a trial of that size is still running when the test stops the
    tune; it says so in TUNE_TEST_MARKS.sleeping first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        size, _, seconds = os.environ.get("TUNE_TEST_SLOW", "0:0").partition(":")
        if x.shape[0] == int(size):
            Path(os.environ["TUNE_TEST_MARKS"] + ".sleeping").write_text(str(os.getpid()))
            time.sleep(float(seconds))
        return super().forward(x)


def slow() -> torch.nn.Module:
    """The model; each trial process that builds it adds a line to TUNE_TEST_MARKS."""
    marks = os.environ.get("TUNE_TEST_MARKS")
    if marks:
        with open(marks, "a") as f:
            f.write(f"{os.getpid()}\n")
    return Slow()


# --------------------------------------------------------------------------------------------
# Helpers


class Tune:
    """`thrifty tune` in a session of its own (its process group is its pid): the baseline at
    micro-batch 8, then one trial at 16."""

    def __init__(self, tmp_path: Path, slow_at: str | None) -> None:
        self.config = tmp_path / "job.toml"
        self.config.write_text(CONFIG.format(model="test_tune_stop:slow"))
        self.out = tmp_path / "tune"
        self.marks = tmp_path / "marks"
        self.env = {**os.environ, "TUNE_TEST_MARKS": str(self.marks)}
        self.env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p
        )
        if slow_at:
            self.env["TUNE_TEST_SLOW"] = slow_at
        self.proc = self.start()

    def command(self) -> list[str]:
        options = ["--levers", "micro", "--micro", "16", "--steps", "3", "--budget", "10m"]
        return [
            sys.executable,
            "-m",
            "thrifty",
            "tune",
            str(self.config),
            *options,
            "--out",
            str(self.out),
        ]

    def restart(self) -> None:
        """The same command again in a process of its own, once the last one has ended."""
        Path(f"{self.marks}.sleeping").unlink()
        self.proc = self.start()

    def start(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.command(),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )

    def trial_sleeping(self, name: str) -> int:
        """The pid of trial `name` once it sleeps in its slow forward."""
        sleeping = Path(f"{self.marks}.sleeping")
        deadline = time.monotonic() + PATIENCE
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()
            if sleeping.exists() and sleeping.read_text():
                (pid,) = trial_processes(self.proc.pid)
                assert pid == int(sleeping.read_text())
                assert (self.out / "trials" / name).is_dir()
                return pid
            time.sleep(0.2)
        raise AssertionError(f"trial {name} did not reach its slow forward in {PATIENCE:.0f} s")

    def finish(self, timeout: float = PATIENCE) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err

    def again(self, monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, str, str]:
        """The same command again, to its end, within the tune's own --budget; run here (the
        stop was the other process's; its trials are processes of their own). The trial at 16
        is no longer held for the test but still slower than the baseline (half a second in
        each forward), so it usually wins nothing and no paired comparison follows: what is
        tested here is the stop and the resume; the comparisons have tests of their own."""
        self.env["TUNE_TEST_SLOW"] = "16:0.5"
        for key in ("TUNE_TEST_MARKS", "TUNE_TEST_SLOW", "PYTHONPATH"):
            monkeypatch.setenv(key, self.env[key])
        code = cli.main(self.command()[3:])
        out, err = capsys.readouterr()
        return code, out, err

    def trials_built(self) -> int:
        return len(self.marks.read_text().splitlines())

    def comparison_runs(self) -> list[str]:
        """The paired comparisons' runs the record holds (01-micro.a0, ...)."""
        return [b["name"] for c in self.record()["comparisons"] for b in c["blocks"]]

    def record(self) -> dict:
        return json.loads((self.out / "tune.json").read_text())


def trial_processes(parent: int) -> list[int]:
    """The warm worker processes (which run the trials) `parent` started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == parent and b"thrifty.worker" in cmdline:
            found.append(int(entry.name))
    return found


def gone(pid: int, timeout: float = 20.0) -> bool:
    """The process ended (a zombie no one reaped yet counts: it runs nothing) within `timeout`
    seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


def stopped_line(signal_name: str, trial: str, kept: str, out: Path) -> str:
    return (
        f"thrifty tune: stopped by {signal_name}: trial {trial} was ended and runs again on "
        f"resume; {kept} kept in {out}: run the same command again to resume"
    )


# --------------------------------------------------------------------------------------------
# Tests


def test_a_sigterm_to_the_tunes_group_then_a_sigkill_each_end_its_trial_and_the_command_resumes(
    tmp_path, monkeypatch, capsys
):
    # One tune stopped twice while trial 01-micro runs, then run to its end: a SIGTERM to its
    # process group (as a scheduler sends it), the same command again in a process of its own,
    # a SIGKILL of that one, and the same command once more. The baseline runs only once.
    tune = Tune(tmp_path, slow_at="16:600")
    trial = tune.trial_sleeping("01-micro")
    os.killpg(tune.proc.pid, signal.SIGTERM)
    code, out, err = tune.finish()
    assert gone(trial)
    assert code == 75, err
    assert last_line(err) == stopped_line("SIGTERM", "01-micro", "1 finished trial", tune.out)
    assert "Traceback" not in err and out == ""
    kept = tune.record()
    assert kept["state"] == "stopped"
    assert [t["name"] for t in kept["trials"]] == ["00-baseline"]
    assert tune.trials_built() == 2

    tune.restart()
    trial = tune.trial_sleeping("01-micro")
    assert tune.trials_built() == 3  # only 01-micro ran again: the baseline was kept
    os.kill(tune.proc.pid, signal.SIGKILL)
    tune.finish()
    assert gone(trial)
    assert tune.record()["state"] == "running"  # as the killed tune left it

    code, out, err = tune.again(monkeypatch, capsys)
    assert code == 0, err
    # Only 01-micro ran again, then the comparisons' runs (none where the slower 01-micro lost
    # its trial, as it does unless the machine was far busier for the baseline): the baseline
    # was kept.
    assert tune.trials_built() == 4 + len(tune.comparison_runs())
    assert "00-baseline: " in err and "(kept from the earlier run)" in err
    record = tune.record()
    assert record["state"] == "finished"
    assert [(t["name"], t["status"]) for t in record["trials"]] == [
        ("00-baseline", "ok"),
        ("01-micro", "ok"),
    ]
    assert record["trials"][0] == kept["trials"][0]
    assert (tune.out / "winner.toml").exists()


def test_a_sigint_to_the_tune_stops_it_like_a_sigterm(tmp_path):
    tune = Tune(tmp_path, slow_at="8:600")
    trial = tune.trial_sleeping("00-baseline")
    os.kill(tune.proc.pid, signal.SIGINT)
    code, _, err = tune.finish()
    assert gone(trial)
    assert code == 75, err
    assert last_line(err) == stopped_line("SIGINT", "00-baseline", "0 finished trials", tune.out)


def test_a_sigterm_to_every_process_of_the_job_keeps_the_trial_for_the_resume(tmp_path):
    # A scheduler that signals every process of the job (Slurm's scancel) reaches the trial
    # too: its end is part of the stop, not a result. Made certain by holding the tune still
    # until the trial has died of its own SIGTERM. It sleeps in its set-up, in the FLOP
    # count's step of three samples, where a stop signal ends a run at once (in a training
    # step it would wait for the step's end).
    tune = Tune(tmp_path, slow_at="3:600")
    trial = tune.trial_sleeping("00-baseline")
    os.kill(tune.proc.pid, signal.SIGSTOP)
    os.kill(trial, signal.SIGTERM)
    assert gone(trial)
    os.kill(tune.proc.pid, signal.SIGTERM)
    os.kill(tune.proc.pid, signal.SIGCONT)
    code, _, err = tune.finish()
    assert code == 75, err
    assert last_line(err) == stopped_line("SIGTERM", "00-baseline", "0 finished trials", tune.out)
    assert tune.record()["trials"] == []
