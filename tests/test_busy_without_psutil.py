"""The busy-machine line with the core install: without psutil, the load average (and on Linux
/proc/stat's CPU and steal times) still name a machine busy with other work."""

from __future__ import annotations

import os
import sys

import pytest

from helpers import TokenDataset, tiny_gpt
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.measure import system
from thrifty.measure.system import ProcStat


def test_proc_stat_gives_cpu_and_steal_percent_as_psutil_computes_them(tmp_path):
    stat = tmp_path / "stat"
    #                  user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 0 50 800 50 0 0 0 10 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    reader = ProcStat(str(stat))
    # 400 ticks: 150 user, 30 system, 100 idle, 20 iowait, 100 steal (guest is in user).
    stat.write_text("cpu  250 0 80 900 70 0 0 100 60 0\n")
    assert reader.sample() == {"cpu_percent": 70.0, "steal_percent": 25.0}
    assert reader.sample() == {}  # no tick since: no figure
    assert ProcStat(str(tmp_path / "missing")).sample() == {}  # not Linux


def test_a_busy_machine_is_named_without_psutil(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "psutil", None)  # the core install
    # The first sample at once: a few steps on a quiet machine end within the CPU window.
    monkeypatch.setattr(system, "MIN_CPU_WINDOW_SECONDS", 0.0)
    cpus = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (4.0 * cpus, 4.0 * cpus, 4.0 * cpus))
    config = TrainConfig.from_dict(
        {
            "run": {"max_steps": 6, "device": "cpu", "out": str(tmp_path / "r"), "progress": "off"},
            "batch": {"micro": 4},
            "data": {"num_workers": 0},
            "measure": {"sample_seconds": 0.05},
            "log": {"report": False},
        }
    )
    with Trainer(tiny_gpt(n_layer=1), TokenDataset(n=64), config) as trainer:
        trainer.fit()
    busy = trainer.diagnosis.busy
    assert busy is not None and busy.startswith(
        "the machine was busy (a load average of 4.0 threads per CPU"
    ), busy


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux's /proc/stat")
def test_without_psutil_the_sampler_reads_cpu_times_from_the_os(monkeypatch):
    from thrifty.measure.system import SystemSampler

    monkeypatch.setitem(sys.modules, "psutil", None)
    sampler = SystemSampler(gpu=False)
    sampler._open_psutil()
    values = sampler.sample_once()
    assert sampler.sources == ["os"]
    assert {"cpu_percent", "steal_percent", "load_per_cpu"} <= set(values)
    assert 0.0 <= values["cpu_percent"] <= 100.0
