from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import cpu_memory
from helpers import tiny_gpt
from thrifty.demo import DEMO_CONFIG, build_model
from thrifty.levers.activation_checkpointing import (
    apply_activation_checkpointing,
    find_repeated_blocks,
    micro_that_fits,
    parse_policy,
    remove_activation_checkpointing,
)
from thrifty.levers.micro_batch import scaled_count
from thrifty.measure.flops import count_flops


def saved_bytes(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Bytes autograd keeps for backward during one forward, each storage counted once."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**batch)
    loss.backward()
    return sum(storages.values())


def activation_bytes(step: Callable[[], object]) -> int:
    """Bytes autograd keeps for backward during `step` (a forward and its backward), each
    storage once, the weights (held anyway) and views of them left out."""
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if not (base.is_leaf and base.requires_grad):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        step()
    return sum(storages.values())


def demo_batch(micro: int = 8) -> dict[str, torch.Tensor]:
    block = DEMO_CONFIG["task"]["model_args"]["block_size"]
    x = torch.randint(0, 256, (micro, block + 1), generator=torch.Generator().manual_seed(0))
    return {"input_ids": x[:, :-1], "targets": x[:, 1:]}


def test_finds_the_transformer_blocks_as_the_repeated_modules():
    model = tiny_gpt(n_layer=4)
    assert find_repeated_blocks(model) == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        ("every_other", ["blocks.0", "blocks.2"]),
        ("all", ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]),
        ("every_nth:3", ["blocks.0", "blocks.3"]),
        (["blocks.1", "blocks.3*"], ["blocks.1", "blocks.3"]),
        ("off", []),
    ],
)
def test_policy_selects_the_blocks_it_names(policy, expected):
    assert apply_activation_checkpointing(tiny_gpt(), policy) == expected


def test_state_dict_keys_are_unchanged_so_checkpoints_load_either_way():
    plain = tiny_gpt()
    wrapped = tiny_gpt()
    apply_activation_checkpointing(wrapped, "all")
    assert list(wrapped.state_dict()) == list(plain.state_dict())


def test_gradients_equal_the_unwrapped_models_with_dropout():
    batch = demo_batch(4)
    batch = {k: v[:, :32] for k, v in batch.items()}
    grads = {}
    for policy in ("off", "all"):
        model = tiny_gpt(dropout=0.2)
        apply_activation_checkpointing(model, policy)
        torch.manual_seed(123)  # same dropout masks in both forwards
        model(**batch).backward()
        grads[policy] = [p.grad.clone() for p in model.parameters()]
    for plain, recomputed in zip(grads["off"], grads["all"], strict=True):
        torch.testing.assert_close(recomputed, plain, rtol=0, atol=0)


def test_saved_activation_bytes_fall_on_the_demo_model():
    batch = demo_batch()
    sizes = {}
    for policy in ("off", "every_other", "all"):
        torch.manual_seed(0)
        model = build_model(**DEMO_CONFIG["task"]["model_args"])
        apply_activation_checkpointing(model, policy)
        sizes[policy] = saved_bytes(model, batch)
    every_other = sizes["every_other"] / sizes["off"]
    all_ = sizes["all"] / sizes["off"]
    print(
        f"saved for backward: off {sizes['off']:,} B, every_other {every_other:.1%}, all {all_:.1%}"
    )
    assert every_other <= 0.65
    assert all_ <= 0.35


def test_remove_restores_the_plain_forward():
    model = tiny_gpt()
    apply_activation_checkpointing(model, "all")
    remove_activation_checkpointing(model)
    assert all("forward" not in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("bad", ["sometimes", "every_nth:0", [], [""]])
def test_bad_policies_say_what_is_allowed(bad):
    with pytest.raises(ValueError, match="every_other|pattern"):
        parse_policy(bad)


def test_patterns_that_match_nothing_are_an_error():
    with pytest.raises(ValueError, match="matches no module"):
        apply_activation_checkpointing(tiny_gpt(), ["decoder.*"])


def test_model_without_repeated_blocks_is_an_error():
    with pytest.raises(ValueError, match="no repeated blocks"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2), "all")


def test_the_set_up_line_counts_its_blocks_in_words(caplog):
    import logging

    from thrifty.reporting.end_of_run import log_checkpointing

    caplog.set_level(logging.INFO, logger="thrifty")
    log_checkpointing("every_other", ["blocks.0"], {})
    log_checkpointing("all", ["blocks.0", "blocks.1"], {})
    lines = [r.getMessage() for r in caplog.records if "activation checkpointing" in r.getMessage()]
    assert lines == [
        "activation checkpointing: 1 block (blocks.0)",
        "activation checkpointing: 2 blocks (blocks.0, blocks.1)",
    ]


