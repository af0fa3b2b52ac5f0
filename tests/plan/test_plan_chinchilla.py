"""Chinchilla: compute-optimal parameters and tokens, always with C = 6*N*D."""

from __future__ import annotations

import pytest

from thrifty.errors import ConfigError
from thrifty.plan import budget_flops, chinchilla
from thrifty.plan.chinchilla import DEFAULT_FIT, FIT_NAMES

CHINCHILLA_FLOPS = 5.88e23  # 6 * 70e9 * 1.4e12


def test_chinchilla_with_epoch_coefficients_lands_near_70b_params_and_1_4t_tokens() -> None:
    a = chinchilla(CHINCHILLA_FLOPS, fit="epoch")
    assert a.params == pytest.approx(70e9, rel=0.1)
    assert a.tokens == pytest.approx(1.4e12, rel=0.1)


def test_the_twenty_tokens_rule_gives_chinchilla_exactly() -> None:
    a = chinchilla(CHINCHILLA_FLOPS, fit="tokens-per-param")
    assert a.params == pytest.approx(70e9)
    assert a.tokens == pytest.approx(1.4e12)


def test_the_papers_rounded_coefficients_give_a_far_smaller_model() -> None:
    a = chinchilla(CHINCHILLA_FLOPS, fit="hoffmann")
    assert 28e9 < a.params < 36e9


def test_the_default_fit_is_the_epoch_replication() -> None:
    assert DEFAULT_FIT == "epoch"
    assert chinchilla(CHINCHILLA_FLOPS).fit == "epoch"


@pytest.mark.parametrize("fit", FIT_NAMES)
@pytest.mark.parametrize("flops", [1e18, 3.1e21, 5.88e23, 1e26])
def test_every_allocation_spends_exactly_the_budget(fit: str, flops: float) -> None:
    a = chinchilla(flops, fit=fit)
    assert 6 * a.params * a.tokens == pytest.approx(flops, rel=1e-12)


def test_the_blog_formula_breaks_the_budget_identity() -> None:
    # N = 0.2536 C^0.4995, D = 1.7424 C^0.5005 (not in the paper): 6*N*D is ~2.65 C, not C.
    c = CHINCHILLA_FLOPS
    n, d = 0.2536 * c**0.4995, 1.7424 * c**0.5005
    assert n * d == pytest.approx(0.44 * c, rel=0.01)
    assert d / n < 8  # about 7 tokens per parameter, not ~20


def test_a_dollar_budget_is_converted_at_the_instance_price() -> None:
    flops, notes = budget_flops(dollars=32.77, instance="p4d.24xlarge@v7", mfu=0.5)
    assert flops == pytest.approx(8 * 3600 * 312e12 * 0.5)  # one instance-hour
    assert "p4d.24xlarge@v7" in notes[0]


def test_a_gpu_hour_budget_is_converted_at_peak_times_mfu() -> None:
    flops, _ = budget_flops(gpu_hours=1000, gpu="H100", dtype="bf16", mfu=0.4)
    assert flops == pytest.approx(1000 * 3600 * 989.5e12 * 0.4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"flops": 0}, r"compute budget \(FLOPs\) must be greater than 0, got 0"),
        ({"flops": float("inf")}, r"compute budget \(FLOPs\) must be a finite number, got inf"),
        ({"dollars": -5, "instance": "p4d.24xlarge"}, r"budget \(dollars\) must be greater than 0"),
        ({"gpu_hours": 100}, "needs a GPU"),
        ({"dollars": 100}, "needs an instance"),
    ],
)
def test_bad_budgets_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        budget_flops(mfu=0.35, **kwargs)


def test_an_unknown_fit_is_refused() -> None:
    with pytest.raises(ConfigError, match="fit must be one of epoch, hoffmann, tokens-per-param"):
        chinchilla(1e21, fit="kaplan")
