"""The epoch order: a permutation computed on the fly from (seed, epoch), so a rank holds no list
of the epoch's indices (8 bytes or more each) and starts anywhere in the epoch for free."""

from __future__ import annotations

import gc

import psutil
import pytest
import torch

from thrifty.data import loading as data_loading
from thrifty.data import sampling
from thrifty.data.loading import LoaderSettings, build_loader, worker_candidates
from thrifty.data.sampling import EpochSampler, epoch_order
from thrifty.errors import ConfigError

SIZES = [1, 2, 3, 17, 1000, 4099, 40_000]  # 40 000 spans several blocks of positions


def order(n: int, seed: int = 0, epoch: int = 0) -> list[int]:
    return epoch_order(torch.arange(n), n, seed, epoch).tolist()


def sampler(n: int, rank: int = 0, world: int = 1, start: int = 0, epoch: int = 0) -> EpochSampler:
    s = EpochSampler(n, seed=5, rank=rank, world_size=world)
    s.set_epoch(epoch, start)
    return s


@pytest.mark.parametrize("n", SIZES)
def test_the_epoch_order_is_a_permutation_and_the_sampler_iterates_it(n):
    assert sorted(order(n)) == list(range(n))
    assert list(sampler(n, epoch=2)) == order(n, seed=5, epoch=2)


@pytest.mark.parametrize("world", [2, 3, 8])
@pytest.mark.parametrize("n", SIZES)
def test_rank_shares_are_disjoint_equal_and_interleave_into_the_order(n, world):
    shares = [list(sampler(n, rank, world)) for rank in range(world)]
    per_rank = n // world
    assert all(len(share) == per_rank for share in shares)
    assert len(set().union(*shares)) == per_rank * world  # disjoint
    # Rank r holds positions r, r + W, ... of the order over its first (n // W) × W positions.
    interleaved = [shares[rank][k] for k in range(per_rank) for rank in range(world)]
    assert interleaved == order(n, seed=5)[: per_rank * world]


def test_keys_name_each_sample_with_its_epoch_and_position_over_all_ranks():
    s = sampler(1000, rank=2, world=3, start=4, epoch=7)
    keys = list(s.keys())
    assert [i for i, _, _ in keys] == list(s)
    assert {e for _, e, _ in keys} == {7}
    assert [p for _, _, p in keys] == [2 + 3 * k for k in range(4, 1000 // 3)]
    assert len(keys) == len(s)


@pytest.mark.parametrize(
    ("n", "world", "rank", "start"),
    [(1000, 1, 0, 1), (4099, 3, 1, 700), (40_000, 1, 0, 16_383), (40_000, 2, 1, 16_385)],
)
def test_a_start_yields_the_tail_without_computing_the_skipped_samples(
    monkeypatch, n, world, rank, start
):
    whole = list(sampler(n, rank, world))
    computed = []

    def counting(positions, *args):
        computed.append(positions.numel())
        return epoch_order(positions, *args)

    monkeypatch.setattr(sampling, "epoch_order", counting)
    tail = list(sampler(n, rank, world, start))
    assert tail == whole[start:]
    assert sum(computed) == len(tail)  # not one position before `start`
    assert [i for i, _, _ in sampler(n, rank, world, start).keys()] == tail


def test_the_order_differs_between_epochs_and_seeds():
    for n in (1000, 4099):
        assert order(n, epoch=0) != order(n, epoch=1)
        assert order(n, seed=0) != order(n, seed=1)
    # Small sets: every arrangement turns up over the epochs, not a few fixed ones.
    assert len({tuple(order(2, epoch=e)) for e in range(50)}) == 2
    assert len({tuple(order(3, epoch=e)) for e in range(100)}) == 6


@pytest.mark.parametrize("n", [1000, 4099, 40_000])
def test_the_order_looks_random(n):
    got = torch.tensor(order(n, seed=3, epoch=1))
    steps = got.diff()
    assert (steps > 0).any() and (steps < 0).any()  # not monotone
    # Uniform shuffles move a sample n / 3 on average; a rotation or stride keeps its steps.
    assert (got - torch.arange(n)).abs().float().mean() > n / 4
    assert len(set(steps.tolist())) > n / 2
    assert (got == torch.arange(n)).sum() < 10  # about one fixed point expected


def test_the_order_is_pinned_to_its_recorded_name():
    # Checkpoints record SHUFFLE: a change here changes the samples every resumed run sees,
    # and must come with a new name.
    assert sampling.SHUFFLE == "feistel-1"
    assert order(1000, seed=42, epoch=3)[:6] == [612, 130, 979, 814, 410, 499]


def test_unshuffled_is_the_identity_order():
    s = EpochSampler(10, shuffle=False, rank=1, world_size=3)
    assert list(s) == [1, 4, 7]


class Billion(torch.utils.data.Dataset):
    """10**9 samples, none stored: each is computed from its index."""

    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([i, i % 251])


def test_a_billion_sample_epoch_starts_without_holding_its_order():
    n, batch = 10**9, 64
    process = psutil.Process()
    s = EpochSampler(n, seed=7)
    loader = build_loader(Billion(), s, LoaderSettings(batch))
    gc.collect()
    before = process.memory_info().rss
    batches = iter(loader)
    first = [next(batches) for _ in range(4)]
    grown = process.memory_info().rss - before
    # The list-based order held torch.randperm's int64 tensor (8 GB here) before its list.
    old = n * torch.empty(0, dtype=torch.int64).element_size()
    assert old >= 8 * 10**9
    assert grown < 200 * 2**20, f"resident memory grew by {grown / 2**20:.0f} MiB"
    expected = epoch_order(torch.arange(4 * batch), n, 7, 0)
    assert torch.equal(torch.cat([b[:, 0] for b in first]), expected)

    s.set_epoch(0, start=5 * 10**8)
    resumed = next(iter(loader))
    at = epoch_order(torch.arange(5 * 10**8, 5 * 10**8 + batch), n, 7, 0)
    assert int(resumed[0, 0]) == int(at[0])
    assert torch.equal(resumed[:, 0], at)


def test_worker_candidates_share_the_node_cpus_among_its_ranks(monkeypatch):
    monkeypatch.setattr(data_loading, "available_cpus", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert worker_candidates() == [0, 1, 2, 4]
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")
    assert worker_candidates() == [0, 1]  # at least one CPU each
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert worker_candidates() == [0, 1, 2, 4, 8]  # one rank: all 16 CPUs, capped at 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(ConfigError, match="LOCAL_WORLD_SIZE must be a positive integer"):
        worker_candidates()
