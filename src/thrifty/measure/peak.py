"""Peak dense FLOP/s of the device, for MFU: from the catalog on a GPU, measured on a CPU.

On a CUDA GPU the name `torch.cuda.get_device_name()` reports is matched to a catalog GPU and
the dense (no sparsity) figure for the dtype the matmuls actually run in is used: bf16/fp16
under autocast, TF32 for fp32 when `torch.backends.cuda.matmul.allow_tf32` (or matmul
precision "high") lets them, plain fp32 otherwise. An unknown GPU is an error asking for
`--peak-tflops`: a guessed peak would make every MFU figure wrong without saying so.

A CPU has no table: its peak is measured with a short matmul micro-benchmark in the dtype and
thread count the run uses, and labelled as measured. It is timed in the seconds the process
held the CPU (CPU time ÷ threads), so neighbours on a shared machine do not lower it.

`--peak-tflops` (`measure.peak_tflops`) gives the peak instead; the environment variable
THRIFTY_PEAK_TFLOPS does the same for every run that gives none (and skips the benchmark).
"""

from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from thrifty.errors import ConfigError, ThriftyError

if TYPE_CHECKING:
    from thrifty.plan.catalog import GPU, Catalog

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
PEAK_ENV = "THRIFTY_PEAK_TFLOPS"
_TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# Names CUDA reports, matched to the built-in catalog's GPUs. Word boundaries keep "GH200" from
# matching H200 and "L40S" from matching L4; the more specific variant comes first. A name none
# of these match is looked up among the catalog's other GPUs (a user catalog may add some);
# failing that, the peak must be given.
_BUILTIN_NAMES: tuple[tuple[str, str], ...] = (
    (r"\bH100\b.*\bNVL\b", "H100-NVL"),
    (r"\bH100\b.*\bPCIe\b", "H100-PCIe"),
    (r"\bH100\b.*\b(SXM\w*|HBM3)\b", "H100-SXM"),
    (r"\bH200\b(?!.*\bNVL\b)", "H200-SXM"),  # H200 NVL is a different (lower-power) part
    (r"\bA100\b(?=.*\b80GB\b)(?=.*\bPCIe\b)", "A100-PCIe-80GB"),  # SXM's peaks, less bandwidth
    (r"\bA100\b.*\b80GB\b", "A100-SXM4-80GB"),
    (r"\bA100\b", "A100-SXM4-40GB"),
    (r"\bL4\b", "L4"),
    (r"\bT4\b", "T4"),
    (r"\bV100\b.*\bPCIe\b", "V100-PCIe-16GB"),
    (r"\bV100\b", "V100-SXM2-16GB"),
)


@dataclass(frozen=True, slots=True)
class Peak:
    """Peak dense throughput in FLOP/s, where it came from, and whether it was measured."""

    flops_per_second: float
    source: str
    measured: bool

    @property
    def tflops(self) -> float:
        return self.flops_per_second / 1e12


def peak_flops(
    device: torch.device,
    dtype: str,
    *,
    given_tflops: float | None = None,
    tf32: bool = False,
    catalog: Catalog | None = None,
) -> Peak:
    """Peak dense FLOP/s of `device` for matmuls in `dtype` (fp32, bf16, fp16 or fp8).

    `given_tflops` (TFLOP/s, from `--peak-tflops`) overrides everything; without it the
    THRIFTY_PEAK_TFLOPS environment variable does. `tf32`: fp32 matmuls may use TF32 tensor
    cores, so the TF32 figure applies (CUDA only). `catalog`: the catalog to match GPU names
    against (default: the built-in one plus THRIFTY_CATALOG).
    """
    if dtype not in DTYPES:
        raise ConfigError(f"dtype = {dtype!r} is invalid: use one of {', '.join(DTYPES)}")
    if given_tflops is not None:
        if not given_tflops > 0:
            raise ConfigError(
                f"--peak-tflops = {given_tflops!r} is invalid: must be greater than 0"
            )
        return Peak(given_tflops * 1e12, f"given: {given_tflops:g} TFLOP/s", measured=False)
    from_env = _env_tflops()
    if from_env is not None:
        return Peak(from_env * 1e12, f"given: {from_env:g} TFLOP/s ({PEAK_ENV})", measured=False)
    if device.type == "cuda":
        return _gpu_peak(torch.cuda.get_device_name(device), dtype, tf32, catalog)
    if device.type == "cpu":
        return measure_cpu_peak(dtype)
    raise ThriftyError(
        f"no peak FLOP/s is known for device type {device.type!r}: give --peak-tflops "
        "(dense TFLOP/s for the dtype used) to get MFU"
    )


