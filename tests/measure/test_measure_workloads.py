"""The diagnosis on real workloads, each built with a known bottleneck, timed on a simulated CPU
(see `measure_helpers`): the verdicts follow from each workload's own op and FLOP counts, and
do not depend on how fast or how busy the machine running the tests is."""

from __future__ import annotations

import dataclasses

import pytest
from torch import nn

from measure.measure_helpers import (  # tests/ is on the path: tests/measure is `measure`
    SimulatedCpu,
    SlowItems,
    compute_heavy_model,
    profile_on_cpu,
    random_rows,
    tiny_ops_model,
)
from thrifty.measure.diagnosis import COMPUTE_BOUND_MFU, TINY_OP_SECONDS, diagnose


def test_a_dataset_whose_items_take_long_to_produce_is_data_loading() -> None:
    cpu = SimulatedCpu()
    data = SlowItems(cpu, n=128, width=16, ms=3.0)  # 8 items: 24 ms a batch
    evidence = profile_on_cpu(
        nn.Sequential(nn.Linear(16, 16)),
        data,
        cpu=cpu,
        batch_size=8,
        steps=4,
        fetch_seconds_per_batch={0: 0.024},
    )
    # 8 CPUs, on any machine: room for the workers it takes to keep up (one worker alone,
    # its handoff added to the 24 ms a batch takes, would not beat the loop fetching its own).
    evidence = dataclasses.replace(evidence, cpus=8)
    diagnosis = diagnose(evidence)
    assert evidence.data_wait_seconds == pytest.approx(0.024)
    assert diagnosis.bottleneck == "data_loading"
    assert diagnosis.breakdown["data_wait"] > 0.5
    first = diagnosis.recommendations[0]
    assert first.area == "data"
    assert "num_workers" in first.text and "measured fetch" in first.text


def test_a_model_of_many_tiny_ops_is_overhead_bound() -> None:
    cpu = SimulatedCpu()
    evidence = profile_on_cpu(
        tiny_ops_model(blocks=50), random_rows(64, 4), cpu=cpu, batch_size=2, steps=2, warmup=0
    )
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "overhead_bound"
    assert evidence.seconds_per_op is not None and evidence.seconds_per_op < TINY_OP_SECONDS
    # On a CPU, compile is recommended only where measured faster: here it says how to measure.
    assert not any("compile" in r.text for r in diagnosis.recommendations)
    assert any("thrifty tune" in fact for fact in diagnosis.evidence)
    assert any("micro-batch 2 →" in r.text for r in diagnosis.recommendations)


def test_a_compute_heavy_model_is_compute_bound() -> None:
    cpu = SimulatedCpu()
    evidence = profile_on_cpu(
        compute_heavy_model(width=512, depth=4),
        random_rows(128 * 6, 512),
        cpu=cpu,
        batch_size=128,
        steps=4,
    )
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "compute_bound"
    assert evidence.compute_mfu is not None and evidence.compute_mfu >= COMPUTE_BOUND_MFU
    assert diagnosis.mfu is not None and 0.5 < diagnosis.mfu < 1  # ops' overhead is the rest
