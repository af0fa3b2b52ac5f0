"""System sampling in a background thread: CPU and RAM (psutil), GPU utilization, memory and
power (NVML, through `pynvml` from nvidia-ml-py). Without psutil, the load average and (on
Linux) the CPU utilization and steal time are read from the OS: the busy-machine line needs
no optional package.

A daemon thread samples at a fixed rate; the training thread only calls `summary_and_reset()`
once per logging interval, which returns each metric's mean and standard deviation over that
interval. The deviation is the point: a GPU whose utilization swings between 0 and 100% is
waiting for batches in bursts — the signature of a starved loader — even when its mean looks
fine.

Both libraries are optional and imported when sampling starts, never at import. Whatever is
missing (psutil, nvidia-ml-py, a driver, a GPU) is said once, as a logging warning, and the
rest keeps being sampled.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("thrifty")

_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(key: str, message: str) -> None:
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    log.warning(message)


MIN_CPU_WINDOW_SECONDS = 0.1  # psutil's cpu_percent needs this much time between readings
PROC_STAT = "/proc/stat"  # Linux's CPU time counters, read where psutil is not installed


class ProcStat:
    """CPU utilization and steal time (percent of all CPUs' time) between two readings of
    /proc/stat, as psutil computes them: busy is everything but idle and iowait, and guest
    time is already counted in user time. Linux only: elsewhere `sample()` returns {}."""

    def __init__(self, path: str = PROC_STAT) -> None:
        self.path = path
        self._last = self._read()

    def _read(self) -> list[int] | None:
        try:
            with open(self.path) as f:
                fields = f.readline().split()
        except OSError:
            return None
        if not fields or fields[0] != "cpu" or len(fields) < 9:
            return None
        # user nice system idle iowait irq softirq steal: the times every CPU spent, in ticks.
        return [int(v) for v in fields[1:9]]

    def sample(self) -> dict[str, float]:
        """`cpu_percent` and `steal_percent` since the last reading; {} where unreadable or
        when no tick passed."""
        now = self._read()
        last, self._last = self._last, now
        if now is None or last is None:
            return {}
        delta = [b - a for a, b in zip(last, now, strict=True)]
        total = sum(delta)
        if total <= 0:
            return {}
        idle = delta[3] + delta[4]
        return {
            "cpu_percent": 100.0 * (total - idle) / total,
            "steal_percent": 100.0 * delta[7] / total,
        }


class SystemSampler:
    """Samples system metrics every `interval_seconds` in a daemon thread.

    Metrics (whichever are available): `cpu_percent` (all CPUs, 0–100), `load_per_cpu` (the
    1-minute load average over the machine's CPUs: above 1, more threads want to run than there
    are CPUs), `steal_percent` (time a hypervisor gave this VM's CPUs to other guests, Linux),
    `ram_percent` (system memory in use), `process_rss_gib` (this process's resident memory),
    `gpu_util_percent`
    (share of time a kernel ran), `gpu_memory_used_gib`, `gpu_power_watts`.

    `gpu`: None samples the GPU when NVML finds one and says once why not otherwise; False never
    samples it (a CPU run). `device`: the CUDA device trained on (`cuda:1`); its NVML handle is
    the one whose UUID matches the device's. Without it, the current CUDA device once CUDA is
    in use. `gpu_index`: an NVML index (or UUID) to sample instead. Failing all of these, the
    first device of CUDA_VISIBLE_DEVICES (NVML numbers GPUs ignoring that variable), else 0.

        sampler = SystemSampler(0.5).start()
        ...
        metrics.update(sampler.summary_and_reset())  # once per logging interval
        ...
        sampler.stop()
    """

    def __init__(
        self,
        interval_seconds: float = 0.5,
        *,
        gpu: bool | None = None,
        gpu_index: int | str | None = None,
        device: Any = None,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds = {interval_seconds!r}: must be greater than 0")
        self.interval_seconds = interval_seconds
        self._want_gpu = gpu
        self._gpu_index = gpu_index
        self._device = device
        self._samples: dict[str, list[float]] = {}
        self._count = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._psutil: Any = None
        self._process: Any = None
        self._cpu_since = 0.0  # when psutil's CPU times were last read (time.monotonic)
        self._primed: set[int] = set()  # the threads psutil has a first CPU reading of
        self._proc_stat: ProcStat | None = None  # CPU times from the OS, without psutil
        self._nvml: Any = None
        self._handle: Any = None
        self._gpu_readers: dict[str, Callable[[], float]] = {}

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> SystemSampler:
        """Open the sources that are available and start the sampling thread (idempotent)."""
        if self._thread is not None:
            return self
        self._open_psutil()
        if self._want_gpu is not False:
            self._open_nvml()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="thrifty-system-sampler", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread and release NVML; the samples not yet summarized are kept."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join(timeout=max(1.0, 2 * self.interval_seconds))
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # shutting down must never fail a run
                pass
            self._nvml = self._handle = None
            self._gpu_readers = {}

    def __enter__(self) -> SystemSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def sources(self) -> list[str]:
        """What is being sampled: 'psutil' or 'os' (the load average and /proc/stat), and
        'nvml'."""
        cpu = "psutil" if self._psutil is not None else "os" if self._proc_stat else None
        return [name for name in (cpu, "nvml" if self._handle else None) if name]

    # --- reading ---------------------------------------------------------------------------

    def summary_and_reset(self) -> dict[str, float]:
        """Mean and standard deviation of each metric since the last call, then start afresh.

        Keys: `<metric>_mean` and `<metric>_std` (population standard deviation, the swing),
        plus `system_samples`, the number of samples summarized (0 when none was taken yet).
        """
        with self._lock:
            samples, self._samples = self._samples, {}
            count, self._count = self._count, 0
        summary: dict[str, float] = {"system_samples": float(count)}
        for name, values in samples.items():
            if not values:
                continue
            mean = sum(values) / len(values)
            var = sum((v - mean) ** 2 for v in values) / len(values)
            summary[f"{name}_mean"] = mean
            summary[f"{name}_std"] = math.sqrt(var)
        return summary

    def sample_once(self) -> dict[str, float]:
        """Take one sample now (what the thread does each interval) and record it."""
        values = {**self._sample_cpu(), **self._sample_gpu()}
        with self._lock:
            for name, value in values.items():
                self._samples.setdefault(name, []).append(value)
            self._count += 1
        return values

    # --- sampling thread -------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as exc:  # a flaky sensor must not kill the thread or the run
                _warn_once(f"sample-error-{type(exc).__name__}", f"system sampling: {exc}")
            self._stop.wait(self.interval_seconds)

    # --- sources ---------------------------------------------------------------------------

    def _open_psutil(self) -> None:
        try:
            self._psutil = importlib.import_module("psutil")
        except ImportError:
            self._proc_stat = ProcStat()
            _warn_once(
                "psutil",
                "RAM is not sampled: psutil is not installed (pip install 'thrifty[monitor]'); "
                "the load average and CPU times are read from the OS",
            )
            self._cpu_since = time.monotonic()
            return
        self._process = self._psutil.Process()
        self._prime_cpu()

    def _prime_cpu(self) -> None:
        """psutil's CPU percentages compare the CPU times with its last reading *in the same
        thread*; the first reading of a thread has none and says 0%. Read once to start."""
        self._psutil.cpu_percent(interval=None)
        self._psutil.cpu_times_percent(interval=None)
        self._cpu_since = time.monotonic()
        self._primed.add(threading.get_ident())

    def _open_nvml(self) -> None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            _warn_once(
                "pynvml",
                "GPU utilization, memory and power are not sampled: nvidia-ml-py is not "
                "installed (pip install 'thrifty[monitor]')",
            )
            return
        try:
            nvml.nvmlInit()
        except Exception as exc:
            _warn_once(
                "nvml-init",
                "GPU utilization, memory and power are not sampled: no NVIDIA driver or GPU "
                f"({exc})",
            )
            return
        try:
            handle = self._nvml_handle(nvml)
        except Exception as exc:
            _warn_once("nvml-device", f"GPU utilization, memory and power are not sampled: {exc}")
            nvml.nvmlShutdown()
            return
        self._nvml, self._handle = nvml, handle
        self._gpu_readers = {
            "gpu_util_percent": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
            "gpu_memory_used_gib": lambda: nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**30,
            "gpu_power_watts": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        }

    def _nvml_handle(self, nvml: Any) -> Any:
        """The NVML handle of the GPU this process trains on (see the class docstring)."""
        count = nvml.nvmlDeviceGetCount()
        if self._gpu_index is None:
            uuid = _torch_device_uuid(self._device)
            if uuid is not None:
                return _handle_by_uuid(nvml, count, uuid)
        index = self._gpu_index if self._gpu_index is not None else _visible_gpu_index()
        if isinstance(index, str):
            return nvml.nvmlDeviceGetHandleByUUID(index)
        if count > index:
            return nvml.nvmlDeviceGetHandleByIndex(index)
        raise LookupError(f"NVML sees {count} GPU(s), none with index {index}")

    def _sample_cpu(self) -> dict[str, float]:
        """CPU and RAM: psutil's figures, or without it what the OS gives for free."""
        if self._psutil is None:
            times: dict[str, float] = {}
            if self._proc_stat is not None:
                self._wait_cpu_window()  # a reading of a few ticks says 0% or 100%
                times = self._proc_stat.sample()
                self._cpu_since = time.monotonic()
            return {**times, **_load_per_cpu()}
        values = {
            "ram_percent": float(self._psutil.virtual_memory().percent),
            "process_rss_gib": self._process.memory_info().rss / 2**30,
        }
        # psutil compares CPU times with its last reading in this thread: the sampling thread's
        # first sample had none (the priming ran in the thread that started the sampler) and
        # read 0%, and so does a reading less than a tenth of a second after the last: a short
        # run's "CPU utilization 0% ± 0%" came from both. Prime this thread, and wait out the
        # rest of that tenth.
        if threading.get_ident() not in self._primed:
            self._prime_cpu()
        self._wait_cpu_window()
        values["cpu_percent"] = float(self._psutil.cpu_percent(interval=None))
        steal = getattr(self._psutil.cpu_times_percent(interval=None), "steal", None)
        self._cpu_since = time.monotonic()
        if steal is not None:
            values["steal_percent"] = float(steal)
        return {**values, **_load_per_cpu()}

    def _wait_cpu_window(self) -> None:
        """Sleep out the rest of MIN_CPU_WINDOW_SECONDS since the last CPU reading."""
        wait = MIN_CPU_WINDOW_SECONDS - (time.monotonic() - self._cpu_since)
        if wait > 0:
            time.sleep(wait)

    def _sample_gpu(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for name, read in list(self._gpu_readers.items()):
            try:
                values[name] = float(read())
            except Exception as exc:  # some boards or drivers lack a reading (power, often)
                del self._gpu_readers[name]
                _warn_once(f"nvml-{name}", f"{name} is not sampled: NVML says {exc}")
        return values


def _load_per_cpu() -> dict[str, float]:
    """The 1-minute load average over the machine's CPUs (no psutil needed), where the OS
    keeps one."""
    if not hasattr(os, "getloadavg"):
        return {}
    try:
        return {"load_per_cpu": os.getloadavg()[0] / (os.cpu_count() or 1)}
    except OSError:  # no load average on this system
        return {}


def _torch_device_uuid(device: Any) -> str | None:
    """The UUID torch reports for `device` (default: the current CUDA device, once CUDA is in
    use: asking must not initialize CUDA in a process that does not use it), else None."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if device is None:
            if not torch.cuda.is_initialized():
                return None
            device = torch.cuda.current_device()
        elif torch.device(device).type != "cuda":
            return None
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    except Exception:  # no CUDA, or a build without device UUIDs: fall back to indices
        return None
    return None if uuid is None else str(uuid)


def _normal_uuid(uuid: str | bytes) -> str:
    """A UUID as NVML ("GPU-1a2b...", bytes in older versions) and torch ("1a2b...") agree."""
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    text = text.strip().lower()
    for prefix in ("gpu-", "mig-"):
        text = text.removeprefix(prefix)
    return text


def _handle_by_uuid(nvml: Any, count: int, uuid: str) -> Any:
    """The NVML handle whose UUID is `uuid`: NVML's indices ignore CUDA_VISIBLE_DEVICES and
    may be ordered differently from CUDA's, the UUID is the same everywhere."""
    wanted = _normal_uuid(uuid)
    for index in range(count):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        if _normal_uuid(nvml.nvmlDeviceGetUUID(handle)) == wanted:
            return handle
    raise LookupError(f"none of the {count} GPU(s) NVML sees has the UUID {uuid}")


def _visible_gpu_index() -> int | str:
    """The NVML index (or UUID) of CUDA device 0: NVML numbers GPUs ignoring
    CUDA_VISIBLE_DEVICES, so the first entry of that variable names the GPU this process uses."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if visible.isdigit():
        return int(visible)
    if visible.startswith(("GPU-", "MIG-")):
        return visible
    return 0
