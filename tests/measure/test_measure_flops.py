"""FLOPs and aten ops per step, counted from the real model; the analytic estimate; MFU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from thrifty.demo.model import GPT, GPTConfig
from thrifty.levers.activation_checkpointing import apply_activation_checkpointing
from thrifty.measure.flops import FlopCount, count_flops, mfu, transformer_flops_per_token


def _linear_stack(widths: list[int]) -> nn.Sequential:
    torch.manual_seed(0)
    pairs = zip(widths, widths[1:], strict=False)
    return nn.Sequential(*(nn.Linear(a, b, bias=False) for a, b in pairs))


def test_flops_of_a_linear_only_model_are_six_times_params_times_batch() -> None:
    model = _linear_stack([64, 128, 96, 32])
    batch = 8
    x = torch.randn(batch, 64, requires_grad=True)  # so the first layer's input gradient counts
    count = count_flops(lambda: model(x).sum().backward())
    n_params = sum(p.numel() for p in model.parameters())
    # forward 2·N·B (a multiply-add per weight per sample), backward twice that
    assert count.flops == pytest.approx(6 * n_params * batch, rel=0.02)


def test_op_counter_counts_the_aten_ops_of_forward_and_backward() -> None:
    x = torch.randn(2, 16)
    shallow = count_flops(lambda: _linear_stack([16] * 5)(x).sum().backward())
    deep = count_flops(lambda: _linear_stack([16] * 9)(x).sum().backward())
    assert shallow.ops > 4 * 2  # at least one op forward and one backward per layer
    # twice the layers, about twice the ops (the loss adds a few fixed ones)
    assert 1.6 < deep.ops / shallow.ops < 2.2
    assert deep.flops_per_op > 0


def test_counting_runs_the_closure_for_real_and_leaves_its_gradients() -> None:
    model = _linear_stack([8, 8])
    count_flops(lambda: model(torch.randn(2, 8)).sum().backward())
    assert all(p.grad is not None for p in model.parameters())


def test_transformer_estimate_matches_the_count_on_the_demo_gpt() -> None:
    torch.manual_seed(0)
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=64)
    model = GPT(cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, cfg.block_size))
    count = count_flops(lambda: model(ids, ids).backward())
    per_token = transformer_flops_per_token(
        model.num_params(non_embedding=True), cfg.n_layer, cfg.n_embd, cfg.block_size
    )
    # attention is counted too: CPU flash attention has a formula thrifty adds
    assert count.flops == pytest.approx(per_token * ids.numel(), rel=0.05)


def test_transformer_estimate_is_six_n_plus_twelve_l_h_t() -> None:
    assert transformer_flops_per_token(1e6, 4, 256, 128) == 6e6 + 12 * 4 * 256 * 128
    with pytest.raises(ValueError, match="positive"):
        transformer_flops_per_token(1e6, 0, 256, 128)


def test_activation_bytes_shrink_under_activation_checkpointing() -> None:
    def blocks() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(
            *(
                nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU())
                for _ in range(6)
            )
        )

    x = torch.randn(32, 64)
    plain, checkpointed = blocks(), blocks()
    apply_activation_checkpointing(checkpointed, "all")
    kept = count_flops(lambda: plain(x).sum().backward()).activation_bytes
    recomputed = count_flops(lambda: checkpointed(x).sum().backward()).activation_bytes
    assert kept > 0
    assert recomputed < 0.5 * kept


def test_mfu_is_achieved_flops_per_second_over_peak() -> None:
    assert mfu(4e12, 2.0, 4e12) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mfu(1.0, 0.0, 1.0)


def test_flop_count_reports_flops_per_op() -> None:
    assert FlopCount(flops=100.0, ops=4).flops_per_op == 25.0
    assert FlopCount(flops=100.0, ops=0).flops_per_op == 0.0