class _Basic(torch.nn.Module):
    """A ResNet basic block: two 3×3 convolutions, the first with the stage's stride."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(cin, cout, 3, stride, 1)
        self.b1 = torch.nn.BatchNorm2d(cout)
        self.c2 = torch.nn.Conv2d(cout, cout, 3, 1, 1)
        self.b2 = torch.nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


class _ResNet(torch.nn.Module):
    """Four stages of two blocks as torchvision's ResNet lays them out: the first stages hold
    the activation memory (large images, few channels), the last the parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, 1, 1)
        widths, cin = (8, 16, 32, 64), 8
        for i, width in enumerate(widths, 1):
            stage = torch.nn.Sequential(
                _Basic(cin, width, 1 if i == 1 else 2), _Basic(width, width, 1)
            )
            setattr(self, f"layer{i}", stage)
            cin = width
        self.fc = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for i in range(1, 5):
            x = getattr(self, f"layer{i}")(x)
        return self.fc(x.mean((2, 3)))


def _images(n: int = 16) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(0)
    return torch.utils.data.TensorDataset(
        torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
    )


def test_a_cnn_recomputes_the_blocks_that_hold_the_most_activation_memory(caplog, tmp_path):
    import logging

    from thrifty import TrainConfig, Trainer

    # The repeated blocks are every stage's, not only the last stage's (the most parameters).
    assert find_repeated_blocks(_ResNet()) == [f"layer{i}.{j}" for i in range(1, 5) for j in (0, 1)]
    caplog.set_level(logging.INFO, logger="thrifty")
    config = TrainConfig.from_dict(
        {
            "run": {"max_steps": 1, "device": "cpu", "out": str(tmp_path), "progress": "off"},
            "batch": {"micro": 8, "effective": 8},
            "precision": {"mode": "fp32"},
            "activation_checkpointing": {"policy": "every_other"},
            "data": {"num_workers": 0},
            "checkpoint": {"final": False},
        }
    )
    model = _ResNet()

    def loss_fn(logits: torch.Tensor, batch: list[torch.Tensor]) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(logits, batch[1])

    with Trainer(model, _images(), config, loss_fn=loss_fn) as trainer:
        chosen = trainer.checkpointed_blocks
        held = trainer.held
    # Half the blocks, the first two stages': they hold the most activation memory.
    assert chosen == ["layer1.0", "layer1.1", "layer2.0", "layer2.1"]
    assert held["layer1.0"] > held["layer4.0"] * 4

    # What the choice frees, measured with the lever on: more than the old choice, the block
    # with the most parameters (layer4.0), freed.
    x = _images(8).tensors[0]
    remove_activation_checkpointing(model)
    plain = activation_bytes(lambda: model(x).sum().backward())
    apply_activation_checkpointing(model, ["layer4.0"])
    by_parameters = plain - activation_bytes(lambda: model(x).sum().backward())
    remove_activation_checkpointing(model)
    apply_activation_checkpointing(model, "every_other", held)
    by_memory = plain - activation_bytes(lambda: model(x).sum().backward())
    assert by_memory > 4 * by_parameters > 0

    (line,) = [
        r.getMessage() for r in caplog.records if "activation checkpointing" in r.getMessage()
    ]
    assert line.startswith(
        "activation checkpointing: 4 blocks (layer1.0, layer1.1, layer2.0, layer2.1) recompute what holds "
    )
    assert "(measured; all " in line and "every_nth:3 " in line


def test_blocks_that_hold_the_same_keep_their_alternate_positions():
    model = tiny_gpt()
    held = dict.fromkeys(find_repeated_blocks(model), 1000)
    assert apply_activation_checkpointing(model, "every_other", held) == ["blocks.0", "blocks.2"]


# --------------------------------------------------------------------------------------------
# The micro-batch a heavier policy would fit, predicted from a run's measured memory


