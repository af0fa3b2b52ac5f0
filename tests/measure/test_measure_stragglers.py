"""Stragglers on synthetic figures: the detection rule, what an interval's record carries, the
fetch a timer measures without the agreement waits, the one gather a flush makes, and the
diagnosis and recommendation that name the rank."""

from __future__ import annotations

import json

import pytest
import torch

from thrifty.measure.diagnosis import Evidence, diagnose
from thrifty.measure.monitor import RunMonitor
from thrifty.measure.progress import ProgressBar
from thrifty.measure.stragglers import (
    RankSeconds,
    Straggler,
    find_straggler,
    interval_record,
    slowest,
)
from thrifty.measure.timing import CpuTimer
from thrifty.rundir.files import MetricsLog, read_metrics


def intervals(
    *work: tuple[float, ...], steps: int = 10, step: float = 0.250, data=None
) -> list[RankSeconds]:
    """Intervals of `steps` steps of `step` seconds, one per tuple of the ranks' work."""
    return [RankSeconds(steps, step, w, data) for w in work]


# --- the rule -----------------------------------------------------------------------------


def test_a_rank_slowest_in_every_interval_beyond_the_threshold_is_named_with_its_cost() -> None:
    figures = intervals((0.100, 0.150), (0.100, 0.150), (0.100, 0.150))
    s = find_straggler(figures, threshold=0.15, usd_per_gpu_hour=3.6)
    assert s is not None
    assert s.rank == 1 and s.slowest_intervals == 3 and s.intervals == 3 and s.steps == 30
    # 50 ms behind: a 250 ms step the other rank would take in 200 ms, 25% longer.
    assert s.lag == pytest.approx(0.25) and s.lag_seconds == pytest.approx(0.050)
    # 50 ms a step × 30 steps × the 1 other rank, at $3.60 per GPU-hour ($0.001 a GPU-second).
    assert s.idle_gpu_seconds == pytest.approx(1.5)
    assert s.usd == pytest.approx(0.0015)


def test_a_lag_under_the_threshold_names_no_one() -> None:
    figures = intervals((0.100, 0.110), (0.100, 0.110), step=0.210)  # 5% longer steps
    assert find_straggler(figures, threshold=0.15) is None
    assert find_straggler(figures, threshold=0.04) is not None  # the same figures, lower bar


def test_a_lag_that_is_a_sliver_of_the_step_is_no_straggler() -> None:
    # A forward 30% slower, but 0.3 ms of a 100 ms step: noise, not a straggler.
    figures = intervals((0.0010, 0.0013), (0.0010, 0.0013), step=0.100)
    assert find_straggler(figures, threshold=0.15) is None


def test_one_slow_interval_is_not_a_straggler_however_slow() -> None:
    # Rank 1 is far behind once (a checkpoint write, a hiccup), rank 0 slightly behind twice.
    figures = [
        *intervals((0.100, 0.500), step=0.600),
        *intervals((0.101, 0.100), (0.101, 0.100), step=0.200),
    ]
    assert find_straggler(figures, threshold=0.15) is None


def test_the_lag_is_measured_against_the_median_of_the_other_ranks() -> None:
    lag = slowest((0.100, 0.104, 0.096, 0.150), step=0.250)
    assert lag is not None and lag.rank == 3
    assert lag.seconds == pytest.approx(0.050) and lag.fraction == pytest.approx(0.25)
    s = find_straggler(intervals((0.100, 0.104, 0.096, 0.150)), threshold=0.15)
    assert s is not None and s.rank == 3 and s.ranks == 4
    assert s.idle_gpu_seconds == pytest.approx(0.050 * 10 * 3)  # three ranks wait for it


def test_one_rank_or_nothing_measured_names_no_one() -> None:
    assert slowest((0.1,), step=0.2) is None
    assert find_straggler([], threshold=0.15) is None
    assert find_straggler(intervals((0.0, 0.0)), threshold=0.15) is None
    assert find_straggler(intervals((0.1, 0.2), steps=0), threshold=0.15) is None


def test_the_data_part_of_the_lag_says_whether_the_loader_is_to_blame() -> None:
    data_heavy = intervals((0.100, 0.150), data=(0.010, 0.055))
    s = find_straggler(data_heavy, threshold=0.15)
    assert s is not None and s.data_lag_seconds == pytest.approx(0.045) and s.data_bound
    compute = intervals((0.100, 0.150), data=(0.010, 0.012))
    s = find_straggler(compute, threshold=0.15)
    assert s is not None and not s.data_bound
    unmeasured = find_straggler(intervals((0.100, 0.150)), threshold=0.15)
    assert unmeasured is not None and unmeasured.data_lag_seconds is None
    assert not unmeasured.data_bound


