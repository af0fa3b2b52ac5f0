"""`thrifty tune` and `thrifty.tune()`: the search's order, pruning and budget; the table, the
JSON and the waterfall; the winner TOML `thrifty train` runs as is; and bad input, each one
line with exit code 2 and the finished trials kept.

The search's logic runs on trials that take time on a fake clock; a few tests run real trials
(`python -m thrifty train` in a child process) of a tiny model from this file."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import thrifty
from dist_task import Net
from thrifty import cli
from thrifty.config import load_config, toml_loads
from thrifty.errors import ConfigError, ThriftyError
from thrifty.search.tune import compare, session
from thrifty.search.tune.api import import_path
from thrifty.search.tune.configs import trial_config, winner_config
from thrifty.search.tune.report import print_report, result_dict
from thrifty.search.tune.search import Search
from thrifty.search.tune.session import make_plan, run_tune
from thrifty.search.tune.space import AUTO, COMPILE_MODES, LEVERS, POLICIES, Setting, Space
from thrifty.search.tune.trials import Candidate, WorkerTrials, failed, from_summary, stopped

TESTS = Path(__file__).resolve().parent

CONFIG = """
[run]
name = "tiny"
max_steps = 300
device = "cpu"
seed = 7
log_every = 1

[precision]
mode = "fp32"

[batch]
micro = 8
effective = 16

[optimizer]
lr = 0.01
weight_decay = 0.05

[schedule]
warmup_steps = 5
decay = "cosine"

[data]
num_workers = 0
shuffle = true

[task]
model = "{model}"
train_data = "dist_task:train_data"
optimizer = "dist_task:sgd"
loss_fn = "dist_task:cross_entropy"
"""


# --------------------------------------------------------------------------------------------
# Models the real trials import (this file is importable as `test_tune` with tests/ on the path)


class CrashesWhenCompiled(Net):
    """Runs eagerly; under torch.compile its trace fails (a compile crash, for real)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            x = x.reshape(-1, 7)  # 12 features: no such shape, so tracing raises
        return super().forward(x)


def crashes_when_compiled() -> torch.nn.Module:
    return CrashesWhenCompiled()


class OutOfMemory(Net):
    """Every forward runs out of memory, at any micro-batch."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def out_of_memory() -> torch.nn.Module:
    return OutOfMemory()


class WaitsPerForward(Net):
    """Each forward waits 100 ms, a fixed cost per micro-batch (and no CPU's: a busy machine
    slows it little, next to the wait): 8 times the micro-batch, nearly 8 times the samples
    per second, steadily enough that two paired rounds tell."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.1)
        return super().forward(x)


def waits_per_forward() -> torch.nn.Module:
    return WaitsPerForward()


# --------------------------------------------------------------------------------------------
# Fixtures and fakes


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(CONFIG.format(model="dist_task:model"))
    return path


@pytest.fixture
def children_import_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trial processes import the task factories of tests/ (dist_task, test_tune)."""
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)


class FakeTrials:
    """Trials that each take `seconds` on a fake clock. `rate(setting)` gives samples per
    second (tokens too, at 32 per sample); `fail(setting)` an error line, or None; `fits` the
    largest micro-batch per checkpointing policy that an "auto" trial finds; `room` what an
    "auto" trial predicts each heavier policy would fit, as on a GPU (`micro_that_fits`);
    `took(setting)` its seconds, when they differ."""

    def __init__(
        self,
        rate=None,
        fail=None,
        seconds=10.0,
        fits=None,
        effective=16,
        took=None,
        code=1,
        room=None,
    ):
        self.room = room or {}
        self.code = code  # the exit code of a failing trial
        self.rate = rate or (lambda s: 100.0)
        self.fail = fail or (lambda s: None)
        self.seconds = seconds
        self.took = took or (lambda s: seconds)
        self.fits = fits or {}
        self.effective = effective
        self.now = 0.0
        self.calls: list[Candidate] = []

    def clock(self) -> float:
        return self.now

    @property
    def trials(self) -> list[Candidate]:
        """The screening trials run, without the paired comparisons' runs (NAME.a0, ...)."""
        return [c for c in self.calls if "." not in c.name]

    def __call__(self, candidate: Candidate, deadline: float):
        self.calls.append(candidate)
        s, run_dir = candidate.setting, Path("trials") / candidate.name
        took = self.took(s)
        if self.now + took > deadline:
            spent, self.now = deadline - self.now, deadline
            return stopped(candidate, spent, run_dir)
        self.now += took
        error = self.fail(s)
        if error is not None:
            return failed(candidate, took, run_dir, self.code, error)
        micro = s.micro if s.micro != AUTO else self.fits.get(s.checkpointing, self.effective)
        workers = 2 if s.num_workers == AUTO else s.num_workers
        rate = self.rate(s.with_(micro=micro, num_workers=workers))
        summary = {
            "tokens_per_second": rate * 32,
            "samples_per_second": rate,
            "step_seconds": self.effective / rate,
            "mfu": 0.25,
            "micro_batch": micro,
            "accumulation_steps": self.effective // micro,
            "num_workers": workers,
            "precision": "fp32" if s.precision == "auto" else s.precision,
        }
        if s.micro == AUTO and micro < self.effective:  # what "auto" tried, as summary.json has it
            sizes = [2**i for i in range(micro.bit_length())] + [2 * micro]
            tried = [{"micro": m, "fits": m <= micro, "peak_bytes": None} for m in sizes]
            summary["micro_batch_search"] = {"chosen": micro, "margin": 0.1, "tried": tried}
            heavier = POLICIES[POLICIES.index(s.checkpointing) + 1 :]
            summary["activation_checkpointing_fits"] = {
                p: size for p, size in self.room.items() if p in heavier
            }
        return from_summary(candidate, summary, took, run_dir, peak_rss=3 * 2**30)


