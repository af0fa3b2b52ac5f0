"""System sampling: means and swings per interval, and graceful without psutil or NVML."""

from __future__ import annotations

import logging
import sys
import time
import types

import pytest

from thrifty.measure import system
from thrifty.measure.system import SystemSampler


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(system, "_warned", set())


def _fake_nvml(power_fails: bool = True) -> types.SimpleNamespace:
    """A pynvml stand-in whose GPU alternates between idle and busy (a starved loader)."""
    state = {"reads": 0}

    def utilization(handle: object) -> types.SimpleNamespace:
        state["reads"] += 1
        return types.SimpleNamespace(gpu=100 if state["reads"] % 2 else 0)

    def power(handle: object) -> int:
        if power_fails:
            raise RuntimeError("Not Supported")
        return 300_000  # milliwatts

    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda index: f"gpu{index}",
        nvmlDeviceGetUtilizationRates=utilization,
        nvmlDeviceGetMemoryInfo=lambda handle: types.SimpleNamespace(used=3 * 2**30),
        nvmlDeviceGetPowerUsage=power,
    )
    return nvml


def test_sampler_reports_mean_and_swing_of_cpu_and_ram_per_interval() -> None:
    pytest.importorskip("psutil")
    with SystemSampler(interval_seconds=0.01, gpu=False) as sampler:
        deadline = time.monotonic() + 5
        while sampler.summary_and_reset().get("system_samples", 0) == 0:  # drop the first
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.35)  # a CPU reading waits for a tenth of a second after the last one
        summary = sampler.summary_and_reset()
    assert summary["system_samples"] >= 2
    for metric in ("cpu_percent", "ram_percent", "process_rss_gib"):
        assert summary[f"{metric}_std"] >= 0
    assert 0 <= summary["cpu_percent_mean"] <= 100
    assert summary["process_rss_gib_mean"] > 0
    if sys.platform.startswith("linux"):  # the load average and steal time the busy line reads
        import os

        load = os.getloadavg()[0] / (os.cpu_count() or 1)
        assert summary["load_per_cpu_mean"] == pytest.approx(load, abs=0.5)
        assert 0 <= summary["steal_percent_mean"] <= 100


def test_summary_starts_afresh_after_each_call() -> None:
    sampler = SystemSampler(gpu=False)  # never started: sample by hand
    sampler.sample_once()
    sampler.sample_once()
    assert sampler.summary_and_reset()["system_samples"] == 2
    assert sampler.summary_and_reset() == {"system_samples": 0}


def test_gpu_swing_is_measured_through_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(power_fails=False))
    sampler = SystemSampler()
    sampler._open_nvml()
    for _ in range(10):
        sampler.sample_once()
    summary = sampler.summary_and_reset()
    assert summary["gpu_util_percent_mean"] == pytest.approx(50)
    assert summary["gpu_util_percent_std"] == pytest.approx(50)  # idle, busy, idle, busy...
    assert summary["gpu_memory_used_gib_mean"] == pytest.approx(3)
    assert summary["gpu_power_watts_mean"] == pytest.approx(300)


def test_without_nvidia_ml_py_it_says_so_once_and_keeps_sampling(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        for _ in range(2):
            with SystemSampler(interval_seconds=0.01) as sampler:
                sampler.sample_once()
                summary = sampler.summary_and_reset()
    said = [r.getMessage() for r in caplog.records if "nvidia-ml-py" in r.getMessage()]
    assert len(said) == 1
    assert "pip install 'thrifty[monitor]'" in said[0]
    assert "gpu_util_percent_mean" not in summary
    assert summary["system_samples"] >= 1


def test_without_psutil_or_nvml_the_sampler_still_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        with SystemSampler(interval_seconds=0.01) as sampler:
            assert sampler.sources == ["os"]  # the load average and /proc/stat need no psutil
            time.sleep(0.3)  # a CPU reading waits out a tenth of a second after the last
            summary = sampler.summary_and_reset()
    assert "ram_percent_mean" not in summary and "load_per_cpu_mean" in summary
    assert any("psutil is not installed" in r.getMessage() for r in caplog.records)


def test_a_reading_the_board_lacks_is_dropped_after_saying_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml(power_fails=True))
    sampler = SystemSampler(gpu=None)
    sampler._open_nvml()
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        for _ in range(3):
            sampler.sample_once()
    summary = sampler.summary_and_reset()
    assert "gpu_power_watts_mean" not in summary
    assert "gpu_util_percent_mean" in summary
    assert sum("gpu_power_watts" in r.getMessage() for r in caplog.records) == 1


