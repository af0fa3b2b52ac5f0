from __future__ import annotations

import torch

from helpers import BurnDataset
from thrifty.loading import (
    EpochSampler,
    LoaderSettings,
    build_loader,
    choose_num_workers,
    worker_candidates,
)


def test_auto_workers_picks_more_than_zero_for_a_cpu_heavy_dataset():
    choice = choose_num_workers(BurnDataset(), LoaderSettings(batch_size=4), candidates=[0, 1, 2])
    print(choice.describe())
    assert choice.num_workers > 0
    assert set(choice.seconds_per_batch) == {0, 1, 2}
    assert choice.seconds_per_batch[choice.num_workers] < choice.seconds_per_batch[0]


def test_auto_workers_stays_at_zero_when_fetching_is_free():
    data = torch.utils.data.TensorDataset(torch.arange(512.0))
    choice = choose_num_workers(data, LoaderSettings(batch_size=8), candidates=[0, 2])
    assert choice.num_workers == 0  # worker processes only add inter-process copies here


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