BASE = Setting(precision="fp32", checkpointing="off", micro=8, compile="off", num_workers=0)


def space(levers=LEVERS, **changes) -> Space:
    """Every value of each lever in `levers` (as `build_space` gives them), then `changes`."""
    values = {
        "precisions": ("bf16", "fp16", "fp32") if "precision" in levers else (),
        "policies": POLICIES if "checkpointing" in levers else (),
        "micros": (AUTO,) if "micro" in levers else (),
        "compile_modes": COMPILE_MODES if "compile" in levers else (),
        **changes,
    }
    return Space(levers=tuple(levers), effective=16, **values)


def search(fake: FakeTrials, budget: float = 1000.0, **changes) -> Search:
    return Search(space(**changes), BASE, fake, deadline=budget, clock=fake.clock)


def faster(**factors):
    """A rate that multiplies 100 samples/s by the factor of each value a setting has."""

    def rate(s: Setting) -> float:
        value = 100.0
        for field, table in factors.items():
            value *= table.get(getattr(s, field), 1.0)
        return value

    return rate


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if line.startswith("thrifty: error: ")]
    assert len(errors) == 1, err
    return errors[0]


# --------------------------------------------------------------------------------------------
# The search: order, pruning, budget


def test_each_stage_starts_from_the_best_setting_so_far():
    rate = faster(
        num_workers={2: 1.1}, precision={"bf16": 2.0}, micro={16: 1.5}, compile={"default": 1.2}
    )
    fake = FakeTrials(rate=rate)
    outcome = search(fake).run()
    assert [c.stage for c in fake.trials] == [
        "baseline",
        "workers",
        "precision",
        "micro",
        "compile",
        "compile",
    ]
    compiled = fake.trials[-2].setting
    assert (compiled.precision, compiled.micro, compiled.num_workers) == ("bf16", 16, 2)
    # Each stage's best beat the incumbent in its trial, then in alternating runs, and the
    # winner was re-measured against the config as given.
    decided = [(c.stage, c.decision, round(c.estimate.ratio, 4)) for c in outcome.comparisons]
    assert decided == [
        ("workers", "kept", 1.1),
        ("precision", "kept", 2.0),
        ("micro", "kept", 1.5),
        ("compile", "kept", 1.2),
        ("final", "kept", round(1.1 * 2.0 * 1.5 * 1.2, 4)),
    ]
    assert [c.name for c in outcome.comparisons[1].blocks] == [
        "02-precision.a0",
        "02-precision.b1",
        "02-precision.a1",
        "02-precision.b2",
        "02-precision.a2",
    ]
    assert outcome.winner is outcome.trials[-2]
    assert outcome.winner.resolved.compile == "default"
    assert [t.stage for t in outcome.path] == [
        "baseline",
        "workers",
        "precision",
        "micro",
        "compile",
    ]