def test_a_cpu_run_does_not_look_for_a_gpu(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        SystemSampler(interval_seconds=0.01, gpu=False).start().stop()
    assert not any("GPU" in r.getMessage() for r in caplog.records)


def test_stop_ends_the_thread_and_interval_must_be_positive() -> None:
    sampler = SystemSampler(interval_seconds=0.01, gpu=False).start()
    thread = sampler._thread
    sampler.stop()
    assert thread is not None and not thread.is_alive()
    with pytest.raises(ValueError, match="interval_seconds"):
        SystemSampler(interval_seconds=0)


def _fake_nvml_of(uuids: list[str | bytes]) -> types.SimpleNamespace:
    """NVML seeing several GPUs, in its own order (it ignores CUDA_VISIBLE_DEVICES)."""
    nvml = _fake_nvml(power_fails=False)
    nvml.nvmlDeviceGetCount = lambda: len(uuids)
    nvml.nvmlDeviceGetUUID = lambda handle: uuids[int(handle.removeprefix("gpu"))]
    return nvml


def _torch_with_device_uuids(monkeypatch: pytest.MonkeyPatch, uuids: dict[int, str]) -> None:
    import torch

    props = {i: types.SimpleNamespace(uuid=u) for i, u in uuids.items()}

    def get_device_properties(device: object) -> types.SimpleNamespace:
        return props[device if isinstance(device, int) else torch.device(device).index]

    monkeypatch.setattr(torch.cuda, "get_device_properties", get_device_properties)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)


def test_the_gpu_sampled_is_the_training_device_matched_by_uuid(monkeypatch) -> None:
    uuid_a, uuid_b = "0a1b2c3d-0000-1111-2222-333344445555", "9f8e7d6c-0000-1111-2222-333344445555"
    # CUDA numbers the GPUs A, B; NVML lists them B, A (and as bytes, as older versions do)
    monkeypatch.setitem(
        sys.modules, "pynvml", _fake_nvml_of([f"GPU-{uuid_b}".encode(), f"GPU-{uuid_a}"])
    )
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # the first entry is not the device
    _torch_with_device_uuids(monkeypatch, {0: uuid_a, 1: uuid_b})
    for device, nvml_handle in (("cuda:0", "gpu1"), ("cuda:1", "gpu0")):
        sampler = SystemSampler(device=device)
        sampler._open_nvml()
        assert sampler._handle == nvml_handle
    sampler = SystemSampler()  # no device given: the current one (cuda:1 here)
    sampler._open_nvml()
    assert sampler._handle == "gpu0"


def test_a_device_uuid_nvml_does_not_list_is_said_and_the_gpu_not_sampled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml_of(["GPU-ffff"]))
    _torch_with_device_uuids(monkeypatch, {0: "0a1b"})
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        sampler = SystemSampler(device="cuda:0")
        sampler._open_nvml()
    assert sampler.sources == []
    assert any("has the UUID 0a1b" in r.getMessage() for r in caplog.records)


def test_cpu_is_read_only_a_tenth_of_a_second_or_more_after_the_last_reading(monkeypatch):
    """psutil's cpu_percent right after a reading says 0%: no measurement. The sampler's first
    sample follows the priming at once, and in a short run it made "CPU utilization 0% ± 0%":
    the sampling thread now waits out the rest of the tenth."""
    readings = iter([0.0, 37.0, 41.0])  # the priming, then two real readings
    fake = types.SimpleNamespace(
        cpu_percent=lambda interval=None: next(readings),
        cpu_times_percent=lambda interval=None: types.SimpleNamespace(steal=0.0),
        virtual_memory=lambda: types.SimpleNamespace(percent=50.0),
        Process=lambda: types.SimpleNamespace(memory_info=lambda: types.SimpleNamespace(rss=2**30)),
    )
    monkeypatch.setitem(sys.modules, "psutil", fake)
    now = [100.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    monkeypatch.setattr(system.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(system.time, "sleep", sleep)
    sampler = SystemSampler(gpu=False)
    sampler._open_psutil()  # primes at t = 100.0
    now[0] = 100.01
    assert sampler.sample_once()["cpu_percent"] == 37.0  # read after waiting out the tenth
    assert slept == [pytest.approx(0.09)]
    now[0] = 100.6
    assert sampler.sample_once()["cpu_percent"] == 41.0 and len(slept) == 1  # no wait needed
    summary = sampler.summary_and_reset()
    assert summary["cpu_percent_mean"] == 39.0 and summary["system_samples"] == 2


def test_the_sampling_thread_primes_its_own_cpu_reading(monkeypatch):
    """psutil keeps its last CPU reading per thread: the sampler was primed in the thread that
    started it, so the sampling thread's first reading compared the CPU times with themselves
    and said 0%, every short run's "CPU utilization 0% ± 0%"."""
    import threading

    seen: set[int] = set()

    def per_thread(interval=None):  # psutil's behaviour: 0% at a thread's first reading
        first = threading.get_ident() not in seen
        seen.add(threading.get_ident())
        return 0.0 if first else 63.0

    fake = types.SimpleNamespace(
        cpu_percent=per_thread,
        cpu_times_percent=lambda interval=None: types.SimpleNamespace(steal=0.0),
        virtual_memory=lambda: types.SimpleNamespace(percent=50.0),
        Process=lambda: types.SimpleNamespace(memory_info=lambda: types.SimpleNamespace(rss=2**30)),
    )
    monkeypatch.setitem(sys.modules, "psutil", fake)
    sampler = SystemSampler(gpu=False)
    sampler._open_psutil()  # primed here, in the test's thread
    read: list[float] = []
    thread = threading.Thread(target=lambda: read.append(sampler.sample_once()["cpu_percent"]))
    thread.start()
    thread.join()
    assert read == [63.0]
