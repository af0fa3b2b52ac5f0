"""The hot path over an ordinary Dataset: only the global generators its fetches draw from are
seeded per batch and kept for the training once a window; one that draws from none costs the
step nothing; and a run killed and resumed matches the uninterrupted one bit for bit."""

from __future__ import annotations

import logging
import random

import numpy as np
import torch
from torch import nn

from test_resume import SigtermAt, config, losses
from thrifty import Trainer
from thrifty.data import sampling
from thrifty.data.loading import LoaderSettings, build_loader
from thrifty.data.sampling import EpochSampler, SeededSamples, probe_draws


class Regression(nn.Module):
    """A small MLP with dropout (so the training draws from torch's generator), returning its
    loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(x), y)


class Rows(torch.utils.data.Dataset):
    """An ordinary map-style dataset that draws no random numbers."""

    def __init__(self, n: int = 128) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "y": self.y[i]}


class Jittered(Rows):
    """Noise from Python's `random` only, on every sample."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(i)
        return {"x": item["x"] + random.gauss(0.0, 0.1), "y": item["y"]}


class OddOnes(Rows):
    """Noise from NumPy's global generator on odd indices only: none of the 64 samples the
    probe spreads over 128 (indices 0, 2, 4, ...) draws, but most batches do."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = super().__getitem__(i)
        if i % 2:
            item["x"] = item["x"] + float(np.random.normal(0.0, 0.1))
        return item


class Counted:
    """torch's default generator, counting the calls that save, restore or reseed it."""

    def __init__(self, real: torch.Generator, calls: dict[str, int]) -> None:
        self.real, self.calls = real, calls

    def __getattr__(self, name: str):
        method = getattr(self.real, name)
        if name not in ("get_state", "set_state", "manual_seed"):
            return method

        def counted(*args):
            self.calls[f"torch.{name}"] += 1
            return method(*args)

        return counted


def count_generator_calls(monkeypatch) -> dict[str, int]:
    """Count every save (get), restore (set) and reseed of the three global generators made
    through their public functions from here on."""
    calls: dict[str, int] = {}
    for module, prefix, names in (
        (random, "random", ("getstate", "setstate", "seed")),
        (np.random, "numpy", ("get_state", "set_state", "seed")),
    ):
        for name in names:
            calls[f"{prefix}.{name}"] = 0
            real = getattr(module, name)

            def counted(*args, _real=real, _key=f"{prefix}.{name}", **kw):
                calls[_key] += 1
                return _real(*args, **kw)

            monkeypatch.setattr(module, name, counted)
    for name in ("get_state", "set_state", "manual_seed"):
        calls[f"torch.{name}"] = 0
    monkeypatch.setattr(torch, "default_generator", Counted(torch.default_generator, calls))
    return calls


def train(out, data, *, steps=12, at=None, accumulate=2):
    torch.manual_seed(0)
    model = SigtermAt(Regression(), at)
    result = Trainer(model, data, config(out, steps=steps, accumulate=accumulate)).fit()
    return model, result


def calls_for(tmp_path, monkeypatch, data, steps):
    with monkeypatch.context() as patch:
        calls = count_generator_calls(patch)
        train(tmp_path / f"run{steps}", data, steps=steps)
    return calls


def grown(short: dict[str, int], long: dict[str, int]) -> dict[str, int]:
    return {k: long[k] - short[k] for k in short if long[k] != short[k]}


def checks(steps: int, accumulate: int = 2) -> int:
    """The sparse checks for draws the probe did not see, over a run of `steps` steps."""
    return steps * accumulate // sampling.CHECK_EVERY


def test_a_dataset_that_draws_nothing_is_fetched_without_seeding_or_keeping_any_generator(
    tmp_path, monkeypatch
):
    assert probe_draws(Rows()) == ()
    short = calls_for(tmp_path, monkeypatch, Rows(), steps=8)
    long = calls_for(tmp_path, monkeypatch, Rows(), steps=40)
    # 32 more steps (64 more micro-batches) and not one more reseed or restore: all a longer
    # run adds is one read of each generator by the sparse check (nothing to restore).
    assert checks(8) == 0 and checks(40) == 1
    assert grown(short, long) == {"torch.get_state": 2, "random.getstate": 2, "numpy.get_state": 2}