def _env_tflops() -> float | None:
    """THRIFTY_PEAK_TFLOPS as TFLOP/s, or None when unset or empty."""
    text = os.environ.get(PEAK_ENV, "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or not math.isfinite(value):
        raise ConfigError(
            f"{PEAK_ENV} = {text!r} is invalid: give the peak in TFLOP/s, a number greater "
            f"than 0 (e.g. {PEAK_ENV}=1.5), or unset it to use the catalog or measure"
        )
    return value


def match_gpu(device_name: str, catalog: Catalog | None = None) -> GPU | None:
    """The catalog GPU a CUDA device name denotes, or None when it is not in the catalog."""
    from thrifty.plan.catalog import UnknownNameError, load_catalog

    catalog = catalog or load_catalog()
    builtin_targets = {target.casefold() for _, target in _BUILTIN_NAMES}
    for pattern, target in _BUILTIN_NAMES:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            try:
                return catalog.gpu(target)
            except UnknownNameError:
                return None
    # Other catalog GPUs (user rows): their name or an alias appearing as words in the device
    # name, "A10G" in "NVIDIA A10G". Built-in names are left out so "NVIDIA H200 NVL" does
    # not fall back to the H200 row the first pass deliberately skipped.
    spaced = _words(device_name)
    candidates = [
        (len(label), gpu)
        for gpu in catalog.gpus.values()
        if gpu.name.casefold() not in builtin_targets
        for label in (gpu.name, *gpu.aliases)
        if re.search(rf"(^| ){re.escape(_words(label))}( |$)", spaced)
    ]
    return max(candidates, key=lambda c: c[0])[1] if candidates else None


def _words(name: str) -> str:
    return " ".join(re.split(r"[\s_\-]+", name.casefold())).strip()


def _gpu_peak(device_name: str, dtype: str, tf32: bool, catalog: Catalog | None) -> Peak:
    gpu = match_gpu(device_name, catalog)
    if gpu is None:
        raise ThriftyError(
            f"unknown GPU {device_name!r}: thrifty has no peak FLOP/s for it and will not "
            "guess; give --peak-tflops (dense TFLOP/s for the dtype used) or add the GPU to a "
            "--catalog file"
        )
    key = "tf32" if dtype == "fp32" and tf32 and "tf32" in gpu.peak_tflops else dtype
    if key not in gpu.peak_tflops:
        have = ", ".join(gpu.peak_tflops)
        raise ThriftyError(
            f"{gpu.name} ({device_name}) has no {dtype} peak in the catalog (it has {have}): "
            f"it lacks {dtype} tensor cores; use a precision it has or give --peak-tflops"
        )
    tflops = gpu.peak_tflops[key]
    return Peak(
        tflops * 1e12,
        f"catalog: {gpu.name} {key} dense {tflops:g} TFLOP/s ({gpu.peak_source})",
        measured=False,
    )


def measure_cpu_peak(dtype: str = "fp32", budget_seconds: float = 0.4) -> Peak:
    """Best matmul FLOP/s of this CPU in `dtype`, with the threads torch is set to use.

    Square products of 256, 512, 1024 and 2048 are timed, a few repeats each, until one product
    takes over 10 ms or `budget_seconds` is spent, so slow dtypes stay small and fast ones get
    big enough to reach steady state. Each product is timed in the seconds this process held
    the CPU (CPU time ÷ threads, at most the wall time): other processes stretch the wall time,
    not that. The best rate seen counts: caches favour some sizes. Measured once per process
    for each dtype and thread count (a warm worker's trials share it: their MFUs compare), with
    a generator of its own, so the run's random numbers are the same either way.
    """
    key = (dtype, torch.get_num_threads())
    if key in _MEASURED:
        return _MEASURED[key]
    _MEASURED[key] = peak = _measure_cpu_peak(dtype, budget_seconds)
    return peak


_MEASURED: dict[tuple[str, int], Peak] = {}


def _measure_cpu_peak(dtype: str, budget_seconds: float) -> Peak:
    if dtype not in _TORCH_DTYPES:
        raise ThriftyError(
            f"cannot measure a CPU peak for {dtype}: CPUs run fp32, bf16 or fp16 matmuls; "
            "give --peak-tflops"
        )
    torch_dtype = _TORCH_DTYPES[dtype]
    generator = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    best_rate, best_n, timed = 0.0, 0, 0
    for n in (256, 512, 1024, 2048):
        a = torch.randn(n, n, generator=generator).to(torch_dtype)
        b = torch.randn(n, n, generator=generator).to(torch_dtype)
        _time_matmul(a, b)  # first call: allocation and kernel selection
        fastest = math.inf
        for _ in range(3):
            fastest = min(fastest, _time_matmul(a, b))
            timed += 1
            if time.perf_counter() - started > budget_seconds:
                break
        rate = 2.0 * n**3 / max(fastest, 1e-9)
        if rate > best_rate:
            best_rate, best_n = rate, n
        if fastest > 0.01 or time.perf_counter() - started > budget_seconds:
            break
    threads = torch.get_num_threads()
    return Peak(
        best_rate,
        f"measured: best {dtype} matmul ({best_n}x{best_n}) of {timed} timed, {threads} "
        f"thread{'s' if threads != 1 else ''}: {best_rate / 1e9:.1f} GFLOP/s",
        measured=True,
    )


def _time_matmul(a: torch.Tensor, b: torch.Tensor) -> float:
    """Seconds the product held the CPU: CPU time ÷ threads, at most its wall time."""
    start, start_cpu = time.perf_counter(), time.process_time()
    torch.mm(a, b)
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    return min(wall, cpu / torch.get_num_threads())


def bf16_speedup(peak: Peak, gpu: GPU | None) -> float | None:
    """How many times the bf16 peak exceeds `peak` (the dtype in use) on `gpu`, if both known."""
    if gpu is None or "bf16" not in gpu.peak_tflops or peak.flops_per_second <= 0:
        return None
    ratio = gpu.peak_tflops["bf16"] * 1e12 / peak.flops_per_second
    return ratio if math.isfinite(ratio) else None
