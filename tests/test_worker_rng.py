"""Random augmentation in loader workers: each batch's draws depend on (seed, epoch, position)
only, so 0 or 2 workers, resumed or not, see the same batches and end with the same weights."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from helpers import AugmentedTokens, tiny_gpt
from test_resume import SigtermAt, config
from thrifty import Trainer
from thrifty.data.loading import LoaderSettings, build_loader
from thrifty.data.sampling import EpochSampler, SeededSamples, sample_seed


def epoch_batches(workers: int, epoch: int = 1, start: int = 0) -> list[torch.Tensor]:
    sampler = EpochSampler(40, seed=3)
    loader = build_loader(
        AugmentedTokens(n=40), sampler, LoaderSettings(4, workers, persistent_workers=False)
    )
    sampler.set_epoch(epoch, start)
    return [batch["input_ids"] for batch in loader]


def test_a_batch_draws_the_same_numbers_with_0_or_2_workers_and_from_any_start():
    alone = epoch_batches(workers=0)
    assert len(alone) == 10
    assert all(torch.equal(a, b) for a, b in zip(alone, epoch_batches(workers=2), strict=True))
    resumed = epoch_batches(workers=2, start=12)  # from the 4th batch, as a resumed run does
    assert all(torch.equal(a, b) for a, b in zip(alone[3:], resumed, strict=True))
    assert not torch.equal(alone[0], epoch_batches(workers=0, epoch=2)[0])  # fresh draws


def test_fetching_in_the_main_process_leaves_the_training_generators_untouched():
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    epoch_batches(workers=0)
    assert torch.equal(torch.rand(3), expected[0])  # dropout draws what it would have drawn
    assert (random.random(), np.random.rand()) == expected[1:]


def test_sample_seeds_differ_by_epoch_and_position_and_stay_fixed():
    seeds = {sample_seed(7, epoch, pos) for epoch in range(20) for pos in range(500)}
    assert len(seeds) == 20 * 500
    # Pinned: a change would change every augmentation a checkpointed run resumes with.
    assert sample_seed(42, 3, 1000) == 0x7D65DC5F620C3DA2
    assert sample_seed(0, 0, 0) != sample_seed(1, 0, 0)


class Batched(torch.utils.data.Dataset):
    """A dataset with batched reads: one random draw per call."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> float:
        raise AssertionError("fetched one by one")

    def __getitems__(self, indices: list[int]) -> list[float]:
        noise = torch.rand(())
        return [float(i) + float(noise) for i in indices]


def test_a_dataset_with_batched_reads_keeps_them_and_is_seeded_too():
    data = SeededSamples(Batched(), seed=5)
    keys = [(i, 2, 8 + i) for i in range(4)]  # (index, epoch, position)
    assert data.__getitems__(keys) == data.__getitems__(keys)
    assert data.__getitems__(keys) != data.__getitems__([(i, 3, p) for i, _, p in keys])


def train(out, at=None, workers=2):
    torch.manual_seed(0)
    model = SigtermAt(tiny_gpt(dropout=0.1), at)
    data = AugmentedTokens(n=40)  # 10 micro-batches per epoch, 12 steps cross an epoch
    result = Trainer(model, data, config(out, workers=workers)).fit()
    return model, result


@pytest.mark.parametrize("at", [5, 11])
def test_a_resumed_run_augmenting_in_2_workers_matches_the_uninterrupted_one_bit_for_bit(
    tmp_path, at
):
    reference, _ = train(tmp_path / "ref")
    _, first = train(tmp_path / "cut", at=at)
    assert first.stop_reason == "preempted" and first.steps < 12
    resumed, second = train(tmp_path / "cut")
    assert second.steps == 12
    alone, _ = train(tmp_path / "alone", workers=0)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name
        assert torch.equal(tensor, alone.state_dict()[name]), name  # 0 workers: the same run


def test_a_window_saves_and_restores_the_training_streams_once(monkeypatch):
    from thrifty.data import sampling

    calls = []
    real = np.random.get_state
    monkeypatch.setattr(np.random, "get_state", lambda *a: calls.append(1) or real(*a))
    sampler = EpochSampler(40, seed=3)
    loader = build_loader(AugmentedTokens(n=40), sampler, LoaderSettings(4, 0))
    sampler.set_epoch(1)  # as epoch_batches() reads
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    batches = iter(loader)
    with sampling.training_rng_kept():  # what the Trainer opens around each window
        window = [next(batches) for _ in range(3)]
    assert len(calls) == 1  # not once per batch
    assert torch.equal(torch.rand(3), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]
    # The same batches as fetched one by one, each keeping the streams itself.
    alone = epoch_batches(workers=0)
    assert all(torch.equal(b["input_ids"], a) for b, a in zip(window, alone[:3], strict=True))


def test_a_tensor_dataset_is_fetched_unseeded_with_the_same_batches():
    from torch.utils.data import Subset, TensorDataset

    class Drawing(TensorDataset):  # a subclass may draw numbers: it is seeded
        pass

    x = torch.arange(40.0).reshape(40, 1)
    plain = build_loader(TensorDataset(x), EpochSampler(40, seed=3), LoaderSettings(4, 0))
    subset = build_loader(
        Subset(TensorDataset(x), range(40)), EpochSampler(40, seed=3), LoaderSettings(4, 0)
    )
    seeded = build_loader(Drawing(x), EpochSampler(40, seed=3), LoaderSettings(4, 0))
    assert not isinstance(plain.dataset, SeededSamples)  # no seeding, no streams to keep
    assert not isinstance(subset.dataset, SeededSamples)
    assert isinstance(seeded.dataset, SeededSamples)
    got = [b[0] for b in plain]
    assert len(got) == 10
    assert all(torch.equal(a, b[0]) for a, b in zip(got, seeded, strict=True))
    assert all(torch.equal(a, b[0]) for a, b in zip(got, subset, strict=True))
