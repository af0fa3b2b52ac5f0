"""A Hugging Face user's scheduler, as they write it (transformers' warmup-then-cosine LambdaLR
on the optimizer), on transformers' own GPT-2 built from a config: thrifty steps it in place of
[schedule], and a run killed and resumed trains with the uninterrupted run's rates and losses,
bit for bit."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from torch import nn

from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.rundir.files import read_metrics

transformers = pytest.importorskip("transformers")

STEPS, WARMUP, LR = 10, 3, 1e-3
VOCAB, CONTEXT = 64, 16


class KilledGPT2(nn.Module):
    """transformers' GPT-2 (2 layers, 32 wide) that SIGTERMs this process on its `at`-th
    training forward, as a spot reclaim looks from inside the loop."""

    def __init__(self, at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_positions=CONTEXT, n_embd=32, n_layer=2, n_head=2
        )
        self.gpt = transformers.GPT2LMHeadModel(config)
        self.at, self.calls = at, 0

    def forward(self, input_ids, labels):
        if self.training:
            self.calls += 1
            if self.calls == self.at:
                os.kill(os.getpid(), signal.SIGTERM)
        return self.gpt(input_ids=input_ids, labels=labels)


class Tokens(torch.utils.data.Dataset):
    """Fixed random token sequences as dict batches, the form a tokenizer's output takes."""

    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, CONTEXT), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def hf_schedule(optimizer: torch.optim.Optimizer):
    return transformers.get_cosine_schedule_with_warmup(optimizer, WARMUP, STEPS)


def train(out, at: int | None = None):
    model = KilledGPT2(at)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    config = TrainConfig.from_dict(
        {
            "run": {
                "max_steps": STEPS,
                "device": "cpu",
                "out": str(out),
                "progress": "off",
                "log_every": 1,
                "deterministic": True,
            },
            "precision": {"mode": "fp32"},
            "batch": {"micro": 4, "effective": 8},
            "data": {"num_workers": 0},
            "checkpoint": {"every": "off"},
            "spot": {"provider": "none"},
        }
    )
    trainer = Trainer(model, Tokens(), config, optimizer=optimizer, scheduler=hf_schedule)
    return model, trainer.fit()


def column(out, key: str) -> dict[int, float]:
    return {r["step"]: r[key] for r in read_metrics(out / "metrics.jsonl") if key in r}


def test_a_gpt2_killed_and_resumed_follows_transformers_schedule_bit_for_bit(tmp_path):
    reference, _ = train(tmp_path / "ref")
    _, first = train(tmp_path / "cut", at=9)  # the 5th step's second micro-batch
    assert first.stop_reason == "preempted" and first.steps < STEPS
    resumed, second = train(tmp_path / "cut")
    assert second.steps == STEPS and second.stop_reason == "max_steps"

    # The rates are transformers' warmup and cosine, not thrifty's own schedule.
    expected = hf_schedule(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=LR))
    want = []
    for _ in range(STEPS):
        want.append(expected.get_last_lr()[0])
        expected.optimizer.step()
        expected.step()
    assert list(column(tmp_path / "ref", "lr").values()) == pytest.approx(want, rel=1e-12)
    assert want[0] == 0.0 and max(want) == pytest.approx(LR)

    assert column(tmp_path / "cut", "lr") == column(tmp_path / "ref", "lr")
    assert column(tmp_path / "cut", "loss") == column(tmp_path / "ref", "loss")
    for a, b in zip(reference.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)