def test_a_trial_whose_auto_resolved_to_the_incumbents_settings_is_no_lever():
    """workers "auto" measured the count the config fixes: its one fast reading is noise, and
    no paired comparison may keep a change of nothing."""
    readings = iter([100.0, 532.0, *[100.0 + i for i in range(20)]])
    fake = FakeTrials(rate=lambda s: next(readings))
    base = BASE.with_(num_workers=2)  # what the fake's "auto" resolves to
    outcome = Search(space(levers=("workers",)), base, fake, deadline=1000.0, clock=fake.clock)
    outcome = outcome.run()
    assert [c.name for c in fake.calls] == ["00-baseline", "01-workers"]
    assert outcome.trials[1].resolved == outcome.trials[0].resolved
    assert outcome.comparisons == [] and outcome.path == [outcome.baseline]
    assert outcome.winner is outcome.baseline


def test_fp16_is_not_tried_once_bf16_ran():
    fake = FakeTrials()
    outcome = search(fake, levers=("precision",)).run()
    assert [c.setting.precision for c in fake.calls] == ["fp32", "bf16"]
    (skipped,) = outcome.skipped
    assert (skipped.kind, skipped.setting.precision) == ("pruned", "fp16")
    assert "cannot beat 01-precision" in skipped.reason


def test_heavier_checkpointing_is_not_tried_once_a_lighter_policy_fits_the_effective_batch():
    fake = FakeTrials(fits={"off": 16})
    outcome = search(fake, levers=("micro", "checkpointing")).run()
    assert [(c.setting.checkpointing, c.setting.micro) for c in fake.calls[1:]] == [("off", AUTO)]
    assert [(s.setting.checkpointing, s.kind) for s in outcome.skipped] == [
        ("every_other", "pruned"),
        ("all", "pruned"),
    ]
    assert "more recompute cannot win" in outcome.skipped[0].reason


def test_heavier_checkpointing_is_tried_when_it_makes_room_for_a_larger_micro_batch():
    # Without checkpointing only 4 fit; every_other fits the whole batch, so "all" cannot win.
    rate = faster(micro={16: 2.0}, checkpointing={"every_other": 0.8})
    fake = FakeTrials(rate=rate, fits={"off": 4, "every_other": 16, "all": 16})
    outcome = search(fake, levers=("micro", "checkpointing")).run()
    tried = [(c.setting.checkpointing, c.setting.micro) for c in fake.trials[1:]]
    assert tried == [("off", AUTO), ("every_other", AUTO)]
    assert outcome.winner.resolved.checkpointing == "every_other"
    assert outcome.winner.micro_batch == 16
    assert [s.setting.checkpointing for s in outcome.skipped] == ["all"]


def test_checkpointing_is_not_tried_where_the_memory_measured_leaves_no_room_to_gain():
    # The config as given finds micro 32 without checkpointing, and 64 does not fit. By the
    # memory it measured, every_other would fit 50 samples (not 64: its trial would find 32
    # again) and all 80.
    def tried(room):
        fake = FakeTrials(
            rate=faster(micro={64: 1.5}, checkpointing={"all": 0.8}),
            fits={"off": 32, "every_other": 32, "all": 64},
            effective=64,
            room=room,
        )
        levers = ("micro", "checkpointing")
        grid = Space(levers, (), POLICIES, (AUTO,), (), effective=64)
        outcome = Search(grid, BASE.with_(micro=AUTO), fake, 1000.0, clock=fake.clock).run()
        return [c.setting.checkpointing for c in fake.trials[1:]], outcome

    policies, outcome = tried({"every_other": 50, "all": 80})
    assert policies == ["all"]
    (skipped,) = outcome.skipped
    assert (skipped.setting.checkpointing, skipped.kind) == ("every_other", "pruned")
    assert skipped.reason == (
        "by the memory 00-baseline measured, checkpointing every_other fits about 50 samples, "
        "not micro-batch 64: no larger micro-batch for its recompute"
    )
    assert (outcome.winner.resolved.checkpointing, outcome.winner.micro_batch) == ("all", 64)
    # A prediction short of the size by less than its slack (60 * 1.1 > 64) is tried.
    assert tried({"every_other": 60, "all": 80})[0] == ["every_other", "all"]


def test_a_trial_reads_the_size_auto_found_too_large_and_the_room_predicted():
    candidate = Candidate("01-micro", "micro", BASE.with_(micro=AUTO))
    summary = {
        "step_seconds": 0.5,
        "micro_batch": 128,
        "micro_batch_search": {
            "chosen": 128,
            "margin": 0.1,
            "tried": [
                {"micro": 64, "fits": True, "peak_bytes": 6e10},
                {"micro": 128, "fits": True, "peak_bytes": 1.1e11},
                {"micro": 256, "fits": False, "peak_bytes": 1.3e11},
            ],
        },
        "activation_checkpointing_fits": {"every_other": 150, "all": 190},
    }
    trial = from_summary(candidate, summary, 40.0, Path("t"), None)
    assert (trial.next_micro, trial.checkpointing_fits) == (256, {"every_other": 150, "all": 190})
    # tune.json keeps them: a resumed tune prunes as the first one did.
    again = type(trial).from_dict(json.loads(json.dumps(trial.to_dict())))
    assert (again.next_micro, again.checkpointing_fits) == (256, {"every_other": 150, "all": 190})


