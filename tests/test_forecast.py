"""The loss forecast: a saturating power law fitted to noisy curves whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest

from thrifty.errors import ConfigError, ThriftyError
from thrifty.measure.forecast import cannot_reach, fit_power_law, forecast, require_validation

END = 10_000  # the budget, in optimizer steps
STEPS = np.arange(500, END, 500, dtype=float)  # an evaluation every 500 steps

# (a, b, c, noise): a fast and a slow curve, the noise a realistic validation-loss jitter.
CURVES = [(2.0, 8.0, 0.5, 0.01), (1.0, 3.0, 0.3, 0.02)]


def curve(a: float, b: float, c: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return a + b * STEPS**-c + rng.normal(0.0, noise, STEPS.size)


def first_stop(losses: np.ndarray, target: float) -> int | None:
    """Evaluations seen when the run would stop, asking after every evaluation as the Trainer does."""
    for n in range(1, losses.size + 1):
        if cannot_reach(STEPS[:n], losses[:n], target, END):
            return n
    return None


def test_fit_recovers_the_parameters_of_a_clean_curve():
    law = fit_power_law(STEPS, 2.0 + 8.0 * STEPS**-0.5)
    assert law.a == pytest.approx(2.0, abs=0.01)
    assert law.b == pytest.approx(8.0, rel=0.1)
    assert law.c == pytest.approx(0.5, rel=0.05)


def test_the_band_holds_the_true_end_loss_of_noisy_curves():
    a, b, c, noise = CURVES[0]
    truth = a + b * END**-c
    held = 0
    for seed in range(20):
        result = forecast(STEPS[:8], curve(a, b, c, noise, seed)[:8], END, confidence=0.99)
        assert result.low <= result.value <= result.high
        held += result.low <= truth <= result.high
    assert held >= 19


@pytest.mark.parametrize("a, b, c, noise", CURVES)
def test_a_curve_that_will_reach_the_target_is_never_stopped(a, b, c, noise):
    # The hardest case: the target is exactly the loss the curve ends at.
    target = a + b * END**-c
    for seed in range(15):
        assert first_stop(curve(a, b, c, noise, seed), target) is None, f"seed {seed}"


@pytest.mark.parametrize("a, b, c, noise", CURVES)
def test_a_curve_that_clearly_cannot_reach_the_target_is_stopped_early(a, b, c, noise):
    target = 0.9 * a  # below the asymptote: no budget reaches it
    for seed in range(10):
        stopped = first_stop(curve(a, b, c, noise, seed), target)
        assert stopped is not None and stopped <= STEPS.size // 2, f"seed {seed}: {stopped}"
    decision = cannot_reach(STEPS[:10], curve(a, b, c, noise, 0)[:10], target, END)
    assert decision.stop and decision.reason.startswith("forecast ")
    assert f"stays above the target {target:g}" in decision.reason
    assert decision.forecast is not None and decision.forecast.low > target


def test_few_evaluations_give_no_decision_even_for_a_hopeless_target():
    losses = curve(*CURVES[0], seed=0)
    for n in range(1, 7):
        decision = cannot_reach(STEPS[:n], losses[:n], 0.5, END)
        assert not decision and "evaluations needed" in decision.reason
    assert cannot_reach(STEPS[:7], losses[:7], 0.5, END)


@pytest.mark.parametrize(
    "shape",
    ["flat", "constant", "zigzag", "plateau_then_drop", "rising", "tiny_noise_flat"],
)
def test_curves_with_no_trend_to_extrapolate_never_stop(shape):
    for seed in range(10):
        noise = np.random.default_rng(seed).normal(0.0, 0.05, STEPS.size)
        losses = {
            "flat": 3.0 + noise,
            "constant": np.full(STEPS.size, 3.0),
            "zigzag": 3.0 + 0.3 * (np.arange(STEPS.size) % 2) + noise / 5,
            # A loss stuck on a plateau may still break: it is not forecast to stay there.
            "plateau_then_drop": np.where(STEPS < 6000, 5.5, 3.0) + noise / 5,
            "rising": 3.0 + STEPS * 1e-4 + noise / 5,
            "tiny_noise_flat": 3.0 + noise / 1000,
        }[shape]
        assert first_stop(losses, 2.0) is None, f"seed {seed}"


def test_non_finite_or_negative_losses_give_no_decision():
    losses = curve(*CURVES[0], seed=0)[:12]
    assert "below 0" in cannot_reach(STEPS[:12], losses - 3.0, -5.0, END).reason
    losses[5] = np.nan
    assert "not finite" in cannot_reach(STEPS[:12], losses, 0.5, END).reason


def test_a_reached_target_is_never_a_reason_to_stop():
    losses = curve(*CURVES[0], seed=0)[:12]
    decision = cannot_reach(STEPS[:12], losses, float(losses.max()), END)
    assert not decision and "has been reached" in decision.reason


def test_the_same_evaluations_always_give_the_same_forecast():
    losses = curve(*CURVES[1], seed=3)[:9]
    assert forecast(STEPS[:9], losses, END) == forecast(STEPS[:9], losses, END)


def test_forecast_reports_value_band_and_parameters():
    result = forecast(STEPS[:10], curve(*CURVES[0], seed=0)[:10], END)
    data = result.to_dict()
    assert data["at_step"] == END and data["evaluations"] == 10
    assert set(data["params"]) == {"a", "b", "c"}
    assert result.describe().startswith(f"{result.value:.4g} at step {END} (95% band ")


def test_bad_curves_are_refused_with_one_line():
    with pytest.raises(ThriftyError, match="^forecast needs one loss per step: got 3 steps, 2"):
        forecast([1, 2, 3], [3.0, 2.0], 10)
    with pytest.raises(ThriftyError, match="^forecast needs steps greater than 0"):
        forecast([0, 1, 2, 3], [4.0, 3.0, 2.5, 2.4], 10)
    with pytest.raises(ThriftyError, match="^forecast needs at least 4 evaluations, got 3"):
        forecast([1, 2, 3], [3.0, 2.0, 1.9], 10)


def test_a_target_without_validation_data_names_the_fix():
    require_validation(None, has_validation=False)
    require_validation(2.5, has_validation=True)
    with pytest.raises(ConfigError, match=r"^early_stopping\.target = 2\.5 needs validation data"):
        require_validation(2.5, has_validation=False)