def test_an_interval_record_carries_every_rank_and_the_slowest() -> None:
    record = interval_record(RankSeconds(4, 0.040, (0.020, 0.030), (0.001, 0.011)))
    assert record["ranks"] == {"work_seconds": [0.020, 0.030], "data_seconds": [0.001, 0.011]}
    assert record["straggler"]["rank"] == 1
    assert record["straggler"]["lag"] == pytest.approx(0.010 / 0.030)
    assert record["straggler"]["lag_seconds"] == pytest.approx(0.010)
    assert "data_seconds" not in interval_record(RankSeconds(4, 0.04, (0.02, 0.03)))["ranks"]


# --- the fetch: a rank's own data wait -------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_fetch_leaves_out_the_wait_for_the_other_ranks() -> None:
    clock, agreed = Clock(), Clock()
    timer = CpuTimer(clock, cpu_clock=clock, threads=1, waited=agreed)
    timer.start()
    clock.now += 0.050  # 50 ms in the data-wait phase ...
    agreed.now += 0.040  # ... 40 of them blocked agreeing with a slower rank
    timer.mark("data_wait")
    clock.now += 0.020
    timer.mark("forward")
    raw = timer.finish()
    assert timer.resolve(raw)["data_wait"] == pytest.approx(0.050)  # the breakdown is unchanged
    assert timer.fetch(raw) == pytest.approx(0.010)
    assert CpuTimer(clock).fetch(CpuTimer(clock).finish()) is None  # no `waited`: not measured


# --- the flush: one gather, the mean loss, the figures --------------------------------------


def two_rank_monitor(tmp_path, other_rank_row: list[float]) -> tuple[RunMonitor, list, Clock]:
    """A monitor on rank 0 of 2: its gather returns this rank's row and `other_rank_row`."""
    gathered: list[torch.Tensor] = []

    def gather(values: torch.Tensor) -> torch.Tensor:
        gathered.append(values.clone())
        return torch.stack([values, torch.tensor(other_rank_row)])

    clock = Clock()
    monitor = RunMonitor(
        MetricsLog(tmp_path / "metrics.jsonl"),
        ProgressBar(None, "off"),
        CpuTimer(clock, cpu_clock=clock, threads=1),
        exclude_steps=0,
        flops_per_step=None,
        peak=None,
        gather=gather,
    )
    return monitor, gathered, clock


def add_step(monitor: RunMonitor, clock: Clock, step: int, loss: float, forward: float) -> None:
    timer = monitor.timer
    timer.start()
    for phase, seconds in (("data_wait", 0.001), ("forward", forward), ("backward", 0.02)):
        clock.now += seconds
        timer.mark(phase)
    record = {
        "step": step,
        "loss": torch.tensor(loss),
        "grad_norm": None,
        "step_seconds": 0.0,
        "samples_in_step": 4,
        "tokens_in_step": 0,
    }
    monitor.add(record, timer.finish())


def test_a_flush_gathers_losses_and_seconds_once_and_records_the_slowest_rank(tmp_path) -> None:
    # The other rank: losses 3.0 and 5.0, a forward of 15 ms a step, no fetch measured.
    monitor, gathered, clock = two_rank_monitor(tmp_path, [3.0, 5.0, 0.015, 0.0])
    add_step(monitor, clock, 1, loss=1.0, forward=0.010)
    add_step(monitor, clock, 2, loss=2.0, forward=0.010)
    records = monitor.flush(0.0, 8, 0)
    assert len(gathered) == 1  # one collective for the interval
    assert gathered[0].tolist() == pytest.approx([1.0, 2.0, 0.010, 0.0])
    assert [r["loss"] for r in records] == [2.0, 3.5]  # the mean of the two ranks' losses
    last = records[-1]
    assert last["ranks"]["work_seconds"] == pytest.approx([0.010, 0.015])
    # Steps of 31 ms (data 1, forward 10, backward 20): 5 ms of them waiting for rank 1.
    assert last["straggler"]["rank"] == 1
    assert last["straggler"]["lag"] == pytest.approx(0.005 / 0.026)
    assert "ranks" not in records[0]
    monitor.close()
    written = read_metrics(tmp_path / "metrics.jsonl")
    assert written[-1]["straggler"]["rank"] == 1
    s = monitor.straggler()
    assert isinstance(s, Straggler) and s.rank == 1


