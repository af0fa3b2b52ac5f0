"""Scaling: ring all-reduce time against compute time, with units explicit."""

from __future__ import annotations

import pytest

from thrifty.errors import ConfigError
from thrifty.plan import allreduce_seconds, scaling
from thrifty.plan.scaling import overlap_applies, scaling_conclusion
from thrifty.plan.units import parse_bandwidth, parse_count


def test_ring_allreduce_of_a_1_3b_fp32_gradient_over_8_gpus_at_300_gbs() -> None:
    # 2 * 7/8 * 5.2e9 bytes / 300e9 bytes/s = 30.33 ms (the seed's /8 "Gbps" reading: 243 ms)
    assert allreduce_seconds(1.3e9 * 4, 8, 300) == pytest.approx(0.0303333, rel=1e-5)


def test_one_gpu_never_communicates() -> None:
    s = scaling(1e9, gpus_per_node=1, compute_seconds=1.0, intra_node_gbs=300)
    assert s.allreduce_seconds == 0 and s.efficiency_no_overlap == 1


def test_efficiency_without_and_with_overlap() -> None:
    s = scaling(1.3e9, gpus_per_node=8, compute_seconds=0.1, intra_node_gbs=300)
    comm = allreduce_seconds(5.2e9, 8, 300)
    assert s.efficiency_no_overlap == pytest.approx(0.1 / (0.1 + comm))
    exposed = max(0.0, comm - 2 / 3 * 0.1)
    assert s.efficiency_overlap == pytest.approx(0.1 / (0.1 + exposed))
    assert s.efficiency_overlap >= s.efficiency_no_overlap


def test_across_nodes_the_network_limits_the_ring() -> None:
    s = scaling(
        1e9,
        gpus_per_node=8,
        nodes=2,
        compute_seconds=1.0,
        intra_node_gbs=220,
        inter_node_gbs=parse_bandwidth("400Gb/s"),
    )
    assert s.bus_gbs == 50
    assert s.bus_limited_by == "the node's network"
    assert s.allreduce_seconds == pytest.approx(2 * 15 / 16 * 4e9 / 50e9)


def test_more_nodes_without_a_network_bandwidth_is_refused() -> None:
    with pytest.raises(ConfigError, match="nodes > 1 needs the network bandwidth"):
        scaling(1e9, gpus_per_node=8, nodes=2, compute_seconds=1.0, intra_node_gbs=300)


@pytest.mark.parametrize(
    ("text", "gbs"),
    [
        ("300GB/s", 300),
        ("600GB/s bidirectional", 300),
        ("900 GB/s total", 450),
        ("400Gb/s", 50),
        ("400Gbit/s", 50),
        ("3200Gbps", 400),
        ("1.6TB/s", 1600),
    ],
)
def test_bandwidths_are_read_with_their_unit_as_gb_per_second_per_direction(
    text: str, gbs: float
) -> None:
    assert parse_bandwidth(text) == pytest.approx(gbs)


@pytest.mark.parametrize("text", ["300", "300 GB", "fast"])
def test_a_bandwidth_without_a_unit_is_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_bandwidth(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7B", 7e9),
        ("1.4T", 1.4e12),
        ("5.88e23", 5.88e23),
        ("$50,000", 5e4),
        ("50k", 5e4),
        ("124M", 124e6),
    ],
)
def test_counts_accept_suffixes(text: str, value: float) -> None:
    assert parse_count(text) == pytest.approx(value)


def test_overlap_applies_on_cuda_only_past_ddps_first_bucket() -> None:
    assert not overlap_applies("cpu", 1e9)[0]
    assert not overlap_applies("cuda", 2**20)[0]  # one bucket, reduced after backward
    assert overlap_applies("cuda", 100 * 2**20)[0]


def test_conclusion_says_whether_more_processes_pay_and_why_they_differ() -> None:
    base = {"processes": 1, "speedup": 1.0, "efficiency": 1.0, "predicted_efficiency": 1.0}
    top = {"processes": 2, "speedup": 0.8, "efficiency": 0.4, "predicted_efficiency": 0.95}
    rows = [{**base, "omp_num_threads": 2}, {**top, "omp_num_threads": 1}]

    def line() -> str:
        return scaling_conclusion(rows, overlap=False, unit="samples/s")

    assert "slower" in line() and "keep 1" in line()
    rows[1].update(speedup=1.9, efficiency=0.95)
    assert line().endswith("as predicted")
    rows[1].update(speedup=1.4, efficiency=0.7)
    assert "25 points lower" in line()
    rows[1].update(speedup=3.0, efficiency=1.5)
    assert "less of 2 threads than 2 processes of 1 each" in line()
