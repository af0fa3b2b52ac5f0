"""`thrifty tune` decides on paired measurements: a candidate that beat the incumbent in its one
screening trial is measured against it again in alternating runs, A B A ... A, and kept only
when the gain stands out of the machine's noise; the winner is re-measured against the config
as given at the end. On a machine that drifts, swings or got lucky once, no noise is crowned.

Runs take time on a fake clock; each one's throughput is the setting's own times the machine's
speed at that run, so each test says exactly how the machine behaves."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from html import escape
from pathlib import Path

import pytest

from test_tune import BASE, CONFIG, space
from thrifty.reporting import render_report
from thrifty.search.tune import session
from thrifty.search.tune.compare import (
    FINAL,
    MIN_MEASURED_STEPS,
    Comparison,
    cost,
    measured_steps,
    needed,
)
from thrifty.search.tune.paired import bracketed_ratios, estimate
from thrifty.search.tune.report import result_dict
from thrifty.search.tune.search import Search
from thrifty.search.tune.session import TuneResult, make_plan, run_tune
from thrifty.search.tune.space import Setting
from thrifty.search.tune.stopping import TuneStopped
from thrifty.search.tune.trials import Candidate, Interrupted, Trial, from_summary

SECONDS = 10.0  # each run, on the fake clock


class Machine:
    """Runs of `seconds` each: `gain` times 100 samples/s for micro-batch 16 (100 for the config
    as given), and `compiled` times that with torch.compile on, times `speed(i)` for the i-th
    run (from 0) and `luck[name]` for the run of that name. `stop_at` names a run the tune is
    stopped in (SIGTERM), as if that arrived while it ran."""

    def __init__(
        self,
        gain: float,
        speed: Callable[[int], float],
        stop_at: str | None = None,
        compiled: float = 1.0,
        luck: dict[str, float] | None = None,
    ) -> None:
        self.gain, self.speed, self.stop_at = gain, speed, stop_at
        self.compiled, self.luck = compiled, luck or {}
        self.now = 0.0
        self.runs: list[str] = []

    def clock(self) -> float:
        return self.now

    def rate(self, s: Setting) -> float:
        gain = self.gain if s.micro == 16 else 1.0
        return 100.0 * gain * (self.compiled if s.compile != "off" else 1.0)

    def __call__(self, candidate: Candidate, deadline: float) -> Trial:
        if candidate.name == self.stop_at:
            raise Interrupted(candidate.name)
        speed = self.speed(len(self.runs)) * self.luck.get(candidate.name, 1.0)
        rate = self.rate(candidate.setting) * speed
        self.runs.append(candidate.name)
        self.now += SECONDS
        micro = int(candidate.setting.micro)
        summary = {
            "samples_per_second": rate,
            "step_seconds": 16 / rate,
            "micro_batch": micro,
            "accumulation_steps": 16 // micro,
            "num_workers": 0,
            "precision": "fp32",
        }
        return from_summary(candidate, summary, SECONDS, Path("trials") / candidate.name, 2**30)


def speeds(*values: float, then: float = 1.0) -> Callable[[int], float]:
    """The machine's speed run by run: `values`, then `then`."""
    return lambda i: values[i] if i < len(values) else then


def search(machine: Machine) -> Search:
    """Micro-batch 16 against the config as given (8), on `machine`."""
    return Search(space(("micro",), micros=(16,)), BASE, machine, 10_000.0, machine.clock)


@pytest.fixture
def tune(tmp_path: Path) -> Callable[[Machine], TuneResult]:
    """`thrifty tune --levers micro --micro 16` of a config at micro-batch 8, on a machine."""
    config = tmp_path / "job.toml"
    config.write_text(CONFIG.format(model="dist_task:model"))

    def run(machine: Machine, out: str = "out", levers: str = "micro") -> TuneResult:
        given = session.read_given(config)
        plan = make_plan(given, str(config), out=tmp_path / out, levers=levers, micro="16")
        return run_tune(plan, runner=machine, clock=machine.clock)

    return run


