"""Your loader's workers drawing random numbers (random crops and flips): a StatefulDataLoader
resumes them bit for bit; a loader whose workers' random state cannot be kept says so in one
line as the run starts, and only then."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch.utils.data import Subset, TensorDataset

from augment_data import Counting, Cropped, NoisyStream, Plain
from helpers import tiny_gpt
from test_resume import SigtermAt, config, losses
from thrifty import Trainer
from thrifty.data import sources, worker_rng

WARNING = "loader workers whose random state cannot be saved"


def stateful_loader(
    workers: int, persistent: bool = False, generator: bool = False
) -> torch.utils.data.DataLoader:
    """Shuffled by the loader; `generator`: its own (it draws the next pass's order and worker
    seeds), else the global one."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(
        Cropped(),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        persistent_workers=persistent,
        generator=torch.Generator().manual_seed(1) if generator else None,
    )


def train(out, make_data, at=None, workers=0):
    torch.manual_seed(0)
    model = SigtermAt(tiny_gpt(dropout=0.1, n_layer=1), at)
    # 48 samples: 12 micro-batches a pass, so 16 steps cross into the second pass.
    return Trainer(model, make_data(), config(out, steps=16, workers=workers)).fit()


def cut_and_resumed(tmp_path, make_data, at, workers=0) -> tuple[dict, dict]:
    """Losses by step of an uninterrupted run and of one preempted at step `at` and resumed."""
    train(tmp_path / "whole", make_data, workers=workers)
    first = train(tmp_path / "cut", make_data, at=at, workers=workers)
    assert first.stop_reason == "preempted" and first.steps == at
    assert train(tmp_path / "cut", make_data, workers=workers).steps == 16
    return losses(tmp_path / "whole"), losses(tmp_path / "cut")


@pytest.mark.parametrize(
    ("workers", "persistent", "generator", "at"),
    [(2, False, False, 7), (2, True, True, 14), (0, False, False, 7), (0, False, True, 7)],
    ids=[
        "2-workers-mid-pass",
        "persistent-workers-second-pass",
        "no-workers",
        "no-workers-own-generator-into-the-next-pass",
    ],
)
def test_a_stateful_loader_augmenting_in_its_workers_resumes_bit_for_bit(
    tmp_path, caplog, workers, persistent, generator, at
):
    caplog.set_level("WARNING")
    whole, cut = cut_and_resumed(
        tmp_path, lambda: stateful_loader(workers, persistent, generator), at
    )
    assert len(whole) == 16
    assert cut == whole  # every step, after the resume too
    assert WARNING not in caplog.text


def test_without_the_workers_generators_saved_the_resumed_steps_differ(tmp_path, monkeypatch):
    # What the loader's own state restores (order, worker seeds) is not enough.
    monkeypatch.setattr(sources, "keep_worker_rng", lambda loader: None)
    whole, cut = cut_and_resumed(tmp_path, lambda: stateful_loader(2), at=7)
    assert [s for s in whole if cut[s] != whole[s]][0] == 8  # from the first resumed step on


def test_a_stream_augmenting_in_2_workers_resumes_bit_for_bit(tmp_path, caplog):
    caplog.set_level("WARNING")
    whole, cut = cut_and_resumed(tmp_path, NoisyStream, at=5, workers=2)
    assert cut == whole
    assert WARNING not in caplog.text and "restarts" not in caplog.text


def test_a_loader_that_cannot_keep_its_workers_random_state_says_so_at_start(tmp_path, caplog):
    caplog.set_level("WARNING")
    whole, cut = cut_and_resumed(tmp_path, lambda: Counting(Cropped(), workers=2), at=7)
    assert [s for s in whole if cut[s] != whole[s]][0] == 8  # the order is back, the draws not
    said = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert len(said) == 3  # once as each of the 3 runs starts
    assert said[0] == (
        "data: train_data (Counting over Cropped) draws random numbers in 2 loader workers "
        "whose random state cannot be saved (only torchdata's StatefulDataLoader saves what "
        "each worker holds): a resumed run restores the order, but its augmentation draws "
        "other numbers than an uninterrupted run would; pass the dataset itself as train_data "
        "(thrifty seeds each batch from its position), set num_workers=0, or seed the "
        "augmentation from the sample's index"
    )
    assert "\n" not in said[0]


@pytest.mark.parametrize("workers", [2, 0])
def test_the_same_loader_over_samples_that_draw_nothing_resumes_and_says_nothing(
    tmp_path, caplog, workers
):
    caplog.set_level("WARNING")
    whole, cut = cut_and_resumed(tmp_path, lambda: Counting(Plain(), workers), at=7)
    assert cut == whole
    assert WARNING not in caplog.text


def test_the_probe_finds_the_draws_and_leaves_the_training_generators_alone():
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    assert worker_rng.draws_random_numbers(Cropped())
    assert not worker_rng.draws_random_numbers(Plain())
    assert not worker_rng.draws_random_numbers(Subset(TensorDataset(torch.zeros(4, 2)), [0, 1]))
    assert torch.equal(torch.rand(3), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]
