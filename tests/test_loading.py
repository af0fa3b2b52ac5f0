from __future__ import annotations

import pytest
import torch

from helpers import BurnDataset
from thrifty.data.loading import (
    LoaderSettings,
    build_loader,
    choose_num_workers,
    measure_fetch_time,
    resolve_pin_memory,
    worker_candidates,
)
from thrifty.data.sampling import EpochSampler
from thrifty.errors import ConfigError


def fetch_times(seconds: dict[int, float]):
    """A stand-in for measure_fetch_time: seconds per batch by worker count (timings that are
    measured side by side live in benchmarks/loading.py)."""

    def measure(dataset, settings, collate_fn):
        return seconds[settings.num_workers]

    return measure


def test_auto_workers_picks_the_fewest_within_tolerance_of_the_fastest():
    measured = {0: 0.016, 1: 0.009, 2: 0.0052, 4: 0.0050}
    choice = choose_num_workers(
        BurnDataset(), LoaderSettings(4), candidates=[0, 1, 2, 4], measure=fetch_times(measured)
    )
    assert choice.num_workers == 2  # 4 is faster, but by less than the 10% tolerance
    assert choice.seconds_per_batch == measured
    assert choice.describe().startswith("num_workers = 2 (measured fetch time per batch — 0: 16.0")


def test_auto_workers_stays_at_zero_when_workers_only_add_copies():
    measured = {0: 0.0003, 2: 0.0017}
    choice = choose_num_workers(
        BurnDataset(), LoaderSettings(8), candidates=[0, 2], measure=fetch_times(measured)
    )
    assert choice.num_workers == 0


def test_measured_fetch_time_is_seconds_per_batch():
    seconds = measure_fetch_time(BurnDataset(ms=0.1), LoaderSettings(4, 1), batches=2)
    assert 0 < seconds < 10


def test_pin_memory_auto_pins_only_on_cuda_with_workers():
    assert resolve_pin_memory("auto", "cuda", 2) is True
    assert resolve_pin_memory("auto", "cuda", 0) is False  # the loop itself would pin
    assert resolve_pin_memory("auto", "cpu", 4) is False
    assert resolve_pin_memory(True, "cuda", 0) is True  # explicit settings stay as given
    assert resolve_pin_memory(False, "cuda", 4) is False
    with pytest.raises(ConfigError, match='data.pin_memory must be true, false or "auto", got'):
        resolve_pin_memory("yes", "cuda", 2)


def test_candidates_double_up_to_the_cpu_count():
    assert worker_candidates(cpus=2) == [0, 1, 2]
    assert worker_candidates(cpus=6) == [0, 1, 2, 4, 6]
    assert worker_candidates(cpus=64) == [0, 1, 2, 4, 8]


def test_loader_keeps_workers_and_drops_the_ragged_last_batch():
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    loader = build_loader(data, EpochSampler(10, shuffle=False), LoaderSettings(4, num_workers=1))
    assert loader.persistent_workers and loader.drop_last and not loader.pin_memory
    assert [b[0].tolist() for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_sampler_resumes_mid_epoch_without_replaying_it():
    sampler = EpochSampler(20, shuffle=True, seed=3)
    sampler.set_epoch(1)
    whole = list(sampler)
    sampler.set_epoch(1, start=7)
    assert list(sampler) == whole[7:]
    sampler.set_epoch(2)
    assert list(sampler) != whole  # a new permutation each epoch
    assert sorted(whole) == list(range(20))


def test_sampler_gives_each_rank_a_disjoint_equal_share():
    shares = []
    for rank in range(3):
        s = EpochSampler(20, seed=1, rank=rank, world_size=3)
        s.set_epoch(0)
        shares.append(list(s))
    assert all(len(x) == 6 for x in shares)
    assert len(set(shares[0]) | set(shares[1]) | set(shares[2])) == 18