def test_given_micro_batch_sizes_are_tried_largest_first_until_one_fits():
    fake = FakeTrials(fail=lambda s: "CUDA out of memory" if s.micro == 16 else None)
    outcome = search(fake, levers=("micro",), micros=(16, 8, 4)).run()
    assert [c.setting.micro for c in fake.calls] == [8, 16]  # 8 is the baseline's
    assert [(s.setting.micro, s.kind) for s in outcome.skipped] == [(4, "pruned")]
    assert "micro-batch 8 already fits" in outcome.skipped[0].reason
    assert outcome.trials[1].failure == "oom"


def test_a_failed_trial_costs_only_that_trial():
    fake = FakeTrials(
        rate=faster(micro={16: 1.5}),
        fail=lambda s: "RuntimeError: bf16 kernel crashed" if s.precision == "bf16" else None,
    )
    outcome = search(fake, levers=("precision", "micro")).run()
    assert [t.status for t in outcome.trials] == ["ok", "failed", "ok", "ok"]
    assert outcome.trials[1].failure == "crash"
    assert outcome.winner.resolved.micro == 16  # the search went on without it


def test_max_autotune_is_not_tried_after_the_default_mode_crashed():
    fake = FakeTrials(fail=lambda s: "TorchRuntimeError: boom" if s.compile != "off" else None)
    outcome = search(fake, levers=("compile",)).run()
    assert [c.setting.compile for c in fake.calls] == ["off", "default"]
    (skipped,) = outcome.skipped
    assert skipped.setting.compile == "max-autotune"
    assert "torch.compile failed in default mode (01-compile: TorchRuntimeError: boom)" in (
        skipped.reason
    )


def test_the_budget_stops_the_search_and_names_the_candidates_not_reached():
    fake = FakeTrials(seconds=30.0)
    outcome = search(fake, budget=75.0, levers=("precision", "compile")).run()
    assert [t.name for t in outcome.trials] == ["00-baseline", "01-precision"]
    assert fake.now <= 75.0
    not_reached = [(s.describe(), s.reason) for s in outcome.not_reached]
    assert not_reached == [
        ("compile default", "needs about 30 s, 15 s left"),
        ("compile max-autotune", "needs about 30 s, 15 s left"),
    ]


def test_max_autotune_runs_only_where_time_allows():
    took = lambda s: 40.0 if s.compile != "off" else 10.0  # noqa: E731
    fake = FakeTrials(took=took)
    outcome = search(fake, budget=100.0, levers=("compile",)).run()
    assert [c.setting.compile for c in fake.calls] == ["off", "default"]
    (skipped,) = outcome.not_reached
    assert skipped.setting.compile == "max-autotune"
    assert skipped.reason == "needs about 160 s, 50 s left"  # 4x the default mode's time


def test_a_trial_the_budget_ends_is_stopped_and_nothing_after_it_starts():
    took = lambda s: 500.0 if s.precision == "bf16" else 10.0  # noqa: E731
    fake = FakeTrials(took=took)
    outcome = search(fake, budget=100.0, levers=("precision", "compile")).run()
    assert [t.status for t in outcome.trials] == ["ok", "stopped"]
    assert outcome.trials[1].error == "stopped by the budget after 90 s"
    assert {s.reason for s in outcome.not_reached} == {"the budget ran out"}
    assert outcome.winner is outcome.trials[0]


# --------------------------------------------------------------------------------------------
# The report: table, JSON, waterfall


def fake_tune(config: Path, tmp_path: Path, fake: FakeTrials, **options):
    plan = make_plan(session.read_given(config), str(config), out=tmp_path / "out", **options)
    plan = dataclasses.replace(plan, space=dataclasses.replace(plan.space, **SPACE_HERE))
    return run_tune(plan, runner=fake, clock=fake.clock)


# The same space on any machine: bf16 as if the hardware ran it.
SPACE_HERE = {"precisions": ("bf16", "fp32")}


