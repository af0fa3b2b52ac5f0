"""The guard as a list of detectors: a new fault check is one class added to the list, the most
severe verdict on a step wins, and the checkpointed guard state keeps its keys."""

from __future__ import annotations

import math
from typing import Any

import pytest

from test_guard_in_training import Linear, config, regression
from thrifty import Trainer
from thrifty.config.guard import GuardConfig
from thrifty.measure.guard import Detector, RunGuard, Verdict


class LossFloor(Detector):
    """A check no built-in detector makes: a training loss below `floor` is a leak (the labels
    reached the inputs), and the run is stopped."""

    def __init__(self, floor: float) -> None:
        self.floor = floor
        self.seen = 0

    def observe(self, step: int, loss: float, skipped: bool) -> Verdict | None:
        self.seen += 1
        if skipped or loss >= self.floor:
            return None
        return Verdict(diverged=f"loss {loss:.3g} at step {step} is below {self.floor}")

    def state_dict(self) -> dict[str, Any]:
        return {"loss_floor_seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = int(state.get("loss_floor_seen", 0))


class Fixed(Detector):
    def __init__(self, at: int, verdict: Verdict) -> None:
        self.at, self.verdict = at, verdict

    def observe(self, step: int, loss: float, skipped: bool) -> Verdict | None:
        return self.verdict if step == self.at else None


def records(losses: list[float], start: int = 1) -> list[dict[str, Any]]:
    return [{"step": start + i, "loss": x, "skipped": False} for i, x in enumerate(losses)]


def test_a_detector_added_to_the_list_stops_a_run_with_its_verdict(tmp_path):
    out = tmp_path / "floor"
    trainer = Trainer(Linear(), regression(480), config(out, 60))
    check = LossFloor(floor=0.5)
    trainer.parts.guard.detectors.append(check)
    result = trainer.fit()
    assert result.stop_reason == "diverged"
    assert result.steps < 60
    why = result.guard["diverged"]
    assert why.startswith("loss ") and why.endswith(f"at step {check.seen} is below 0.5")
    assert result.guard["saved"]["by"] == "diverged"
    assert not (out / "summary.json").exists() or result.stop_reason == "diverged"


def test_the_most_severe_verdict_on_a_step_wins_whatever_the_order():
    stop, roll = Verdict(diverged="stop"), Verdict(spike_start=2)
    for pair in ([Fixed(3, roll), Fixed(3, stop)], [Fixed(3, stop), Fixed(3, roll)]):
        guard = RunGuard(GuardConfig())
        guard.detectors.extend(pair)
        verdict = guard.observe(records([1.0] * 5))
        assert verdict.diverged == "stop" and verdict.spike_start is None
        assert guard.observed_step == 3  # the steps after it are judged at the next flush


def test_a_skipped_step_is_counted_once_and_shown_to_every_detector():
    guard = RunGuard(GuardConfig())
    check = LossFloor(floor=-math.inf)
    guard.detectors.append(check)
    verdict = guard.observe([*records([1.0, math.nan]), {"step": 3, "loss": 1.0, "skipped": True}])
    assert verdict.skipped == 2 and check.seen == 3
    assert guard.summary()["skipped_steps"] == 2


def test_the_guard_state_keeps_its_keys_and_an_older_one_still_loads():
    guard = RunGuard(GuardConfig(spike_window=10))
    guard.observe(records([1.0 + 0.01 * i for i in range(12)] + [math.nan]))
    state = guard.state_dict()
    assert set(state) == {"nonfinite", "spikes", "rollbacks", "last_finite", "observed_step"}
    assert state["nonfinite"] == {"consecutive": 1, "skipped": 1}
    assert state["last_finite"] == [12, pytest.approx(1.11)]
    # A checkpoint written before a detector was added: the new one keeps its fresh state.
    resumed = RunGuard(GuardConfig(spike_window=10))
    resumed.detectors.append(LossFloor(floor=0.0))
    resumed.load_state_dict(state)
    assert {k: v for k, v in resumed.state_dict().items() if k != "loss_floor_seen"} == state


def test_a_detector_whose_state_keys_clash_is_refused_by_name():
    class Clash(Detector):
        def state_dict(self) -> dict[str, Any]:
            return {"spikes": []}

    guard = RunGuard(GuardConfig())
    guard.detectors.append(Clash())
    with pytest.raises(ValueError, match=r"guard detector Clash saves state under \['spikes'\]"):
        guard.state_dict()
