"""`thrifty chaos`: a job SIGKILLed at random moments and resumed ends with the same bits as one
that was never interrupted — checked end to end with real child processes."""

from __future__ import annotations

import json
import math

import psutil
import pytest
import torch

from thrifty.cli import main
from thrifty.commands.chaos import Attempt, compare_states, plan_kills, print_report
from thrifty.commands.chaos.report import effective_time_line
from thrifty.commands.chaos.timing import effective_time
from thrifty.errors import ThriftyError
from thrifty.rundir.files import read_metrics

EVERY = 5

# Random byte windows (no file scan: each child process pays only torch's start-up).
TASK_MODULE = """
import torch


class Windows(torch.utils.data.Dataset):
    def __init__(self, n, block_size, seed):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 256, (n, block_size + 1), generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i, :-1], "targets": self.x[i, 1:]}


def train_data(block_size=32):
    return Windows(200, block_size, 0)  # 25 micro-batches: the run crosses an epoch


def val_data(block_size=32):
    return Windows(16, block_size, 1)
"""

CONFIG = """
[run]
name = "tiny"
max_steps = 40
max_time = "1h"
device = "cpu"

[precision]
mode = "fp32"

[batch]
micro = 8

[optimizer]
lr = 0.003

[schedule]
warmup_steps = 5

[data]
num_workers = 0

[eval]
every = 20
batches = 2

[task]
model = "thrifty.demo:build_model"
train_data = "chaos_task:train_data"
val_data = "chaos_task:val_data"
model_args = { n_layer = 2, n_head = 2, n_embd = 32, block_size = 32, dropout = 0.1 }
data_args = { block_size = 32 }
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A config whose factories import from the working directory, as a user's project does."""
    (tmp_path / "chaos_task.py").write_text(TASK_MODULE)
    (tmp_path / "tiny.toml").write_text(CONFIG)
    monkeypatch.chdir(tmp_path)
    # One intra-op thread: tiny steps on a shared 2-core machine are much faster without spinning.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    finally:
        assert not psutil.Process().children(recursive=True), "a training process outlived chaos"
    out, err = capsys.readouterr()
    return code, out, err


def test_two_kills_resume_to_the_same_bits_and_report_the_effective_training_time(capsys, project):
    code, out, err = run_cli(
        capsys, "chaos", "tiny.toml", "--kills", "2", "--every", str(EVERY), "--seed", "3", "--json"
    )
    assert code == 0, out + err
    assert "not used: run.max_time" in err
    report = json.loads(out)
    assert json.loads((project / "runs" / "chaos-tiny" / "chaos.json").read_text()) == report
    assert report["match"] and report["weights_match"]
    assert report["final_step"] == {"reference": 40, "chaos": 40}
    assert report["first_loss_difference"] is None and report["losses_compared"] == 40
    assert all(section["identical"] for section in report["state"].values())
    assert report["state"]["model"]["compared"] > 0
    kills = report["kills"]
    assert [k["number"] for k in kills] == [1, 2]
    assert {k["kind"] for k in kills} == {"save", "step"}  # one of each with two kills
    for k in kills:
        assert k["resumed"] is not None and k["resumed"] % EVERY == 0
        # At worst the save in flight is lost and the steps run while it was being written.
        assert 0 <= k["steps_lost"] <= 2 * EVERY, k
        assert k["steps_lost"] == k["reached"] - k["resumed"]
    chaos_metrics = read_metrics(project / "runs" / "chaos-tiny" / "chaos" / "metrics.jsonl")
    resumed = [r["step"] for r in chaos_metrics if r.get("event") == "resumed"]
    assert resumed == [k["resumed"] for k in kills]
    # The metrics of the steps run twice were replaced: one record per step, as in the reference.
    steps = [r for r in chaos_metrics if "loss" in r]
    assert sorted(r["step"] for r in steps) == list(range(1, 41))
    # Effective training time: each surviving step's time once, over every attempt's wall time.
    effective = report["effective_time"]
    attempts = effective["attempt_seconds"]
    assert len(attempts) == 3  # two killed, one to the end
    assert all(a >= k["moment"] for a, k in zip(attempts, kills, strict=False))
    useful = sum(r["step_seconds"] for r in steps)
    assert effective["useful_step_seconds"] == pytest.approx(useful, abs=1e-3)
    assert effective["wall_seconds"] == pytest.approx(sum(attempts), abs=1e-2)
    # The fraction of the report's own figures, which it rounds (seconds to 3 decimals, the
    # fraction to 4): the bound is what the three roundings can move the ratio by.
    wall = effective["wall_seconds"]
    ratio = effective["useful_step_seconds"] / wall
    rounding = 5e-5 + 5e-4 * (1 + ratio) / wall + 1e-9
    assert effective["fraction"] == pytest.approx(ratio, abs=rounding)
    assert effective["fraction"] == pytest.approx(useful / sum(attempts), rel=0.05)
    assert 0 < effective["fraction"] < 1
    reference = read_metrics(project / "runs" / "chaos-tiny" / "reference" / "metrics.jsonl")
    ref_useful = sum(r["step_seconds"] for r in reference if "loss" in r)
    ref_wall = report["reference"]["wall_seconds"]
    assert effective["reference_fraction"] == pytest.approx(ref_useful / ref_wall, rel=1e-3)
    assert effective["seconds_per_kill"] == pytest.approx((sum(attempts) - ref_wall) / 2, abs=1e-2)
    # The table people read (what the command prints without --json).
    print_report(report)
    table = capsys.readouterr().out
    assert "thrifty chaos: 2 of 2 kills" in table
    assert "loss at every step: identical (40 steps)" in table
    assert "final weights match bit for bit: yes" in table
    percent = f"{100 * effective['fraction']:.0f}%"
    assert f"effective training time: {percent} (" in table
    assert f"in {effective['wall_seconds']:.1f} s over 3 attempts, relaunches included" in table


