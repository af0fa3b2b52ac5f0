"""Job estimate: FLOPs, hours and cost from first principles."""

from __future__ import annotations

import pytest

from thrifty.errors import ConfigError
from thrifty.plan import ModelShape, estimate, training_flops
from thrifty.plan.estimate import DEFAULT_MFU, tokens_from_steps

GPT2 = ModelShape(layers=12, hidden=768, heads=12, vocab=50257, seq=1024)


def test_training_flops_are_six_times_params_times_tokens() -> None:
    flops = training_flops(7e9, 1.4e12)
    assert flops.total == 6 * 7e9 * 1.4e12 == pytest.approx(5.88e22)


def test_full_recompute_adds_one_forward_so_eight_n_d() -> None:
    assert training_flops(1e9, 1e9, recompute="full").total == pytest.approx(8e18)


def test_recomputing_every_other_layer_adds_half_a_forward() -> None:
    assert training_flops(1e9, 1e9, recompute="every-other").total == pytest.approx(7e18)


def test_gpt2_small_shape_has_124m_parameters_without_position_embeddings() -> None:
    assert GPT2.params == pytest.approx(123.65e6, rel=1e-3)


def test_a_shape_adds_the_attention_term_twelve_l_h_t_per_token() -> None:
    flops = training_flops(GPT2, 1e6)
    assert flops.dense == pytest.approx(6 * GPT2.params * 1e6)
    assert flops.attention == pytest.approx(12 * 12 * 768 * 1024 * 1e6)


def test_hours_are_flops_over_gpus_times_peak_times_mfu() -> None:
    est = estimate(7e9, 1.4e12, instance="p4d.24xlarge@v7", dtype="bf16", mfu=0.4)
    expected_s = 6 * 7e9 * 1.4e12 / (8 * 312e12 * 0.4)
    assert est.hours == pytest.approx(expected_s / 3600)
    assert est.gpu_hours == pytest.approx(8 * expected_s / 3600)


def test_cost_is_hours_times_the_catalog_price_for_each_pricing() -> None:
    est = estimate(7e9, 1.4e12, instance="p4d.24xlarge@v7", count=2)
    assert est.gpus == 16
    assert est.cost["on-demand"] == pytest.approx(est.hours * 2 * 32.77)
    # Spot: the median of the v7 snapshot's three us-east-1 zones (6.7915, 9.6107, 5.0933),
    # SkyPilot's AWS catalog v7 (see catalog.toml), not the midpoint of their range.
    assert est.cost["spot"] == pytest.approx(est.hours * 2 * 6.7915)


def test_the_default_mfu_is_stated_in_the_assumptions() -> None:
    est = estimate(1e9, 1e10, gpu="H100")
    assert est.mfu == DEFAULT_MFU
    assert "35.0% assumed" in est.assumptions[0]
    assert est.cost == {"on-demand": None, "spot": None}


def test_a_given_mfu_is_reported_as_given() -> None:
    assert "given" in estimate(1e9, 1e10, gpu="H100", mfu=0.5).assumptions[0]


def test_tokens_from_steps_multiply_steps_batch_and_sequence() -> None:
    assert tokens_from_steps(600_000, 480, 1024) == 600_000 * 480 * 1024


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": 0, "tokens": 1e9}, "params must be greater than 0, got 0"),
        ({"model": 1e9, "tokens": -5}, "tokens must be greater than 0, got -5"),
        ({"model": 1e9, "tokens": 1e9, "mfu": 1.5}, r"mfu must be in \(0, 1\], got 1.5"),
        ({"model": 1e9, "tokens": 1e9, "count": 0}, "count must be a whole number > 0, got 0"),
        ({"model": 1e9, "tokens": 1e9, "recompute": "half"}, "recompute must be one of"),
    ],
)
def test_bad_sizes_and_rates_are_refused_naming_the_value(kwargs: dict, match: str) -> None:
    model, tokens = kwargs.pop("model"), kwargs.pop("tokens")
    with pytest.raises(ConfigError, match=match):
        estimate(model, tokens, gpu="A100", **kwargs)


def test_a_shape_with_heads_not_dividing_hidden_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"model.hidden \(768\) must be divisible by model.heads \(10\)"
    ):
        ModelShape(layers=2, hidden=768, heads=10, vocab=100, seq=16)
