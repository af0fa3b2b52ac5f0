"""thrifty inside the Hugging Face Trainer and Lightning, with the real frameworks: a stop
signal to the whole process group saves through the framework's own save and exits 75; the
same command resumes from that step and ends with the uninterrupted run's weights, bit for bit;
a kill during a save resumes the previous complete checkpoint; `thrifty runs` bills every
attempt once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from thrifty import cli

pytest.importorskip("transformers")
pytest.importorskip("lightning")

HERE = Path(__file__).resolve().parent
STEPS = 12
JOBS = {"transformers": HERE / "hf_job.py", "lightning": HERE / "pl_job.py"}


def run_job(framework: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The framework's job in a process group of its own (its SIGTERM goes to the group)."""
    return subprocess.run(
        [sys.executable, str(JOBS[framework]), str(out), str(STEPS), *args],
        capture_output=True,
        text=True,
        timeout=600,
        start_new_session=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )


def weights(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, torch.Tensor]]:
    found = {}
    for framework in JOBS:
        out = tmp_path_factory.mktemp(f"{framework}-whole")
        done = run_job(framework, out)
        assert done.returncode == 0, done.stderr[-3000:]
        found[framework] = weights(out)
    return found


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def ledger(out: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    capsys.readouterr()
    assert cli.main(["runs", str(out), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("framework", list(JOBS))
def test_sigterm_to_the_group_saves_exits_75_and_resumes_to_the_same_weights(
    framework, tmp_path, uninterrupted, capsys
):
    out = tmp_path / "job"
    stopped = run_job(framework, out, "--stop-at", "5")
    assert stopped.returncode == 75, stopped.stderr[-3000:]
    assert (
        f"{framework}: preempted (received SIGTERM) at step 5, saved as step 5: run the same "
        "command to resume (exit code 75)"
    ) in stopped.stderr
    first = json.loads((out / "thrifty" / "summary.json").read_text())
    assert (first["stop_reason"], first["steps"]) == ("preempted", 5)

    resumed = run_job(framework, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{framework}: resumed at step 5" in resumed.stderr  # not from 0, not a periodic save
    assert same(weights(out), uninterrupted[framework])

    second = json.loads((out / "thrifty" / "summary.json").read_text())
    (job,) = ledger(out, capsys)["runs"]  # one job, not one per attempt
    assert job["steps"] == STEPS and job["state"] == "finished"
    # Every attempt billed once: the first's wall time, then the second's, at $3.6/GPU-hour.
    paid = first["cost"]["usd"] + second["wall_seconds"] * 3.6 / 3600
    assert job["usd"] == pytest.approx(paid, rel=1e-6)
    assert job["usd"] == pytest.approx(second["cost"]["usd"], rel=1e-9)
    assert job["wasted_usd"] == 0.0  # the emergency save kept every step


@pytest.mark.parametrize("framework", list(JOBS))
def test_a_kill_during_the_save_resumes_the_previous_complete_checkpoint(
    framework, tmp_path, uninterrupted
):
    out = tmp_path / "job"
    every = ["--save-steps", "4"] if framework == "transformers" else ["--every", "4"]
    killed = run_job(framework, out, *every, "--kill-saving", "8")
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = run_job(framework, out, *every)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "step-8.ckpt is not resumed from" in resumed.stderr or (
        "checkpoint-8 is not resumed from" in resumed.stderr
    )
    assert f"{framework}: resumed at step 4" in resumed.stderr
    assert same(weights(out), uninterrupted[framework])


@pytest.mark.parametrize("framework", list(JOBS))
def test_a_loss_that_is_not_finite_stops_the_run_without_a_save_and_exits_1(framework, tmp_path):
    out = tmp_path / "job"
    every = ["--save-steps", "4"] if framework == "transformers" else ["--every", "4"]
    diverged = run_job(framework, out, *every, "--nan-at", "5")
    assert diverged.returncode == 1, diverged.stderr[-3000:]
    summary = json.loads((out / "thrifty" / "summary.json").read_text())
    assert summary["stop_reason"] == "diverged"
    assert summary["steps"] < STEPS  # stopped, not trained to the end
    assert "is nan at step" in summary["why"]
    assert f"{framework}: stopping at step {summary['steps']}: " in diverged.stderr
    # The newest save is the last good one: none was written at or after the first NaN step.
    saved = sorted(out.rglob("*thrifty-manifest.json")) + sorted(out.rglob("step-*.ckpt.json"))
    steps = [json.loads(p.read_text())["step"] for p in saved]
    assert steps == [4], steps


def test_importing_the_integrations_loads_no_framework():
    code = (
        "import sys, thrifty.integrations, thrifty.integrations.session; "
        "print([m for m in ('transformers', 'lightning') if m in sys.modules])"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "[]", proc.stderr


@pytest.mark.parametrize(
    ("config", "line"),
    [
        (
            {"batch": {"micro": 8}},
            "[batch] does not apply inside transformers: the framework's own arguments set it; "
            "thrifty takes [run], [checkpoint], [spot], [cost], [early_stopping], [guard], "
            "[measure], [log] there",
        ),
        (
            {"run": {"max_steps": 10}},
            "run.max_steps does not apply inside transformers: its own arguments say how long to "
            "train; thrifty takes run.name and run.log_every there",
        ),
        (
            {"checkpoint": {"location": "s3://bucket/x"}},
            "checkpoint.location does not apply inside transformers: the framework saves into its "
            "own output directory; thrifty takes checkpoint.every, checkpoint.interruption_rate, "
            "checkpoint.max_interval, checkpoint.resume, checkpoint.keep_last there",
        ),
        ({"cost": {"usd_per_gpu_hour": -1}}, "cost.usd_per_gpu_hour = -1"),
    ],
)
def test_a_section_that_does_not_apply_is_one_line(config, line):
    from thrifty.errors import ConfigError
    from thrifty.integrations.session import load_sections

    with pytest.raises(ConfigError) as caught:
        load_sections(config, "transformers")
    assert str(caught.value).startswith(line), str(caught.value)


def test_a_second_job_on_the_same_output_directory_is_refused_naming_the_first(tmp_path):
    from thrifty.errors import ThriftyError
    from thrifty.integrations.session import Session, load_sections

    sections = load_sections({"spot": {"provider": "none"}}, "transformers")
    first = Session(sections, tmp_path, framework="transformers")
    first.begin(0)
    try:
        second = Session(sections, tmp_path, framework="transformers")
        with pytest.raises(ThriftyError) as caught:
            second.begin(0)
        assert str(caught.value).startswith(f"run directory {tmp_path / 'thrifty'} is in use")
        assert "give it another output directory" in str(caught.value)
        assert f"pid {os.getpid()}" in str(caught.value)
    finally:
        first.end()
    again = Session(sections, tmp_path, framework="transformers")  # released: the next takes it
    again.begin(0)
    assert again.end() == 0