def test_an_out_dir_that_holds_a_chaos_run_is_refused(capsys, project):
    out_dir = project / "c"
    out_dir.mkdir()
    (out_dir / "chaos.json").write_text("{}")
    code, _, err = run_cli(capsys, "chaos", "tiny.toml", "--out", str(out_dir))
    assert code == 2
    assert (
        err.strip() == f"thrifty: error: --out {out_dir} is not empty: choose another --out, "
        "or replace its runs with --overwrite"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.toml"], "cannot read config missing.toml"),
        (["tiny.toml", "--kills", "0"], "--kills 0 is invalid: give 1 or more"),
        (["tiny.toml", "--every", "0"], "--every 0 is invalid"),
        (["tiny.toml", "--timeout", "0"], "--timeout 0 is invalid"),
        (["tiny.toml", "--set", "batch.micro=zero"], "batch.micro = 'zero' is invalid"),
        (["tiny.toml", "--set", "run.max_steps=0"], "run.max_steps = 0 is invalid"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, project, args, message):
    code, out, err = run_cli(capsys, "chaos", *args)
    assert code == 2
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and message in err


def test_a_wall_clock_budget_alone_is_refused(capsys, project):
    (project / "timed.toml").write_text(CONFIG.replace("max_steps = 40\n", ""))
    code, _, err = run_cli(capsys, "chaos", "timed.toml")
    assert code == 2
    assert "needs a budget that ends both runs at the same step" in err
    assert "run.max_time is a wall-clock budget" in err


def test_a_reference_run_that_fails_shows_its_last_line(capsys, project):
    code, _, err = run_cli(capsys, "chaos", "tiny.toml", "--set", "task.model=chaos_task:nothing")
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("thrifty: error: the reference run failed (exit 2): task.model = ")
    assert "chaos_task has no attribute 'nothing'" in line and "reference.log" in line


def test_a_run_past_the_timeout_is_stopped(capsys, project):
    code, _, err = run_cli(capsys, "chaos", "tiny.toml", "--timeout", "0.5")
    assert code == 2
    assert "the reference run ran past --timeout 0.5 s and was stopped" in err.splitlines()[-1]


def test_too_few_steps_for_the_kills(capsys, project):
    with pytest.raises(ThriftyError, match="too few for 3 kills after the first checkpoint"):
        plan_kills(3, 5, 8, seed=0)


# --- the parts, without processes ------------------------------------------------------------


def test_kills_spread_over_the_run_after_the_first_checkpoint():
    for seed in range(20):
        plan = plan_kills(4, 5, 100, seed)
        targets = [k.target for k in plan]
        assert targets == sorted(set(targets)) and targets[0] > 5 and targets[-1] < 100
        assert sum(k.kind == "save" for k in plan) == 2
        assert all(k.target % 5 == 0 for k in plan if k.kind == "save")
    assert plan_kills(4, 5, 100, 7) == plan_kills(4, 5, 100, 7)


def _lines(*records):
    return [json.dumps(r).encode() for r in records]


def seen(lines, before):
    attempt = Attempt(before)
    attempt.update(lines)
    return attempt.reached, attempt.resumed


def test_an_attempts_records_are_the_lines_after_what_it_kept():
    first = _lines(*({"step": s, "loss": 1.0} for s in range(1, 8)))
    assert seen(first, []) == (7, None)
    # Resumed from step 5: the records after 5 are dropped, then come its own.
    kept = first[:5]
    assert seen(kept, first) == (None, None)  # truncated, nothing of its own yet
    second = kept + _lines({"step": 5, "event": "resumed"}, {"step": 6, "loss": 2.0})
    assert seen(second, first) == (6, 5)
    # Killed before its next save, resumed from step 5 again: the old event is kept.
    third = second[:6] + _lines({"step": 5, "event": "resumed"})
    assert seen(third, second) == (5, 5)
    # Resumed at the very last line of the previous file.
    fourth = third + _lines({"step": 5, "event": "resumed"})
    assert seen(fourth, third) == (5, 5)
    # Fed as the file grows, and again after the file is replaced.
    attempt = Attempt(first)
    lines = list(kept)
    attempt.update(lines)
    lines += _lines({"step": 5, "event": "resumed"}, {"step": 6, "loss": 2.0})
    attempt.update(lines)
    assert (attempt.reached, attempt.resumed, attempt.records) == (6, 5, 2)
    lines.append(b'{"step": 7, "lo')  # not JSON: skipped
    attempt.update(lines)
    assert attempt.reached == 6
    attempt.update(list(third))
    assert (attempt.reached, attempt.resumed) == (5, 5)


def test_states_are_compared_bit_for_bit():
    a = {
        "model": {"w": torch.tensor([0.0, 1.0]), "b": torch.tensor([math.nan])},
        "progress": {"step": 3, "seconds": 1.5, "val_loss": math.nan},
        "config": {"out": "a"},
    }
    b = {
        "model": {"w": torch.tensor([-0.0, 1.0]), "b": torch.tensor([math.nan])},
        "progress": {"step": 3, "seconds": 9.0, "val_loss": math.nan},
        "config": {"out": "b"},
    }
    sections = compare_states(a, b)
    assert set(sections) == {"model", "progress"}  # the config names the run directory
    assert sections["model"]["differs"] == ["model.w"]  # -0.0 is not 0.0, bit for bit
    assert sections["progress"]["identical"]  # wall time is not compared; NaN is NaN
    b["model"]["w"] = torch.tensor([0.0, 1.0], dtype=torch.float64)
    assert "float32" in compare_states(a, b)["model"]["differs"][0]
    b["model"] = {"w": a["model"]["w"]}
    assert compare_states(a, b)["model"]["differs"] == ["model.b"]


def test_the_effective_time_counts_each_surviving_step_once_over_every_attempts_wall_time():
    # Steps 1-4 survive (the records of steps redone after a kill were replaced on resume).
    records = [{"step": s, "loss": 1.0, "step_seconds": 0.5} for s in range(1, 5)]
    records.insert(2, {"step": 2, "event": "resumed", "step_seconds": 9.0})  # not a step
    reference = [{"step": s, "loss": 1.0, "step_seconds": 0.5} for s in range(1, 5)]
    effective = effective_time(records, [1.5, 2.5, 1.0], reference, 2.5)
    assert effective == {
        "useful_step_seconds": 2.0,
        "wall_seconds": 5.0,
        "attempt_seconds": [1.5, 2.5, 1.0],
        "fraction": 0.4,
        "reference_fraction": 0.8,
        "seconds_per_kill": 1.25,
    }
    assert effective_time_line(effective) == (
        "effective training time: 40% (2.0 s of steps in 5.0 s over 3 attempts, relaunches "
        "included; the reference run: 80%); each kill cost 1.2 s"
    )
