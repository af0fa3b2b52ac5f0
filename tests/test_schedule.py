from __future__ import annotations

import math

import pytest
import torch

from thrifty.levers.schedule import build_scheduler, lr_multiplier, scaled_lr


def test_linear_scaling_rule_scales_lr_with_the_effective_batch():
    assert scaled_lr(1e-3, effective_batch=512, reference_batch=256) == pytest.approx(2e-3)
    assert scaled_lr(1e-3, effective_batch=64, reference_batch=256) == pytest.approx(2.5e-4)
    assert scaled_lr(1e-3, effective_batch=512, reference_batch=None) == 1e-3


def test_warmup_rises_linearly_to_the_peak():
    f = [
        lr_multiplier(s, warmup_steps=4, decay="constant", total_steps=None, min_lr_ratio=0.1)
        for s in range(6)
    ]
    assert f == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_cosine_falls_from_peak_to_the_floor_after_warmup():
    kw = dict(warmup_steps=10, decay="cosine", total_steps=110, min_lr_ratio=0.1)
    assert lr_multiplier(10, **kw) == pytest.approx(1.0)
    assert lr_multiplier(60, **kw) == pytest.approx(0.1 + 0.9 * 0.5)  # halfway: cos(π/2) = 0
    assert lr_multiplier(35, **kw) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert lr_multiplier(110, **kw) == pytest.approx(0.1)
    assert lr_multiplier(500, **kw) == pytest.approx(0.1)  # stays at the floor


def test_scheduler_sets_the_optimizer_lr_step_by_step():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = build_scheduler(opt, warmup_steps=2, decay="cosine", total_steps=4, min_lr_ratio=0.0)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # warmup 0.5×, 1×; cosine over steps 2..4 from 1× to 0×
    assert seen == pytest.approx([0.25, 0.5, 0.5, 0.25, 0.0], abs=1e-12)