def record(result: TuneResult) -> dict:
    data = json.loads((result.plan.out / "tune.json").read_text())
    assert data == json.loads(json.dumps(result_dict(result)))
    return data


# --------------------------------------------------------------------------------------------
# The machine drifts, swings, or is lucky once


@pytest.mark.parametrize(("gain", "decision"), [(1.0, "no gain"), (1.2, "kept")])
def test_a_machine_slowing_5x_steadily_cancels_out_of_the_paired_ratio(gain, decision):
    # The trials at full speed (the candidate's a little luckier), then a neighbour's job ramps
    # up: the machine slows 5x over the comparison's five runs, at a steady pace.
    slowing = lambda i: 1.05 if i == 1 else 5 ** (-max(0, i - 2) / 4)  # noqa: E731
    outcome = search(Machine(gain, slowing)).run()
    c = outcome.comparisons[0]
    assert [t.name for t in c.blocks] == [f"01-micro.{r}" for r in ("a0", "b1", "a1", "b2", "a2")]
    a, b = c.rates("a"), c.rates("b")
    assert a[0] / a[-1] == pytest.approx(5.0)  # it did slow 5x
    # An unpaired reading of the same runs is off by more than the gain it looks for...
    assert (sum(b) / len(b)) / (sum(a) / len(a)) < 0.9 * gain
    # ...the bracketed ratio is the gain itself.
    assert c.estimate.ratio == pytest.approx(gain)
    assert c.decision == decision
    assert (outcome.winner.setting.micro == 16) == (decision == "kept")


def test_a_machine_that_swings_more_than_the_difference_keeps_the_config_as_given(tune):
    # A 5% gain on a machine whose speed swings 3x from one run to the next.
    swings = (1.0, 1.0, 1.0, 0.35, 0.9, 1.0, 0.3, 0.8, 0.4, 1.0, 0.33, 0.7, 1.0, 0.5, 0.9)
    result = tune(Machine(1.05, speeds(*swings)))
    (c,) = record(result)["comparisons"]
    assert (c["candidate"], c["incumbent"], c["decision"]) == (
        "01-micro",
        "00-baseline",
        "too noisy",
    )
    assert c["rounds"] == 6 and len(c["blocks"]) == 13
    assert c["low"] < 1.0 < 1.05 < c["high"]  # the interval holds both answers
    assert c["incumbent_spread"] > 2.5
    assert c["line"].endswith(
        "ranged 3.33x: the machine's throughput swings more than the difference measured; "
        "keeping the config as given"
    )
    assert result.winner is result.baseline and result.speedup == 1.0
    assert result.winner_config.batch.micro == 8
    assert not result.waterfall.plan.steps  # no lever: nothing was measured to have gained


