"""Catalog figures pinned to their sources: spot medians, price dates, datasheet peaks, links."""

from __future__ import annotations

import pytest

from thrifty.plan.catalog import load_catalog


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_p4d_typical_spot_is_the_median_of_its_four_zones_not_the_midpoint(catalog) -> None:
    """SkyPilot catalog v8 (commit 00148f2a), us-east-1: 2.47 / 8.19 / 8.12 / 7.88."""
    p4d = catalog.instance("p4d.24xlarge")
    assert sorted(p4d.spot_zones.values()) == [2.4655, 7.8799, 8.1203, 8.1915]
    assert p4d.spot_per_hour == pytest.approx(8.00, abs=0.005)  # the midpoint would be 5.33
    assert p4d.spot_range == (2.4655, 8.1915)
    assert p4d.spot_basis == "median of 4 zones"


@pytest.mark.parametrize(
    ("name", "median"),
    [
        ("p4d.24xlarge@v7", 6.7915),  # v7 zones 6.7915 / 9.6107 / 5.0933; midpoint was 7.35
        ("p5.48xlarge", 20.2037),  # v8 zones 19.25 / 21.15 / 25.75 / 17.63; midpoint was 21.70
        ("p5.48xlarge@v7", 26.7861),  # six v7 zones; midpoint was 25.66
        ("p5en.48xlarge", 17.40215),  # v8 zones 18.25 / 16.56; midpoint was 17.40
        ("p6-b200.48xlarge", 21.0148),  # one v8 zone
    ],
)
def test_aws_spot_medians_follow_the_skypilot_zone_prices(catalog, name, median) -> None:
    assert catalog.instance(name).spot_per_hour == pytest.approx(median)


def test_the_pre_cut_prices_are_dated_before_the_june_2025_cut(catalog) -> None:
    """$32.77 and $98.32 were AWS list prices until the June 2025 GPU price cut."""
    for name, price in (("p4d.24xlarge@v7", 32.77), ("p5.48xlarge@v7", 98.32)):
        instance = catalog.instance(name)
        assert instance.on_demand_per_hour == price
        assert instance.price_date == "before 2025-06"
        assert "June 2025" in instance.price_note


def test_h200_uses_the_measured_nvlink4_bus_bandwidth_of_h100(catalog) -> None:
    """Same NVLink 4 / NVSwitch fabric; nccl-tests on 8xH100 ~370 GB/s."""
    assert catalog.gpu("H200").usable_bus_gbs == catalog.gpu("H100").usable_bus_gbs == 370


def test_h100_nvl_peaks_are_the_single_gpu_datasheet_figures(catalog) -> None:
    """NVIDIA H100 datasheet, NVL column, one GPU: 835 / 1,671 / 3,341 TFLOP/s sparse, halved."""
    nvl = catalog.gpu("H100-NVL")
    assert nvl.peak_tflops == {
        "fp32": 60,
        "tf32": 417.5,
        "bf16": 835.5,
        "fp16": 835.5,
        "fp8": 1670.5,
    }
    assert (nvl.memory_gib, nvl.memory_bandwidth_gbs) == (94, 3900)
    assert not nvl.uncertain
    assert "datasheet" in nvl.peak_source


def test_l4_fp8_is_half_the_datasheet_sparse_figure(catalog) -> None:
    """NVIDIA L4 datasheet: FP8 485 TFLOP/s with sparsity."""
    assert catalog.gpu("L4").peak_flops("fp8") == 242.5e12


@pytest.mark.parametrize(
    ("gpu", "bf16", "memory_gib", "bandwidth"),
    [
        ("A100-PCIe", 312, 80, 1935),  # NVIDIA A100 datasheet, 80GB PCIe
        ("A10G", 125, 24, 600),  # NVIDIA A10 datasheet (no A10G datasheet): untraced
        ("L40S", 362.05, 48, 864),  # NVIDIA L40S datasheet
        ("B200", 2250, 180, 8000),  # NVIDIA HGX B200 datasheet, per GPU
        ("MI300X", 1307.4, 192, 5300),  # AMD Instinct MI300X data sheet
    ],
)
def test_new_gpus_carry_their_datasheet_figures(catalog, gpu, bf16, memory_gib, bandwidth) -> None:
    found = catalog.gpu(gpu)
    assert found.peak_tflops["bf16"] == bf16
    assert (found.memory_gib, found.memory_bandwidth_gbs) == (memory_gib, bandwidth)
    assert "datasheet" in found.peak_source or "data sheet" in found.peak_source


def test_a10g_figures_are_marked_untraced(catalog) -> None:
    assert "peak_tflops.bf16" in catalog.gpu("A10G").untraced


@pytest.mark.parametrize(
    ("name", "gpu"),
    [("p6-b200.48xlarge", "B200"), ("g5.48xlarge", "A10G"), ("g6e.48xlarge", "L40S")],
)
def test_new_instances_carry_the_new_gpus(catalog, name, gpu) -> None:
    instance = catalog.instance(name)
    assert instance.gpu.name == gpu and instance.gpu_count == 8


def test_survey_and_recalled_prices_are_untraced_and_the_rest_traced(catalog) -> None:
    untraced = {i.name for i in catalog.instances.values() if not i.price_traced}
    assert untraced == {
        "g5.48xlarge",
        "g6e.48xlarge",
        "lambda-1x-h100-sxm",
        "lambda-8x-h100-sxm",
        "runpod-h100-sxm-community",
        "runpod-h100-sxm-secure",
        # single-GPU rows: list prices as recalled, not read from the pages
        "g5.xlarge",
        "g6.xlarge",
        "g6e.xlarge",
        "p5.4xlarge",
        "a2-highgpu-1g",
        "g2-standard-4",
        "a3-highgpu-1g",
    }


@pytest.mark.parametrize(
    ("name", "domain"),
    [("p4d.24xlarge", 8), ("p5.48xlarge", 8), ("lambda-1x-h100-sxm", 1), ("g6e.48xlarge", 1)],
)
def test_an_instances_nvlink_domain_is_capped_by_its_gpu_count(catalog, name, domain) -> None:
    """HGX A100/H100: 8 GPUs on NVSwitch; L40S has no NVLink."""
    assert catalog.instance(name).nvlink_domain == domain


def test_prices_marks_untraced_rows(cli) -> None:
    out = cli("prices", "--instances").out
    assert "untraced (no primary source" in out and "lambda-8x-h100-sxm" in out
    assert "median across the zones" in out