def test_a_dataset_drawing_from_random_only_seeds_and_keeps_random_only(tmp_path, monkeypatch):
    assert SeededSamples(Jittered(), seed=0).draws_from() == ("random",)
    short = calls_for(tmp_path, monkeypatch, Jittered(), steps=8)
    long = calls_for(tmp_path, monkeypatch, Jittered(), steps=40)
    # Per step: random saved and restored once (the window), reseeded once a micro-batch;
    # torch and NumPy only read by the one sparse check.
    assert grown(short, long) == {
        "random.getstate": 32,
        "random.setstate": 32,
        "random.seed": 64,
        "torch.get_state": 2,
        "numpy.get_state": 2,
    }


def test_a_run_drawing_from_random_killed_and_resumed_matches_the_uninterrupted_one(tmp_path):
    reference, _ = train(tmp_path / "ref", Jittered())
    _, first = train(tmp_path / "cut", Jittered(), at=9)  # mid-window, step 5
    assert first.stop_reason == "preempted" and first.steps < 12
    resumed, second = train(tmp_path / "cut", Jittered())
    assert second.steps == 12
    assert losses(tmp_path / "cut") == losses(tmp_path / "ref")
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name


def epoch(data, workers: int) -> list[torch.Tensor]:
    sampler = EpochSampler(len(data), seed=3)
    settings = LoaderSettings(8, workers, persistent_workers=False)
    return [batch["x"] for batch in build_loader(data, sampler, settings)]


def test_seeding_only_what_is_drawn_gives_the_batches_that_workers_seeding_everything_give():
    data = Jittered(n=64)
    alone = epoch(data, workers=0)
    assert all(torch.equal(a, b) for a, b in zip(alone, epoch(data, workers=2), strict=True))
    assert not torch.equal(alone[0], Rows(n=64).x[: len(alone[0])])  # it did draw


def test_a_draw_the_probe_missed_is_said_once_and_a_resume_with_the_same_workers_stays_exact(
    tmp_path, caplog
):
    assert probe_draws(OddOnes()) == ()
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        train(tmp_path / "ref", OddOnes(), steps=40)
    said = [r.getMessage() for r in caplog.records if "probed" in r.getMessage()]
    assert said == [
        "data: OddOnes drew from the numpy generator at a fetch, though none of the 64 samples "
        "probed at the start did: its draws there are not seeded per batch, so its batches "
        "depend on the worker count; a run resumed with the same data.num_workers stays "
        "bit-exact, one resumed with another does not. Set data.num_workers to a fixed count "
        "(with 1 or more, every batch is seeded in its worker)"
    ]
    # Killed at step 35, past the check at fetch 64 that said so.
    _, first = train(tmp_path / "cut", OddOnes(), steps=40, at=70)
    assert first.stop_reason == "preempted"
    train(tmp_path / "cut", OddOnes(), steps=40)
    assert losses(tmp_path / "cut") == losses(tmp_path / "ref")


def test_probing_leaves_every_generator_where_it_was():
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    assert probe_draws(Jittered()) == ("random",)
    assert probe_draws(OddOnes(n=9)) == ("numpy",)  # 9 samples: all probed, odd ones too
    assert torch.equal(torch.rand(3), expected[0])
    assert (random.random(), np.random.rand()) == expected[1:]


def test_the_probe_gives_the_same_answer_whatever_the_generators_held_before():
    class Sometimes(Rows):  # draws from torch only when `random` says so
        def __getitem__(self, i):
            if random.random() < 0.05:
                torch.rand(())
            return super().__getitem__(i)

    answers = set()
    for start in (0, 7, 123):  # a fresh run, a resumed one, ...: the probe seeds every fetch
        random.seed(start)
        torch.manual_seed(start)
        answers.add(probe_draws(Sometimes(), seed=5))
    assert answers == {("torch", "random")}