def test_one_process_gathers_nothing_and_records_no_ranks(tmp_path) -> None:
    clock = Clock()
    monitor = RunMonitor(
        MetricsLog(tmp_path / "metrics.jsonl"),
        ProgressBar(None, "off"),
        CpuTimer(clock, cpu_clock=clock, threads=1),
        exclude_steps=0,
        flops_per_step=None,
        peak=None,
    )
    add_step(monitor, clock, 1, loss=1.5, forward=0.010)
    records = monitor.flush(0.0, 4, 0)
    assert records[0]["loss"] == 1.5 and "ranks" not in records[0]
    assert monitor.straggler() is None
    diagnosis = monitor.diagnose()
    assert "straggler" not in diagnosis.to_dict()
    monitor.close()


# --- the diagnosis ---------------------------------------------------------------------------


def evidence(straggler: Straggler | None) -> Evidence:
    return Evidence(
        step_seconds=0.200,
        steps=30,
        data_wait_seconds=0.010,
        forward_seconds=0.060,
        backward_seconds=0.120,
        optimizer_seconds=0.010,
        rank_work_seconds=(0.100, 0.150),
        straggler=straggler,
    )


def test_the_diagnosis_names_the_straggler_and_what_its_wait_cost() -> None:
    s = find_straggler(intervals((0.100, 0.150), (0.100, 0.150)), 0.15, usd_per_gpu_hour=3.6)
    diagnosis = diagnose(evidence(s))
    out = json.loads(json.dumps(diagnosis.to_dict()))
    assert out["straggler"]["rank"] == 1 and out["straggler"]["lag"] == pytest.approx(0.25)
    line = next(e for e in diagnosis.evidence if "straggler" in e)
    assert line.startswith("rank 1 is a straggler: its own work takes 50.0 ms more per step")
    assert "every step 25% longer than theirs (threshold 15%)" in line
    assert "slowest in 2 of 2" in line
    assert "waited 1.0 GPU-seconds for it over 20 steps ($0.0010)" in line
    advice = [r for r in diagnosis.recommendations if r.text.startswith("rank 1 is")]
    assert len(advice) == 1 and advice[0].area == "compute"
    assert "in its forward: check that node's accelerator" in advice[0].text
    assert "replace the instance" in advice[0].text
    assert "~50.0 ms shorter (~25% of step time)" in advice[0].expected
    measured = find_straggler(intervals((0.100, 0.150), data=(0.010, 0.020)), 0.15)
    text = diagnose(evidence(measured)).recommendations[0].text
    assert "mostly outside fetching data (10.0 ms of it)" in text


def test_a_straggler_slow_at_fetching_is_told_to_add_loader_workers() -> None:
    figures = intervals((0.100, 0.150), data=(0.010, 0.058))
    diagnosis = diagnose(evidence(find_straggler(figures, 0.15)))
    advice = [r for r in diagnosis.recommendations if r.text.startswith("rank 1 is")]
    assert len(advice) == 1 and advice[0].area == "data"
    assert "48.0 ms of it fetching data" in advice[0].text
    assert "data.num_workers" in advice[0].text
    assert diagnosis.recommendations[0] is advice[0]  # first of the data area


def test_ranks_alike_are_compared_but_none_is_named() -> None:
    diagnosis = diagnose(evidence(None))
    assert diagnosis.to_dict()["straggler"] is None
    assert any(e.startswith("own work per step") for e in diagnosis.evidence)
    assert not any("straggler" in e for e in diagnosis.evidence)
    assert not any(r.text.startswith("rank ") for r in diagnosis.recommendations)


def test_nothing_to_compare_records_no_ranks(tmp_path) -> None:
    # FSDP's forward waits on the other ranks, and no fetch was measured: no figures at all.
    monitor, gathered, clock = two_rank_monitor(tmp_path, [3.0, 0.015, 0.0])
    monitor.work_phases = ()
    add_step(monitor, clock, 1, loss=1.0, forward=0.010)
    records = monitor.flush(0.0, 4, 0)
    assert len(gathered) == 1 and records[0]["loss"] == 2.0  # the losses still travel
    assert "ranks" not in records[0] and monitor.rank_intervals == []
    monitor.close()
