"""The FLOP count at start costs no more memory than a step of two samples: it runs eager,
before activation checkpointing and compile, so at the full micro-batch its step peaked far
above the training's (115.6 GiB against a compiled loop's 55.7 for GPT-2 124M at 128 on an
H200; an 80 GB card could not have taken it). The count is made on one sample and two and
each figure follows the line through both, equal to a count at the full micro-batch.

Memory is measured as CUDA's allocator counts it (`cpu_memory.PeakMemory`)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import cpu_memory
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.data.geometry import BatchGeometry
from thrifty.demo import build_model
from thrifty.levers.accumulation import call_model
from thrifty.levers.activation_checkpointing import (
    apply_activation_checkpointing,
    find_repeated_blocks,
)
from thrifty.levers.precision import resolve_precision
from thrifty.measure.instruments import count_step_flops
from thrifty.measure.timing import measure_flops

BLOCK = 64


class Tokens(torch.utils.data.Dataset):
    """Random token windows as the demo GPT (`targets`) or a transformers model (`labels`)
    takes them."""

    def __init__(self, n: int, vocab: int, target: str) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, vocab, (n, BLOCK + 1), generator=g)
        self.target = target

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.target == "labels":  # the model shifts them itself
            return {"input_ids": self.x[i, :-1], "labels": self.x[i, :-1]}
        return {"input_ids": self.x[i, :-1], "targets": self.x[i, 1:]}


def demo_gpt() -> tuple[nn.Module, Tokens]:
    torch.manual_seed(0)
    model = build_model(n_layer=3, n_head=2, n_embd=64, block_size=BLOCK, vocab_size=512)
    return model, Tokens(128, 512, "targets")


def hf_gpt2() -> tuple[nn.Module, Tokens]:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_head=2, n_embd=64, n_positions=BLOCK, vocab_size=512
    )
    model = transformers.GPT2LMHeadModel(config)
    model.config.use_cache = False
    return model, Tokens(128, 512, "labels")


MODELS = {"demo": demo_gpt, "transformers": hf_gpt2}


def config(tmp_path: Any, micro: int, effective: int, steps: int = 2) -> TrainConfig:
    return TrainConfig.from_dict(
        {
            "run": {
                "max_steps": steps,
                "device": "cpu",
                "out": str(tmp_path / f"run{micro}"),
                "progress": "off",
            },
            "precision": {"mode": "fp32"},
            "batch": {"micro": micro, "effective": effective},
            "data": {"num_workers": 0, "shuffle": False},
            "checkpoint": {"every": "off"},
            "measure": {"system": False, "peak_tflops": 1.0},
        }
    )


def eager_count(model: nn.Module, data: Tokens, micro: int) -> Any:
    batch = torch.utils.data.default_collate([data[i] for i in range(micro)])

    return measure_flops(model, batch, call_model, blocks=find_repeated_blocks(model))


class Sizes:
    """The batch sizes a model's forward saw."""

    def __init__(self, model: nn.Module) -> None:
        self.seen: list[int] = []
        model.register_forward_pre_hook(self.hook, with_kwargs=True)

    def hook(self, _: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.seen.append(int(kwargs["input_ids"].shape[0]))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_count_at_a_fixed_micro_batch_is_made_on_two_samples_and_equals_a_full_one(
    name, tmp_path
):
    model, data = MODELS[name]()
    direct = eager_count(model, data, 8)
    sizes = Sizes(model)
    precision = resolve_precision("fp32", torch.device("cpu"))
    geometry = BatchGeometry.of(config(tmp_path, 8, 8).batch, 1)
    counted = count_step_flops(
        model, data, geometry, torch.device("cpu"), precision, None, None, breakdown=True
    )
    assert max(sizes.seen) <= 3  # no step at the full micro-batch
    assert counted.flops == pytest.approx(direct.flops, rel=1e-3)
    assert counted.ops == direct.ops
    # What activation checkpointing predicts its room from: the same within a scalar or two.
    assert counted.activation_bytes == pytest.approx(direct.activation_bytes, rel=1e-3)
    assert counted.head_bytes == pytest.approx(direct.head_bytes, rel=1e-3)
    assert counted.block_bytes.keys() == direct.block_bytes.keys()
    for block, held in direct.block_bytes.items():
        assert counted.block_bytes[block] == pytest.approx(held, rel=1e-3), block
    assert counted.input_bytes == pytest.approx(direct.input_bytes, rel=1e-3)


def set_up_peak(model: nn.Module, data: Tokens, cfg: TrainConfig) -> tuple[int, Trainer]:
    with cpu_memory.PeakMemory() as meter:
        trainer = Trainer(model, data, cfg)
    return meter.peak, trainer


def step_peak(model: nn.Module, data: Tokens, micro: int) -> int:
    """The peak of an eager forward and backward of `micro` samples, as the old count made."""
    with cpu_memory.PeakMemory() as meter:
        eager_count(model, data, micro)
    return meter.peak


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_set_up_peaks_as_a_step_of_three_samples_not_of_the_micro_batch(name, tmp_path):
    model, data = MODELS[name]()
    old = step_peak(model, data, 16)  # what the set-up's count peaked at before
    three = step_peak(model, data, 3)  # the larger of the two counted now
    peak, trainer = set_up_peak(model, data, config(tmp_path, 16, 16))
    trainer.close()
    print(
        f"{name}: set-up peak {peak / 2**20:.2f} MiB; eager step at 3 {three / 2**20:.2f}, "
        f"at 16 {old / 2**20:.2f} MiB"
    )
    assert peak <= 1.1 * three
    assert peak < 0.4 * old


@pytest.mark.parametrize("policy", ["off", "all"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_trainers_peak_is_the_plain_loops_at_the_same_micro_batch(name, policy, tmp_path):
    # With every block recomputed, a step holds far less than the eager count's step at the
    # full micro-batch (as a compiled one does on a GPU): that count set the Trainer's peak.
    micro, accumulation, steps = 16, 2, 3
    model, data = MODELS[name]()
    cfg = config(tmp_path, micro, micro * accumulation, steps)
    cfg = cfg.replace(**{"activation_checkpointing.policy": policy})

    def optimizer(m: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(m.parameters(), lr=1e-3, foreach=False)

    with cpu_memory.PeakMemory() as meter:
        trainer = Trainer(model, data, cfg, optimizer=optimizer(model))
        trainer.fit()
    trainer.close()
    thrifty = meter.peak

    model, _ = MODELS[name]()  # the same weights
    apply_activation_checkpointing(model, policy)
    plain_optimizer = optimizer(model)
    with cpu_memory.PeakMemory() as meter:
        for step in range(steps):
            for k in range(accumulation):
                first = (step * accumulation + k) * micro
                batch = torch.utils.data.default_collate(
                    [data[i] for i in range(first, first + micro)]
                )
                (call_model(model, batch) / accumulation).backward()
            plain_optimizer.step()
            plain_optimizer.zero_grad(set_to_none=True)
    plain = meter.peak
    print(
        f"{name}, checkpointing {policy}: Trainer peak {thrifty / 2**20:.2f} MiB, plain loop "
        f"{plain / 2**20:.2f} MiB ({thrifty / plain:.3f}x)"
    )
    assert thrifty <= 1.05 * plain


class Ragged(torch.utils.data.Dataset):
    """Token windows of different lengths, the longest of the first eight the last of them."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.lengths = [9, 12, 10, 16, 11, 20, 13, BLOCK]
        self.x = [torch.randint(0, 512, (n + 1,), generator=g) for n in self.lengths]

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.x[i]


def pad(samples: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Padded to the longest in the batch, the padding masked out of the loss."""
    longest = max(len(s) for s in samples)
    x = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros(len(samples), longest - 1, dtype=torch.bool)
    for row, sample in enumerate(samples):
        x[row, : len(sample)] = sample
        mask[row, : len(sample) - 1] = True
    return {"input_ids": x[:, :-1], "targets": x[:, 1:], "loss_mask": mask}


def test_samples_padded_to_the_micro_batchs_longest_are_counted_at_that_length(tmp_path):
    # The first three samples alone pad to 12 tokens; in the micro-batch, to 64.
    model, _ = demo_gpt()
    data = Ragged()
    direct = measure_flops(model, pad([data[i] for i in range(8)]), call_model)
    precision = resolve_precision("fp32", torch.device("cpu"))
    geometry = BatchGeometry.of(config(tmp_path, 8, 8).batch, 1)
    counted = count_step_flops(
        model, data, geometry, torch.device("cpu"), precision, None, pad, breakdown=True
    )
    assert counted.flops == pytest.approx(direct.flops, rel=1e-3)