def test_a_real_gain_is_kept_with_its_interval_above_one_and_not_measured_twice(tune):
    # A true 1.2x gain; its screening trial was luckier still (1.5x); the machine's noise is
    # a few percent from run to run.
    noise = (1.0, 1.25, 1.0, 0.97, 1.02, 1.0, 0.98, 1.03, 1.0, 0.99, 1.01, 0.98, 1.02, 1.0)
    result = tune(Machine(1.2, speeds(*noise)))
    data = record(result)
    # Its comparison was against the config as given: the winner, one lever away, is not
    # re-measured against it (the same pair again).
    (lever,) = data["comparisons"]
    assert lever["decision"] == "kept" and lever["incumbent"] == "00-baseline"
    assert 1.0 < lever["low"] < lever["ratio"] < lever["high"]
    assert lever["ratio"] == pytest.approx(1.2, abs=0.03)
    assert lever["rounds"] == len(lever["ratios"]) >= 2 and lever["confidence"] == 0.9
    assert lever["line"].startswith(f"01-micro against 00-baseline: {lever['ratio']:.2f}x (")
    assert lever["line"].endswith(" samples/s over 2 alternating rounds: kept")
    # The figures are the paired ones, not the lucky screening trial's 1.5x.
    trials = data["trials"]
    assert trials[1]["samples_per_second"] / trials[0]["samples_per_second"] == pytest.approx(1.5)
    assert data["speedup"] == lever["ratio"]
    (step,) = data["waterfall"]["steps"]
    assert step["lever"] == "larger micro-batch" and step["measured"]["ratio"] == lever["ratio"]
    assert step["measured"]["comparison"] == "01-micro"
    assert f"{lever['ratio']:.2f}x ({lever['low']:.2f}–{lever['high']:.2f})" in step["detail"]
    hours = data["waterfall"]["baseline"]
    assert step["after"] == pytest.approx(hours / lever["ratio"])
    assert result.winner_config.batch.micro == 16
    # The report's page shows the same figures.
    page = render_report(result.plan.out).read_text()
    paired = f"{lever['ratio']:.2f}× ({lever['low']:.2f}–{lever['high']:.2f})"
    assert f"<td>larger micro-batch</td><td>{escape(step['detail'])}</td><td>{paired}</td>" in page
    assert f"<td>01-micro vs 00-baseline</td><td>{paired}</td><td>2</td><td>kept</td>" in page
    assert "re-measured" not in page


def test_a_lever_that_wins_its_trial_by_luck_and_loses_paired_is_not_kept(tune):
    # Micro-batch 16 is 10% slower; its one trial ran while the machine was 30% faster.
    result = tune(Machine(0.9, speeds(1.0, 1.3)))
    (c,) = record(result)["comparisons"]
    assert c["decision"] == "no gain" and c["ratio"] == pytest.approx(0.9)
    assert c["line"] == (
        "01-micro against 00-baseline: 0.90x (0.90–0.90) samples/s over 2 alternating rounds: "
        "no gain of 2% or more; keeping the config as given"
    )
    assert result.winner is result.baseline and result.outcome.final is None
    assert result.speedup == 1.0 and result.winner_config.batch.micro == 8


def test_two_levers_are_confirmed_together_against_the_config_as_given(tune):
    # A true 1.2x from micro-batch 16, then 1.1x from compiling: each kept on its own
    # comparison, then the winner re-measured against the config as given: about 1.32x.
    noise = (1.0, 1.02, 0.99, 1.0, 1.01, 0.98, 1.0, 1.02, 0.99, 1.01, 1.0, 0.99, 1.0, 1.01)
    result = tune(Machine(1.2, speeds(*noise), compiled=1.1), levers="micro,compile")
    data = record(result)
    micro, compiled, final = data["comparisons"]
    assert [c["decision"] for c in (micro, compiled, final)] == ["kept", "kept", "kept"]
    assert (compiled["incumbent"], final["stage"], final["incumbent"]) == (
        "01-micro",
        FINAL,
        "00-baseline",
    )
    assert final["ratio"] == pytest.approx(1.32, abs=0.04) and final["low"] > 1.0
    assert final["line"].startswith(f"the winner {compiled['candidate']} re-measured against")
    assert final["line"].endswith(": confirmed")
    assert data["speedup"] == final["ratio"]
    page = render_report(result.plan.out).read_text()
    assert f"re-measured {final['ratio']:.2f}× ({final['low']:.2f}–" in page