@pytest.mark.parametrize(
    "vocab",
    [256, 2048],  # the blocks save the most / the logits do (as GPT-2's 50,304 on an H200)
)
def test_the_micro_batch_a_heavier_policy_fits_is_what_a_real_step_fits(vocab):
    # A GPT trained in bf16 on the CPU, the step's peak measured as CUDA's allocator counts
    # it (`cpu_memory`): 8 samples fit without checkpointing, 16 do not. Autocast's bf16 weights, which a
    # Linear saves at any size, were counted as activations: the prediction for "all" was 52,
    # whose step peaked at 152% of the limit, and a count on one sample scaled to the size
    # found multiplied them by it. Backward's first recomputation holds a block's activations
    # again.
    torch.manual_seed(0)
    model = build_model(n_layer=4, n_head=2, n_embd=128, block_size=256, vocab_size=vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def loss(micro: int) -> torch.Tensor:
        x = torch.randint(0, vocab, (micro, 257), generator=torch.Generator().manual_seed(micro))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model(input_ids=x[:, :-1], targets=x[:, 1:])

    def peak(micro: int) -> int:
        with cpu_memory.PeakMemory() as meter:
            loss(micro).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return meter.peak

    peak(1)  # the optimizer's state, held by every later step
    need = {m: peak(m) for m in (4, 8, 16)}
    limit = (need[8] + need[16]) / 2
    tried = [{"micro": m, "fits": m <= 8, "peak_bytes": need[m]} for m in need]
    blocks = {name: model.get_submodule(name) for name in find_repeated_blocks(model)}
    count = count_flops(lambda: loss(8).backward(), blocks)
    optimizer.zero_grad(set_to_none=True)

    fits = micro_that_fits(
        tried, limit, count.block_bytes, count.input_bytes, 8, "off", count.head_bytes
    )
    assert fits["all"] > fits["every_other"] > 8
    # A run with batch.micro = "auto" counts one sample and scales the count to the size found.
    one = scaled_count(count_flops(lambda: loss(1).backward(), blocks), 8)
    optimizer.zero_grad(set_to_none=True)
    assert one.block_bytes == count.block_bytes
    assert one.head_bytes == pytest.approx(count.head_bytes, rel=1e-3)  # but a scalar or two
    for policy in ("every_other", "all"):
        apply_activation_checkpointing(model, policy, count.block_bytes)
        at = peak(fits[policy])
        remove_activation_checkpointing(model)
        print(f"vocab {vocab}, {policy}: predicted {fits[policy]}, its peak {at / limit:.1%}")
        assert 0.9 < at / limit <= 1.02, policy


def test_autocasts_copies_of_the_weights_are_not_activation_memory():
    # A Linear under bf16 autocast saves its bf16 weight: as large at 1 sample as at 64, so
    # counting it per sample once made checkpointing's room 128 times too large at 128.
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(256, 256) for _ in range(2)))
    blocks = {"0": model[0], "1": model[1]}

    def count(micro: int) -> Any:
        x = torch.randn(micro, 256)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return count_flops(lambda: model(x).float().sum().backward(), blocks)

    one, many = count(1), count(64)
    assert many.block_bytes["1"] == 64 * one.block_bytes["1"]  # the bf16 input alone
    assert one.block_bytes["1"] == 256 * 2
    assert many.activation_bytes == 64 * one.activation_bytes


def test_a_prediction_needs_two_measured_sizes_and_a_named_policy():
    held, inputs = {"b.0": 800, "b.1": 800}, {"b.0": 100, "b.1": 100}
    two = [
        {"micro": 1, "fits": True, "peak_bytes": 1000},
        {"micro": 2, "fits": True, "peak_bytes": 2000},
    ]
    # 1000 B a sample; at micro 2 a block frees 800 - 100 B: "all" 700 B a sample, every_other
    # (b.0) 350. "all" recomputes the last block first, after the head freed what it saved
    # (`head`): with a head of 700 B or more nothing is held again, 300 B a sample are kept.
    fits = micro_that_fits(two, 10_000, held, inputs, 2, "off", head=700)
    assert fits == {"all": 10_000 // 300, "every_other": 10_000 // 650}
    # With a head that saved nothing, b.1's 700 B are held again: "all" keeps 300 + 350.
    assert micro_that_fits(two, 10_000, held, inputs, 2, "off") == {
        "all": 10_000 // 650,
        "every_other": 10_000 // 650,
    }
    # Under every_other already, only "all" frees more: the other block's 350 B a sample.
    fits = micro_that_fits(two, 10_000, held, inputs, 2, "every_other", head=700)
    assert fits == {"all": 10_000 // 650}
    assert micro_that_fits(two[:1], 10_000, held, inputs, 2, "off") == {}  # no slope
    assert micro_that_fits(two, 10_000, held, inputs, 2, "['b.0']") == {}  # patterns: unknown
    cuda_none = [{**t, "peak_bytes": None} for t in two]  # a CPU run: no peaks measured
    assert micro_that_fits(cuda_none, 10_000, held, inputs, 2, "off") == {}


def test_a_gpu_runs_summary_carries_the_prediction_for_the_tune(monkeypatch):
    from types import SimpleNamespace

    from thrifty.data.geometry import BatchGeometry
    from thrifty.measure.flops import FlopCount
    from thrifty.measure.instruments import SetUp
    from thrifty.reporting.summary import checkpointing_fits

    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=11_000)
    )
    search = {
        "chosen": 2,
        "margin": 0.1,  # 9,900 B usable
        "tried": [
            {"micro": 1, "fits": True, "peak_bytes": 1000},
            {"micro": 2, "fits": True, "peak_bytes": 2000},
            {"micro": 4, "fits": False, "peak_bytes": 4100},
        ],
    }
    count = FlopCount(1.0, 1, 2000, {"b.0": 800, "b.1": 800}, {"b.0": 100, "b.1": 100}, 700)
    facts = SimpleNamespace(
        device=torch.device("cuda", 0),
        micro_search=search,
        flops=count,
        geometry=BatchGeometry(micro=2, accumulation=1, effective=2),
        set_up=SetUp(allow_tf32=True, compiled=False, checkpointing="off"),
    )
    assert checkpointing_fits(facts) == {"all": 9900 // 300, "every_other": 9900 // 650}
    assert (
        checkpointing_fits(SimpleNamespace(**{**vars(facts), "device": torch.device("cpu")})) == {}
    )
