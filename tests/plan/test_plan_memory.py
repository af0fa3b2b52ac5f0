"""Memory per GPU: bytes per parameter, sharding, activations, fit and largest micro-batch."""

from __future__ import annotations

import pytest

from thrifty.errors import ConfigError
from thrifty.plan import ModelShape, bytes_per_param, memory
from thrifty.plan.memory import layer_activation_bytes

SHAPE = ModelShape(layers=32, hidden=4096, heads=32, vocab=32000, seq=4096)


def test_mixed_precision_adamw_needs_sixteen_bytes_per_parameter_in_the_zero_layout() -> None:
    # ZeRO paper / EleutherAI "Transformer Math 101": 2 + 2 + 4 (fp32 master) + 8 (AdamW)
    per = bytes_per_param("bf16", "adamw", "16-bit")
    assert (per.weights, per.gradients, per.master, per.optimizer) == (2, 2, 4, 8)
    assert per.total == 16


def test_autocast_keeps_fp32_parameters_and_gradients_and_no_master_copy() -> None:
    # torch.autocast leaves parameters (and so gradients) fp32; AdamW updates them directly
    per = bytes_per_param("bf16", "adamw")
    assert (per.weights, per.gradients, per.master, per.optimizer) == (4, 4, 0, 8)
    assert per.total == 16


# Issue 14, item 9: 7B on 8 GPUs with ZeRO-1. Autocast: 4 + 4 + 8/8 = 9 bytes/param = 63e9 B =
# 58.67 GiB; the 16-bit layout: 2 + 2 + (4 + 8)/8 = 5.5 bytes/param = 38.5e9 B = 35.86 GiB.
@pytest.mark.parametrize(("layout", "gib"), [("autocast", 58.6733), ("16-bit", 35.8559)])
def test_7b_zero1_on_8_gpus_by_layout(layout: str, gib: float) -> None:
    plan = memory(7e9, zero_stage=1, shards=8, layout=layout)
    assert plan.total / 2**30 == pytest.approx(gib, abs=1e-4)
    assert plan.layout == layout
    assert plan.layout_totals == pytest.approx({"autocast": 63e9, "16-bit": 38.5e9})


def test_the_memory_section_says_which_layout_its_figures_assume() -> None:
    notes = memory(7e9, zero_stage=1, shards=8).assumptions
    assert notes[0].startswith("autocast layout (fp32 parameters and gradients) for the figures")
    assert notes[1] == (
        "the 16-bit layout (ZeRO paper: 16-bit weights and gradients, fp32 master copy) "
        "would need 35.86 GiB per GPU"
    )


def test_fp32_training_has_one_layout() -> None:
    plan = memory(1e9, dtype="fp32", layout="16-bit")
    assert plan.layout == "fp32" and plan.layout_totals == {"fp32": 16e9}


@pytest.mark.parametrize(
    ("dtype", "optimizer", "total"),
    [
        ("fp32", "adamw", 16),
        ("fp32", "sgd-momentum", 12),
        ("fp32", "sgd", 8),
        ("bf16", "sgd-momentum", 12),
        ("fp16", "sgd", 8),
    ],
)
def test_bytes_per_parameter_by_precision_and_optimizer(
    dtype: str, optimizer: str, total: float
) -> None:
    assert bytes_per_param(dtype, optimizer).total == total


def test_zero_stages_shard_optimizer_then_gradients_then_weights() -> None:
    n, shards = 1e9, 8
    stage = {s: memory(n, zero_stage=s, shards=shards, layout="16-bit") for s in range(4)}
    assert stage[0].states == pytest.approx(16e9)
    assert stage[1].states == pytest.approx(2e9 + 2e9 + 12e9 / 8)
    assert stage[2].states == pytest.approx(2e9 + 2e9 / 8 + 12e9 / 8)
    assert stage[3].states == pytest.approx(16e9 / 8)


def test_zero_stages_under_autocast_shard_fp32_parameters_and_gradients() -> None:
    n, shards = 1e9, 8
    stage = {s: memory(n, zero_stage=s, shards=shards) for s in range(4)}
    assert stage[0].states == pytest.approx(16e9)
    assert stage[1].states == pytest.approx(4e9 + 4e9 + 8e9 / 8)
    assert stage[2].states == pytest.approx(4e9 + 4e9 / 8 + 8e9 / 8)
    assert stage[3].states == pytest.approx(16e9 / 8)


def test_activations_per_layer_follow_korthikanti_with_eager_attention() -> None:
    s, b, h, a = 4096, 2, 4096, 32
    got = layer_activation_bytes(SHAPE, b, attention="eager")
    assert got == pytest.approx(s * b * h * (34 + 5 * a * s / h))


def test_flash_attention_drops_the_score_matrices() -> None:
    assert layer_activation_bytes(SHAPE, 1, attention="flash") == pytest.approx(34 * 4096 * 4096)


def test_a_recomputed_layer_keeps_only_its_input() -> None:
    assert layer_activation_bytes(SHAPE, 1, recomputed=True) == pytest.approx(2 * 4096 * 4096)


def test_full_recompute_saves_activation_memory() -> None:
    stored = memory(SHAPE, micro_batch=4).activations
    recomputed = memory(SHAPE, micro_batch=4, recompute="full").activations
    assert recomputed < 0.1 * stored


def test_a_7b_model_with_adamw_does_not_fit_one_40gb_gpu_unsharded() -> None:
    plan = memory(7e9, gpu="A100")
    assert plan.total == pytest.approx(112e9)
    assert plan.fits is False


def test_the_largest_micro_batch_fits_and_one_more_does_not() -> None:
    shape = ModelShape(layers=24, hidden=2048, heads=16, vocab=50257, seq=2048)
    plan = memory(shape, gpu="A100-80GB", micro_batch=1)
    largest = plan.max_micro_batch
    assert largest and largest > 0
    assert memory(shape, gpu="A100-80GB", micro_batch=largest).fits is True
    assert memory(shape, gpu="A100-80GB", micro_batch=largest + 1).fits is False


def test_checkpointing_allows_a_larger_micro_batch() -> None:
    plan = memory(SHAPE, gpu="H100", zero_stage=3, shards=8)
    assert plan.max_micro_batch_full_recompute > plan.max_micro_batch


def test_the_attention_implementation_is_stated() -> None:
    assert any("flash/fused attention assumed" in n for n in memory(SHAPE).assumptions)
    assert any("eager attention assumed" in n for n in memory(SHAPE, attention="eager").assumptions)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"zero_stage": 4}, "zero_stage must be 0, 1, 2 or 3"),
        ({"micro_batch": 0}, "micro_batch must be a whole number > 0, got 0"),
        ({"optimizer": "adam"}, "optimizer must be one of adamw, sgd-momentum, sgd, got 'adam'"),
        ({"layout": "fp16"}, "layout must be one of autocast, 16-bit, got 'fp16'"),
    ],
)
def test_bad_memory_options_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        memory(1e9, **kwargs)
