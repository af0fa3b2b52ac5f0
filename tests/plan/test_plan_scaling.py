"""Scaling: ring all-reduce time against compute time, with units explicit."""

from __future__ import annotations

import pytest

from thrifty.errors import ConfigError
from thrifty.plan import ModelShape, allreduce_seconds, load_catalog, scaling, training_flops
from thrifty.plan.scaling import (
    node_layout,
    node_size,
    overlap_applies,
    scaling_conclusion,
    step_compute_seconds,
)
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
    with pytest.raises(ConfigError, match="16 GPUs span 2 nodes of 8, so the all-reduce crosses"):
        scaling(1e9, gpus_per_node=8, nodes=2, compute_seconds=1.0, intra_node_gbs=300)


# Issue 14, item 7: `--gpu A100 --count 64 --network-bandwidth 400Gb/s` for 7B at seq 2048 was one
# node of 64 GPUs on NVLink (2 * 63/64 * 28e9 B / 220e9 B/s = 250.6 ms, 75.9% efficient) and the
# network flag was ignored. An A100's NVLink domain is 8 GPUs (catalog nvlink_domain: NVIDIA HGX
# A100), so 64 GPUs are 8 nodes and the ring crosses the 400 Gbit/s = 50 GB/s network:
# 2 * 63/64 * 28e9 / 50e9 = 1.1025 s (ring all-reduce, nccl-tests PERFORMANCE.md), and the step's
# 6 * 7e9 * 2048 / (312e12 * 0.35) = 787.7 ms of compute is 41.7% of compute + all-reduce.
ISSUE_7 = [
    *("plan", "--params", "7B", "--gpu", "A100", "--count", "64", "--seq", "2048"),
    *("--network-bandwidth", "400Gb/s"),
]


def test_64_a100s_are_8_nodes_and_all_reduce_at_the_network_bandwidth(cli) -> None:
    s = cli(*ISSUE_7, "--json").json()["scaling"]
    assert (s["nodes"], s["gpus_per_node"]) == (8, 8)
    assert s["bus_gbs"] == 50 and s["bus_limited_by"] == "the node's network"
    assert s["allreduce_seconds"] == pytest.approx(1.1025, rel=1e-9)
    assert s["compute_seconds"] == pytest.approx(0.78769, rel=1e-4)
    assert s["efficiency_no_overlap"] == pytest.approx(0.41670, rel=1e-4)  # issue: "about 42%"


def test_64_gpus_without_a_network_bandwidth_are_refused_in_one_line(cli) -> None:
    r = cli(*ISSUE_7[:-2], "--tokens", "1T")
    assert r.code == 2
    assert "64 GPUs span 8 nodes of 8, so the all-reduce crosses the network" in r.err
    assert "give --network-bandwidth (e.g. 400Gb/s)" in r.err


def test_eight_a100s_stay_one_node_on_nvlink(cli) -> None:
    s = cli(*ISSUE_7[:6], "8", "--seq", "2048", "--json").json()["scaling"]
    assert (s["nodes"], s["bus_limited_by"]) == (1, "the intra-node link")
    assert s["allreduce_seconds"] == pytest.approx(2 * 7 / 8 * 28e9 / 220e9)


@pytest.mark.parametrize(
    ("gpus", "layout"), [(1, (1, 1)), (8, (1, 8)), (12, (2, 6)), (9, (3, 3)), (64, (8, 8))]
)
def test_gpus_fill_the_fewest_equal_nodes_of_one_domain(gpus: int, layout: tuple) -> None:
    assert node_layout(gpus, 8) == layout


def test_a_node_is_the_nvlink_domain_or_a_pcie_server() -> None:
    catalog = load_catalog()
    assert node_size(catalog.gpu("A100")) == 8  # NVIDIA HGX A100: 8 GPUs on NVSwitch
    assert catalog.gpu("L4").nvlink_domain == 1
    assert node_size(catalog.gpu("L4")) == 8  # PCIe only: g5.48xlarge-style 8-GPU server


def test_step_compute_counts_attention_and_recompute_as_the_estimate_does() -> None:
    shape = ModelShape(layers=32, hidden=4096, heads=32, vocab=32000, seq=4096)
    got = step_compute_seconds(shape, 8192, 989.5e12, 0.35, recompute="full")
    flops = training_flops(shape, 8192, recompute="full")
    assert flops.attention > 0 and flops.recompute > 0
    assert got == pytest.approx(flops.total / (989.5e12 * 0.35))
    assert got > 6 * shape.params * 8192 / (989.5e12 * 0.35) * 1.3


def test_scaling_and_estimate_report_the_same_compute_per_step(cli) -> None:
    # Issue 14, item 7: the estimate's hours / steps must equal the scaling section's step.
    shape = ["--layers", "32", "--hidden", "4096", "--heads", "32", "--vocab", "32000"]
    data = cli(
        "plan",
        *shape,
        *("--seq", "4096", "--steps", "1000", "--batch", "512", "--recompute", "full"),
        *("--gpu", "A100", "--count", "64", "--network-bandwidth", "400Gb/s", "--json"),
    ).json()
    per_step = data["estimate"]["hours"] * 3600 / 1000
    assert data["scaling"]["compute_seconds"] == pytest.approx(per_step, rel=1e-12)


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
        ("$50000", 5e4),
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