def test_the_table_and_json_show_each_trial_with_its_cost(config, tmp_path, capsys):
    fake = FakeTrials(rate=faster(precision={"bf16": 2.0}))
    result = fake_tune(config, tmp_path, fake, levers="precision", instance="p4d.24xlarge")
    report = result_dict(result)
    assert json.loads((tmp_path / "out" / "tune.json").read_text()) == json.loads(
        json.dumps(report)
    )
    assert report["unit"] == "tokens" and report["winner"] == "01-precision"
    assert report["speedup"] == pytest.approx(2.0)
    base, best = report["trials"]
    usd_per_hour = result.plan.price.usd_per_hour
    for trial in (base, best):
        assert trial["usd_per_unit"] == pytest.approx(
            usd_per_hour / 3600 / trial["tokens_per_second"] * 1e6
        )
        assert trial["job_seconds"] == pytest.approx(300 * trial["step_seconds"])
        assert trial["job_usd"] == pytest.approx(usd_per_hour * trial["job_seconds"] / 3600)
        assert trial["peak_memory_bytes"] == 3 * 2**30
    print_report(result)
    out = capsys.readouterr().out
    for text in ("00-baseline", "01-precision *", "$/M tokens", "job $", "3.00 GiB", "25.0%"):
        assert text in out
    assert "paired: 01-precision against 00-baseline: 2.00x (2.00–2.00) tokens/s over 2 " in out
    assert "winner: 01-precision" in out
    assert "2.00x (2.00–2.00) the baseline's tokens/s, paired over 2 alternating rounds" in out


def test_the_waterfall_goes_from_the_baseline_to_the_winner_lever_by_lever(config, tmp_path):
    rate = faster(num_workers={2: 1.25}, precision={"bf16": 2.0}, micro={16: 1.5})
    fake = FakeTrials(rate=rate)
    result = fake_tune(config, tmp_path, fake, instance="p4d.24xlarge", levers="all")
    water = result.waterfall.to_dict()
    assert water["unit"] == "USD" and water["period"] == "run"
    levers = [s["lever"] for s in water["steps"]]
    assert levers == ["spot instances", "precision", "larger micro-batch", "data loading"]
    assert (
        "fp32 -> bf16: 2.00x (2.00–2.00) tokens/s (paired, 2 rounds)"
        in (water["steps"][1]["detail"])
    )
    assert "micro-batch 8 x 2 -> 16 x 1" in water["steps"][2]["detail"]
    assert water["baseline"] == pytest.approx(result_dict(result)["trials"][0]["job_usd"])
    spot = water["spot"]
    price_ratio = spot["spot_per_hour"] * spot["overhead_factor"] / spot["on_demand_per_hour"]
    # Each lever's speed-up is its paired comparison's, named with its interval.
    paired = {c.stage: c for c in result.outcome.levers}
    by_lever = {s["lever"]: s["measured"] for s in water["steps"]}
    assert by_lever["spot instances"] is None
    for stage, name, ratio in (
        ("precision", "precision", 2.0),
        ("micro", "larger micro-batch", 1.5),
    ):
        assert by_lever[name]["ratio"] == pytest.approx(ratio)
        assert by_lever[name]["comparison"] == paired[stage].name
        assert by_lever[name]["low"] <= ratio <= by_lever[name]["high"]
    measured = math.prod(m["ratio"] for m in by_lever.values() if m)
    assert measured == pytest.approx(1.25 * 2.0 * 1.5) == result.speedup
    assert water["final"] == pytest.approx(water["baseline"] * price_ratio / measured)


def test_without_a_price_the_table_shows_the_job_time_and_the_waterfall_is_in_hours(
    config, tmp_path, capsys
):
    fake = FakeTrials(rate=faster(precision={"bf16": 2.0}))
    result = fake_tune(config, tmp_path, fake, levers="precision")
    assert result.waterfall.unit == "hours"
    assert [s.lever for s in result.waterfall.plan.steps] == ["precision"]
    print_report(result)
    out = capsys.readouterr().out
    assert "job time" in out and "$/M tokens" not in out
    # The waterfall's cells are durations as each reads best: its title says time, not hours.
    assert "lever by lever (time per run)" in out and "(hours per run)" not in out


# --------------------------------------------------------------------------------------------
# The winner's config


def test_the_winner_keeps_the_baselines_optimization(config):
    given = session.read_given(config)
    winner = Setting(
        precision="bf16", checkpointing="every_other", micro=16, compile="default", num_workers=2
    )
    data = winner_config(given, winner, 16)
    tuned, as_given = load_config(None, base=data), load_config(config)
    for key in ("effective",):
        assert getattr(tuned.batch, key) == getattr(as_given.batch, key)
    assert tuned.optimizer == as_given.optimizer
    assert tuned.schedule == as_given.schedule
    assert (tuned.run, tuned.task) == (as_given.run, as_given.task)
    assert tuned.data.shuffle == as_given.data.shuffle
    assert tuned.batch.micro * tuned.batch.accumulation_steps() == 16
    assert (tuned.precision.mode, tuned.compile.mode, tuned.data.num_workers) == (
        "bf16",
        "default",
        2,
    )


