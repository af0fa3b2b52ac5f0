"""The diagnosis on real workloads measured on this CPU, each built with a known bottleneck.

Signals are kept strong (a batch that takes 30× longer to load than to compute, ops of a few
microseconds, matmuls of 10^9 FLOPs) so a busy shared machine does not move the verdict.
"""

from __future__ import annotations

from torch import nn

from measure.measure_helpers import (  # tests/ is on the path: tests/measure is `measure`
    SlowItems,
    compute_heavy_model,
    profile_on_cpu,
    random_rows,
    tiny_ops_model,
)
from thrifty.loading import LoaderSettings, measure_fetch_time
from thrifty.measure.diagnosis import COMPUTE_BOUND_MFU, TINY_OP_SECONDS, diagnose


def test_a_dataset_whose_items_take_long_to_produce_is_data_loading() -> None:
    data = SlowItems(n=128, width=16, ms=3.0)  # 8 items: ~24 ms a batch; compute: ~1 ms
    fetch = measure_fetch_time(data, LoaderSettings(batch_size=8), batches=3)
    evidence = profile_on_cpu(
        nn.Sequential(nn.Linear(16, 16)),
        data,
        batch_size=8,
        steps=4,
        fetch_seconds_per_batch={0: fetch},
    )
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "data_loading"
    assert diagnosis.breakdown["data_wait"] > 0.5
    first = diagnosis.recommendations[0]
    assert first.area == "data"
    assert "num_workers" in first.text and "measured fetch" in first.text


def test_a_model_of_many_tiny_ops_is_overhead_bound() -> None:
    evidence = profile_on_cpu(tiny_ops_model(blocks=100), random_rows(64, 4), batch_size=2)
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "overhead_bound"
    assert evidence.seconds_per_op is not None and evidence.seconds_per_op < TINY_OP_SECONDS
    assert any("compile" in r.text for r in diagnosis.recommendations)
    assert any("micro-batch 2 →" in r.text for r in diagnosis.recommendations)


def test_a_compute_heavy_model_is_compute_bound() -> None:
    evidence = profile_on_cpu(
        compute_heavy_model(width=1024, depth=4),
        random_rows(256 * 6, 1024),
        batch_size=256,
        steps=4,
    )
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "compute_bound"
    assert evidence.compute_mfu is not None and evidence.compute_mfu >= COMPUTE_BOUND_MFU
    # a measured peak is a best case, which a long run can slightly beat
    assert diagnosis.mfu is not None and 0 < diagnosis.mfu <= 1.2