def test_the_winner_not_faster_when_re_measured_reverts_to_the_config_as_given(tune):
    # No real gain: each lever's comparison drew the 1 in 10 luck a 90% interval allows (its
    # B runs 5-6% fast), the re-measurement of both together did not (2-3% slow).
    luck = {"01-micro": 1.1, "02-compile": 1.2, "03-compile": 1.15}
    for name in ("01-micro", "02-compile"):
        luck |= {f"{name}.b1": 1.06, f"{name}.b2": 1.05}
    luck |= {"final.b1": 0.97, "final.b2": 0.98}
    result = tune(Machine(1.0, speeds(), luck=luck), levers="micro,compile")
    data = record(result)
    *levers, final = data["comparisons"]
    assert [c["decision"] for c in levers] == ["kept", "kept"]
    assert all(c["low"] > 1.0 for c in levers)
    assert (final["stage"], final["decision"], final["high"] < 1.02) == (FINAL, "no gain", True)
    assert final["line"].endswith("no gain of 2% or more; keeping the config as given")
    assert result.winner is result.baseline and data["winner"] == "00-baseline"
    assert result.winner_config.batch.micro == 8 and result.speedup == 1.0
    assert not result.waterfall.plan.steps  # the levers it kept are not the winner's


# --------------------------------------------------------------------------------------------
# Resuming, and the runs' size


def test_a_tune_stopped_mid_comparison_resumes_without_rerunning_its_finished_runs(tune):
    noise = (1.0, 1.25, 1.0, 0.97, 1.02, 1.0, 0.98, 1.03, 1.0, 0.99, 1.01, 0.98, 1.02, 1.0)
    expected = record(tune(Machine(1.2, speeds(*noise)), "uninterrupted"))["comparisons"]

    machine = Machine(1.2, speeds(*noise), stop_at="01-micro.b2")
    with pytest.raises(TuneStopped, match="2 finished trials and 3 comparison runs kept"):
        tune(machine)
    before = list(machine.runs)
    assert before[2:] == ["01-micro.a0", "01-micro.b1", "01-micro.a1"]

    machine.stop_at = None
    resumed = tune(machine)
    again = machine.runs[len(before) :]
    assert again[0] == "01-micro.b2" and not set(again) & set(before)
    assert record(resumed)["comparisons"] == expected  # the same runs, the same decisions


def test_each_run_measures_about_a_second_of_steps_in_a_warm_worker_three_cold(monkeypatch):
    def trial(step_seconds: float, steps: int) -> Trial:
        summary = {"samples_per_second": 16 / step_seconds, "step_seconds": step_seconds}
        made = from_summary(Candidate("t", "micro", BASE), summary, 5.0, Path("t"), None)
        return Trial.from_dict({**made.to_dict(), "steps_completed": steps})

    fast, slow = trial(0.1, 5), trial(0.3, 5)
    monkeypatch.delenv("THRIFTY_COLD_TRIALS", raising=False)
    assert measured_steps(fast, slow) == 4  # 1 s at the slower one's pace
    assert measured_steps(trial(0.05, 5), trial(0.02, 5)) == 20
    monkeypatch.setenv("THRIFTY_COLD_TRIALS", "1")  # a process per run: 3 s each, as before
    assert measured_steps(fast, slow) == 10  # the slower one's pace, beyond the trials' 4
    assert measured_steps(trial(5.0, 20), trial(1.0, 20)) == MIN_MEASURED_STEPS
    # Before its first run, a run's cost is its trial's 5 s plus the 6 steps more it measures.
    c = Comparison(
        name="c", stage="micro", unit="samples", incumbent=fast, candidate=slow, as_given=True
    )
    assert cost(c, "a", 10) == pytest.approx(5.0 + 6 * 0.1)
    assert cost(c, "b", 10) == pytest.approx(5.0 + 6 * 0.3)
    assert needed(c) == pytest.approx(5.6 + 2 * (5.6 + 6.8))


def test_the_bracketed_ratios_and_their_interval():
    a, b = [100.0, 50.0, 25.0], [84.852813742, 42.426406871]  # 1.2x, the machine halving
    assert bracketed_ratios(a, b) == pytest.approx([1.2, 1.2])
    est = estimate([1.1, 1.3, 1.2])
    assert est.ratio == pytest.approx(math.prod([1.1, 1.3, 1.2]) ** (1 / 3))
    assert est.low < 1.1 and est.high > 1.3  # 3 rounds: a wide 90% interval
    assert estimate([1.2]) is None