def test_trials_measure_the_steps_only():
    data = trial_config(
        {
            "run": {"max_time": "1h", "max_tokens": 10**9, "out": "x", "seed": 3},
            "task": {"model": "m:f", "val_data": "m:v"},
            "early_stopping": {"patience": 2},
            "measure": {"trace": "t", "sample_seconds": 1.0},
            "checkpoint": {"location": "s3://bucket/run", "storage_options": {"key": "k"}},
        },
        steps=5,
        effective=32,
    )
    assert data["run"] == {"seed": 3, "max_steps": 5, "progress": "off"}
    assert data["task"] == {"model": "m:f"}
    assert data["checkpoint"] == {"every": "off", "final": False, "resume": "never"}
    assert data["batch"] == {"effective": 32} and "early_stopping" not in data
    assert data["measure"] == {"sample_seconds": 1.0}


def test_a_trial_sets_only_what_differs_from_the_config_and_the_pinned_peak(tmp_path):
    given = BASE.with_(precision="auto", checkpointing=("blocks.*",))
    trials = WorkerTrials(RUN, tmp_path, 5, given, {}, {"bf16": 0.25})
    setting = given.with_(precision="bf16", micro=AUTO, compile="default")
    command = trials.command(Candidate("03-micro", "micro", setting))
    assert command[command.index("--out") + 1] == str(tmp_path / "trials" / "03-micro")
    assert command[command.index("--steps") + 1] == "5"
    sets = [command[i + 1] for i, item in enumerate(command) if item == "--set"]
    assert sets == [
        'precision.mode="bf16"',
        'batch.micro="auto"',
        'compile.mode="default"',
        "measure.peak_tflops=0.25",
    ]
    assert load_config(None, [s.split("=", 1) for s in sets], base=RUN).compile.mode == "default"


RUN = {"run": {"max_steps": 1}, "batch": {"effective": 16}}


# --------------------------------------------------------------------------------------------
# Real trials, each in its own process


def test_real_trials_write_a_winner_thrifty_train_runs_as_is(
    tmp_path, capsys, children_import_tests
):
    config = tmp_path / "job.toml"
    config.write_text(CONFIG.format(model="test_tune:crashes_when_compiled"))
    out = tmp_path / "tune"
    argv = ["tune", str(config), "--levers", "compile", "--steps", "3", "--out", str(out), "--json"]
    assert cli.main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((out / "tune.json").read_text())
    trials = {t["name"]: t for t in report["trials"]}
    assert list(trials) == ["00-baseline", "01-compile"]
    base = trials["00-baseline"]
    assert base["status"] == "ok" and base["samples_per_second"] > 0
    assert (base["micro_batch"], base["accumulation_steps"]) == (8, 2)
    assert base["peak_memory_source"] == "rss" and base["peak_memory_bytes"] > 2**20
    assert report["winner"] == "00-baseline"
    crash = trials["01-compile"]  # a compile crash costs that trial only
    assert (crash["status"], crash["failure"]) == ("failed", "crash")
    assert "TorchRuntimeError" in crash["error"]
    (pruned,) = report["pruned"]
    assert pruned["setting"]["compile.mode"] == "max-autotune"
    assert (out / "trials" / "01-compile" / "train.log").exists()
    # A trial's weights are thrown away: none is written, even at the end.
    assert (out / "trials" / "00-baseline" / "summary.json").exists()
    assert not list((out / "trials").rglob("*.pt")) and not list((out / "trials").rglob("step-*"))

    winner = Path(report["winner_toml"])
    tuned, as_given = toml_loads(winner.read_text()), toml_loads(config.read_text())
    for section in ("optimizer", "schedule", "run", "task"):
        assert tuned[section] == as_given[section]
    assert tuned["batch"]["effective"] == as_given["batch"]["effective"]
    train = ["train", str(winner), "--out", str(tmp_path / "run"), "--steps", "2"]
    assert cli.main([*train, "--set", "run.progress=off"]) == 0


