"""Peak dense FLOP/s: the catalog for a named GPU, a measurement on a CPU, never a guess."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from thrifty.errors import ConfigError, ThriftyError
from thrifty.measure import peak as peak_module
from thrifty.measure.peak import bf16_speedup, match_gpu, peak_flops
from thrifty.plan.catalog import load_catalog

CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def _builtin_catalog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THRIFTY_CATALOG", raising=False)
    monkeypatch.delenv("THRIFTY_PEAK_TFLOPS", raising=False)  # the suite pins it; not here


@pytest.fixture
def gpu_named(monkeypatch: pytest.MonkeyPatch):
    """Pretend the CUDA device reports `name` (no GPU is needed)."""

    def name_it(name: str) -> None:
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)

    return name_it


@pytest.mark.parametrize(
    ("device_name", "catalog_name"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA H200", "H200-SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB"),
        ("NVIDIA L4", "L4"),
        ("Tesla T4", "T4"),
        ("Tesla V100-SXM2-16GB", "V100-SXM2-16GB"),
        ("Tesla V100-PCIE-16GB", "V100-PCIe-16GB"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe-80GB"),
        ("NVIDIA L40S", "L40S"),  # not the L4
        ("NVIDIA A10G", "A10G"),
        ("NVIDIA B200", "B200"),
        ("AMD Instinct MI300X", "MI300X"),
    ],
)
def test_cuda_device_names_match_their_catalog_gpu(device_name: str, catalog_name: str) -> None:
    gpu = match_gpu(device_name)
    assert gpu is not None and gpu.name == catalog_name


@pytest.mark.parametrize("device_name", ["NVIDIA GH200 480GB", "NVIDIA H200 NVL"])
def test_lookalike_names_are_not_matched_to_a_different_gpu(device_name: str) -> None:
    assert match_gpu(device_name) is None


def test_h100_bf16_peak_is_the_dense_catalog_figure(gpu_named) -> None:
    gpu_named("NVIDIA H100 80GB HBM3")
    peak = peak_flops(CUDA, "bf16")
    assert peak.flops_per_second == pytest.approx(989.5e12)
    assert not peak.measured
    assert "H100-SXM" in peak.source and "bf16" in peak.source


@pytest.mark.parametrize(
    ("device_name", "dtype", "tf32", "key"),
    [
        ("NVIDIA A100-SXM4-80GB", "fp32", True, "tf32"),
        ("NVIDIA A100-SXM4-80GB", "fp32", False, "fp32"),
        ("NVIDIA H100 PCIe", "fp16", False, "fp16"),
        ("NVIDIA L4", "bf16", True, "bf16"),
        ("Tesla T4", "fp32", True, "fp32"),  # no TF32 on Turing: plain fp32 applies
        ("Tesla V100-SXM2-16GB", "fp16", False, "fp16"),
    ],
)
def test_peak_is_the_figure_for_the_dtype_actually_used(
    gpu_named, device_name: str, dtype: str, tf32: bool, key: str
) -> None:
    gpu_named(device_name)
    gpu = match_gpu(device_name)
    assert gpu is not None
    peak = peak_flops(CUDA, dtype, tf32=tf32)
    assert peak.flops_per_second == pytest.approx(gpu.peak_tflops[key] * 1e12)
    assert f" {key} " in peak.source


def test_unknown_gpu_asks_for_peak_tflops_instead_of_guessing(gpu_named) -> None:
    gpu_named("NVIDIA GeForce RTX 4090")
    with pytest.raises(ThriftyError, match=r"unknown GPU 'NVIDIA GeForce RTX 4090'.*--peak-tflops"):
        peak_flops(CUDA, "bf16")


def test_a_dtype_the_gpu_lacks_is_an_error_not_a_guess(gpu_named) -> None:
    gpu_named("Tesla T4")
    with pytest.raises(ThriftyError, match=r"no bf16 peak.*--peak-tflops"):
        peak_flops(CUDA, "bf16")


def test_given_peak_overrides_the_catalog_and_the_measurement(gpu_named) -> None:
    gpu_named("NVIDIA GeForce RTX 4090")
    peak = peak_flops(CUDA, "bf16", given_tflops=165.2)
    assert peak.flops_per_second == pytest.approx(165.2e12)
    assert peak.source.startswith("given") and not peak.measured
    assert peak_flops(torch.device("cpu"), "fp32", given_tflops=1.5).source.startswith("given")


def test_given_peak_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"--peak-tflops = -3 is invalid"):
        peak_flops(CUDA, "bf16", given_tflops=-3)


def test_a_user_catalog_gpu_is_matched_by_its_name(tmp_path: Path, gpu_named) -> None:
    path = tmp_path / "catalog.toml"
    path.write_text(
        '[[gpu]]\nname = "A10G"\npeak_tflops = { fp32 = 31.2, bf16 = 125 }\n'
        'peak_source = "test"\nmemory_gib = 24\nmemory_bandwidth_gbs = 600\n'
        'memory_source = "test"\ninterconnect = "PCIe"\ninterconnect_gbs_per_direction = 32\n'
    )
    gpu_named("NVIDIA A10G")
    peak = peak_flops(CUDA, "bf16", catalog=load_catalog(path))
    assert peak.flops_per_second == pytest.approx(125e12)


def test_cpu_peak_is_measured_positive_and_labelled() -> None:
    peak = peak_flops(torch.device("cpu"), "fp32")
    assert peak.measured
    assert peak.source.startswith("measured")
    assert peak.flops_per_second > 0


def test_the_environment_pins_the_peak_and_skips_the_benchmark(monkeypatch, gpu_named) -> None:
    def benchmark(*args: object) -> None:
        raise AssertionError("the CPU benchmark ran")

    monkeypatch.setattr(peak_module, "measure_cpu_peak", benchmark)
    monkeypatch.setenv("THRIFTY_PEAK_TFLOPS", "2.5")
    peak = peak_flops(torch.device("cpu"), "fp32")
    assert peak.flops_per_second == pytest.approx(2.5e12) and not peak.measured
    assert peak.source == "given: 2.5 TFLOP/s (THRIFTY_PEAK_TFLOPS)"
    gpu_named("NVIDIA H100 80GB HBM3")
    assert peak_flops(CUDA, "bf16").flops_per_second == pytest.approx(2.5e12)
    assert peak_flops(CUDA, "bf16", given_tflops=7).flops_per_second == pytest.approx(7e12)


@pytest.mark.parametrize("value", ["fast", "0", "-1", "nan"])
def test_a_bad_peak_in_the_environment_is_one_clear_error(monkeypatch, value: str) -> None:
    monkeypatch.setenv("THRIFTY_PEAK_TFLOPS", value)
    with pytest.raises(ConfigError) as caught:
        peak_flops(torch.device("cpu"), "fp32")
    assert str(caught.value) == (
        f"THRIFTY_PEAK_TFLOPS = {value!r} is invalid: give the peak in TFLOP/s, a number greater "
        "than 0 (e.g. THRIFTY_PEAK_TFLOPS=1.5), or unset it to use the catalog or measure"
    )


def test_a_matmul_is_timed_in_the_seconds_the_process_held_the_cpu(monkeypatch) -> None:
    """A neighbour holds the core 3/4 of the time: the wall clock runs 4x the CPU clock."""
    wall = iter([10.0, 10.4])
    cpu = iter([5.0, 5.1])
    fake_time = types.SimpleNamespace(
        perf_counter=lambda: next(wall), process_time=lambda: next(cpu)
    )
    monkeypatch.setattr(peak_module, "time", fake_time)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    seconds = peak_module._time_matmul(torch.ones(2, 2), torch.ones(2, 2))
    assert seconds == pytest.approx(0.1)


def test_a_device_without_a_peak_table_asks_for_one() -> None:
    with pytest.raises(ThriftyError, match="--peak-tflops"):
        peak_flops(torch.device("mps"), "fp32")


def test_unknown_dtype_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"dtype = 'int8' is invalid"):
        peak_flops(torch.device("cpu"), "int8")


def test_bf16_speedup_is_the_ratio_of_catalog_peaks(gpu_named) -> None:
    gpu_named("NVIDIA A100-SXM4-80GB")
    tf32 = peak_flops(CUDA, "fp32", tf32=True)
    assert bf16_speedup(tf32, match_gpu("NVIDIA A100-SXM4-80GB")) == pytest.approx(2.0)
    assert bf16_speedup(tf32, None) is None