# 7 processes (2 trials, a comparison of 5 runs): out of the default suite. Its decisions are
# test_tune_paired.py's on a fake clock, through the same tune, and real trial processes are
# test_real_trials_write_a_winner_thrifty_train_runs_as_is's.
@pytest.mark.slow
def test_real_trials_keep_a_lever_on_paired_runs_and_the_waterfall_shows_their_figures(
    tmp_path, capsys, children_import_tests, monkeypatch
):
    # The tune sizes its paired runs here, in this process: about 1 s of steps each, at least
    # MIN_MEASURED_STEPS (2) after the warm-up one: more steps than the trials' 2.
    monkeypatch.setattr(compare, "BLOCK_SECONDS", 1.0)
    config = tmp_path / "job.toml"
    given = CONFIG.format(model="test_tune:waits_per_forward")
    config.write_text(given.replace("micro = 8", "micro = 2"))
    out = tmp_path / "tune"
    trial_steps = 2
    argv = ["tune", str(config), "--levers", "micro", "--micro", "16"]
    argv += ["--steps", str(trial_steps)]
    assert cli.main([*argv, "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((out / "tune.json").read_text())
    assert [t["name"] for t in report["trials"]] == ["00-baseline", "01-micro"]
    # One lever: its comparison is against the config as given, not repeated at the end.
    (lever,) = report["comparisons"]
    assert (lever["candidate"], lever["incumbent"], lever["stage"]) == (
        "01-micro",
        "00-baseline",
        "micro",
    )
    assert lever["decision"] == "kept" and 1.0 < lever["low"] <= lever["ratio"] <= lever["high"]
    assert lever["rounds"] == len(lever["ratios"]) >= 2 and lever["line"]
    roles = [b["name"].rsplit(".", 1)[1] for b in lever["blocks"]]
    assert roles[:5] == ["a0", "b1", "a1", "b2", "a2"] and len(roles) == 2 * lever["rounds"] + 1
    steps = {b["steps_completed"] for b in lever["blocks"]}
    # as many for both, more than the trials'
    assert len(steps) == 1 and steps.pop() > trial_steps
    for block in lever["blocks"]:  # each a process of its own
        assert block["status"] == "ok" and (Path(block["run_dir"]) / "summary.json").exists()
    micro = {b["name"].rsplit(".", 1)[1][0]: b["micro_batch"] for b in lever["blocks"]}
    assert micro == {"a": 2, "b": 16}
    assert report["winner"] == "01-micro" and report["speedup"] == lever["ratio"]
    (step,) = report["waterfall"]["steps"]
    assert (
        step["measured"]["ratio"] == lever["ratio"] and step["measured"]["comparison"] == "01-micro"
    )
    assert f"{lever['ratio']:.2f}x ({lever['low']:.2f}–{lever['high']:.2f})" in step["detail"]
    assert step["after"] == pytest.approx(step["before"] / lever["ratio"])


def test_a_budget_too_small_for_one_trial_is_one_line(config, tmp_path, capsys):
    out = tmp_path / "tune"
    argv = ["tune", str(config), "--budget", "1.5s", "--out", str(out)]
    line = one_line_error(capsys, argv)
    assert "--budget 1.5s is too small for even one trial" in line
    assert "e.g. --budget 10m" in line
    kept = json.loads((out / "tune.json").read_text())
    assert [t["status"] for t in kept["trials"]] == ["stopped"]


def test_a_model_that_does_not_fit_at_micro_batch_one_is_one_line(
    tmp_path, capsys, children_import_tests
):
    config = tmp_path / "job.toml"
    config.write_text(CONFIG.format(model="test_tune:out_of_memory"))
    out = tmp_path / "tune"
    argv = ["tune", str(config), "--levers", "micro", "--micro", "8", "--steps", "2"]
    line = one_line_error(capsys, [*argv, "--out", str(out)])
    assert line.startswith("thrifty: error: every trial ran out of memory, even at micro-batch 1")
    (trial,) = json.loads((out / "tune.json").read_text())["trials"]
    assert (trial["name"], trial["failure"]) == ("00-baseline", "oom")


def test_thrifty_tune_runs_from_python(tmp_path, children_import_tests):
    import dist_task

    given = toml_loads(CONFIG.format(model="unused:unused"))
    result = thrifty.tune(
        dist_task.model,
        dist_task.train_data,
        given,
        "2m",
        steps=2,
        out=tmp_path / "tune",
        levers="micro",
        micro=[8],
    )
    (trial,) = result.trials
    assert trial.ok and result.winner is trial and result.speedup == 1.0
    assert result.winner_config.task.model == "dist_task:model"
    assert result.winner_config.task.train_data == "dist_task:train_data"
    assert result.winner_config.batch.effective == 16
    assert result.winner_toml == tmp_path / "tune" / "winner.toml"


# --------------------------------------------------------------------------------------------
# Bad input


def test_an_unknown_instance_is_one_line_with_the_closest_names(config, tmp_path, capsys):
    out = tmp_path / "tune"
    line = one_line_error(
        capsys, ["tune", str(config), "--instance", "p4d.24xlarg", "--out", str(out)]
    )
    assert "--instance 'p4d.24xlarg' is invalid: unknown instance" in line
    assert "did you mean p4d.24xlarge" in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            ["--levers", "precision,speed"],
            "--levers 'precision,speed' is invalid: 'speed' is not a lever",
        ),
        (["--micro", "8,x"], "--micro '8,x' is invalid: 'x' is not a micro-batch size"),
        (["--steps", "1"], "--steps 1 is invalid: the first step is warm-up"),
        (["--budget", "soon"], "--budget = 'soon' is invalid"),
    ],
)
def test_bad_options_are_one_line(config, tmp_path, capsys, options, message):
    line = one_line_error(capsys, ["tune", str(config), *options, "--out", str(tmp_path / "o")])
    assert message in line


def test_every_trial_failing_is_one_line_and_keeps_the_trials(
    config, tmp_path, capsys, monkeypatch
):
    fake = FakeTrials(fail=lambda s: "RuntimeError: the data server is down")
    monkeypatch.setattr(session, "WorkerTrials", lambda *args, **kwargs: fake)
    out = tmp_path / "tune"
    line = one_line_error(capsys, ["tune", str(config), "--levers", "micro", "--out", str(out)])
    assert line == (
        "thrifty: error: every trial failed; the first, 00-baseline: RuntimeError: the data "
        "server is down (log: trials/00-baseline/train.log)"
    )
    kept = json.loads((out / "tune.json").read_text())
    assert [t["status"] for t in kept["trials"]] == ["failed", "failed"]
    assert kept["failure"] == line.removeprefix("thrifty: error: ")


def test_a_baseline_that_refuses_its_config_ends_the_search():
    fake = FakeTrials(fail=lambda s: "task.model = 'x:y' does not import", code=2)
    outcome = search(fake).run()
    assert [t.failure for t in outcome.trials] == ["bad_input"]
    assert outcome.stop == "the config as given fails: every trial would fail alike"


def test_an_earlier_tune_in_out_is_kept_without_overwrite(config, tmp_path, capsys):
    out = tmp_path / "tune"
    (out / "trials" / "00-baseline").mkdir(parents=True)
    (out / "trials" / "00-baseline" / "train.log").write_text("an earlier trial")
    line = one_line_error(capsys, ["tune", str(config), "--out", str(out)])
    assert line == (
        f"thrifty: error: --out {out} already holds trials from an earlier tune: choose another "
        "--out, or replace it with --overwrite"
    )
    assert (out / "trials" / "00-baseline" / "train.log").read_text() == "an earlier trial"
    fake = FakeTrials()
    plan = make_plan(
        session.read_given(config), str(config), out=out, levers="micro", overwrite=True
    )
    run_tune(plan, runner=fake, clock=fake.clock)
    assert (out / "winner.toml").exists() and not (out / "trials" / "00-baseline").exists()


def test_a_lambda_cannot_reach_the_trial_processes():
    with pytest.raises(ConfigError, match="a module-level function \\(not a lambda"):
        import_path(lambda: None, "model_factory", [])
    assert import_path(Net, "model_factory", []) == "dist_task:Net"


def test_no_finished_trial_raises_with_the_trials_kept(tmp_path, children_import_tests):
    given = toml_loads(CONFIG.format(model="unused:unused"))
    with pytest.raises(ThriftyError, match="too small for even one trial") as caught:
        thrifty.tune("dist_task:model", "dist_task:train_data", given, "1.5s", out=tmp_path / "t")
    assert [t.status for t in caught.value.result.trials] == ["stopped"]
    assert "budget 1.5s is too small" in str(caught.value)


# --------------------------------------------------------------------------------------------
# The package


def test_thrifty_tune_is_the_function_even_once_its_modules_are_imported():
    code = (
        "import thrifty.search.tune.search, thrifty; from thrifty import tune; "
        "print(callable(thrifty.tune), callable(tune), thrifty.tune.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "True", "tune"]


def test_registering_the_command_does_not_import_torch():
    code = (
        "import sys, thrifty.cli; thrifty.cli.build_parser(); import thrifty.search.tune; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
