"""The [guard] section, the non-finite step counter and the loss-spike detector."""

from __future__ import annotations

import io
import math
import random
import re

import pytest
import torch

from thrifty.config import GuardConfig, check_target, dump_toml
from thrifty.config.train import _build
from thrifty.errors import ConfigError
from thrifty.measure.guard import NonFiniteCounter, SpikeDetector


def noisy_losses(n: int, seed: int = 0, start: float = 4.0, noise: float = 0.05) -> list[float]:
    """A falling training loss with per-step noise, like a real run's."""
    rng = random.Random(seed)
    return [2.0 + (start - 2.0) * (1 + i) ** -0.3 + rng.gauss(0, noise) for i in range(n)]


# --------------------------------------------------------------------------------------------
# Configuration


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_skipped": -1}, "guard.max_skipped = -1 is invalid: must be a whole number, 0 or"),
        ({"spike_sigma": 1.0}, "guard.spike_sigma = 1.0 is invalid: must be a number, 2 or more"),
        ({"spike_sigma": math.nan}, "guard.spike_sigma = nan is invalid"),
        ({"spike_ratio": 0.9}, "guard.spike_ratio = 0.9 is invalid: must be greater than 1"),
        ({"spike_steps": 0}, "guard.spike_steps = 0 is invalid: must be a whole number, 1 or"),
        ({"spike_window": 5}, "guard.spike_window = 5 is invalid: must be a whole number, 10 or"),
        ({"max_rollbacks": -2}, "guard.max_rollbacks = -2 is invalid"),
        (
            {"rollback_lr_factor": 0.0},
            "guard.rollback_lr_factor = 0.0 is invalid: must be in (0, 1]",
        ),
        ({"rollback_lr_factor": 1.5}, "guard.rollback_lr_factor = 1.5 is invalid"),
        (
            {"forecast_min_evals": 3},
            "guard.forecast_min_evals = 3 is invalid: must be a whole number, 4",
        ),
        ({"forecast_confidence": 1.0}, "guard.forecast_confidence = 1.0 is invalid: must be in"),
        ({"forecast_margin": -0.1}, "guard.forecast_margin = -0.1 is invalid: must be in [0, 1)"),
    ],
)
def test_each_invalid_guard_value_names_field_value_and_what_is_allowed(kwargs, message):
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        GuardConfig(**kwargs)


def test_guard_section_builds_from_toml_data_like_the_other_sections():
    config = _build(GuardConfig, {"spike_sigma": 4, "max_rollbacks": 1}, "guard.")
    assert config.spike_sigma == 4.0 and config.max_rollbacks == 1
    assert config.SECTION == "guard"
    with pytest.raises(ConfigError, match=r"^guard\.spike_sigma = 'high' is invalid: expected"):
        _build(GuardConfig, {"spike_sigma": "high"}, "guard.")
    with pytest.raises(ConfigError, match=r"did you mean guard\.spike_sigma\?"):
        _build(GuardConfig, {"spike_sigm": 4}, "guard.")
    assert "[guard]" in dump_toml({"guard": {"spike_sigma": 4.0}})


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, "2.5", True])
def test_a_target_that_is_not_a_finite_loss_is_refused_with_one_line(value):
    with pytest.raises(ConfigError) as info:
        check_target(value)
    message = str(info.value)
    assert message.startswith(f"early_stopping.target = {value!r} is invalid: must be a finite")
    assert "\n" not in message


def test_a_target_may_be_any_finite_loss_or_none():
    assert check_target(None) is None
    assert check_target(2) == 2.0 and isinstance(check_target(2), float)
    assert check_target(0.0) == 0.0


# --------------------------------------------------------------------------------------------
# Non-finite steps


def test_non_finite_steps_are_skipped_until_too_many_in_a_row():
    counter = NonFiniteCounter(max_skipped=3)
    assert [counter.update(False) for _ in range(3)] == [False, False, False]
    assert counter.update(True) is False  # a good step resets the streak
    assert [counter.update(False) for _ in range(4)] == [False, False, False, True]
    assert counter.skipped == 7


def test_zero_skips_stops_at_the_first_non_finite_step():
    assert NonFiniteCounter(max_skipped=0).update(False) is True


# --------------------------------------------------------------------------------------------
# Spikes


def test_ordinary_noise_never_confirms_a_spike():
    for seed in range(20):
        detector = SpikeDetector()
        assert not any(detector.update(x) for x in noisy_losses(2000, seed))


def test_a_sustained_jump_is_confirmed_after_spike_steps_in_a_row():
    detector = SpikeDetector(steps=3, window=50)
    for x in noisy_losses(200):
        assert not detector.update(x)
    assert [detector.update(9.0) for _ in range(3)] == [False, False, True]
    assert detector.spikes == 1


def test_a_single_bad_batch_is_not_a_spike():
    detector = SpikeDetector(steps=3)
    losses = noisy_losses(300)
    losses[150] = losses[220] = 50.0
    assert not any(detector.update(x) for x in losses)


def test_a_long_spike_does_not_raise_its_own_baseline():
    # With the candidates in the statistics, each high loss would lift the mean and the
    # standard deviation until the spike looked normal and was never confirmed.
    detector = SpikeDetector(steps=20, window=50)
    for x in noisy_losses(100):
        detector.update(x)
    before = detector.threshold()
    confirmed = [detector.update(3.5) for _ in range(20)]
    assert confirmed[-1] and not any(confirmed[:-1])
    assert detector.threshold() == before


def test_no_decision_during_warm_up():
    detector = SpikeDetector(window=50)
    assert not any(detector.update(x) for x in [1.0] * 10 + [100.0] * 39)
    assert detector.threshold() is None


def test_ratio_replaces_sigma_when_set():
    detector = SpikeDetector(ratio=1.5, steps=2, window=10)
    for _ in range(10):
        detector.update(2.0)
    assert detector.threshold() == pytest.approx(3.0)
    assert not detector.update(2.9)
    assert [detector.update(3.5), detector.update(3.6)] == [False, True]


def test_a_perfectly_flat_loss_does_not_turn_rounding_into_spikes():
    detector = SpikeDetector(window=10, steps=2)
    for _ in range(10):
        detector.update(1.0)
    assert not any(detector.update(1.0 + 1e-6) for _ in range(5))


def test_non_finite_losses_are_left_to_the_skip_counter():
    detector = SpikeDetector(window=10, steps=1)
    for x in noisy_losses(10):
        detector.update(x)
    baseline = list(detector.baseline)
    assert not detector.update(math.nan) and not detector.update(math.inf)
    assert list(detector.baseline) == baseline


def test_spike_detector_state_survives_a_weights_only_checkpoint():
    detector = SpikeDetector(steps=3)
    for x in noisy_losses(80):
        detector.update(x)
    detector.update(9.0)  # one candidate pending
    buffer = io.BytesIO()
    torch.save(detector.state_dict(), buffer)
    buffer.seek(0)
    restored = SpikeDetector(steps=3)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert restored.state_dict() == detector.state_dict()
    assert [restored.update(9.0), restored.update(9.0)] == [False, True]


def test_from_config_uses_the_guard_section():
    detector = SpikeDetector.from_config(GuardConfig(spike_sigma=3.0, spike_window=20))
    assert (detector.sigma, detector.window, detector.steps) == (3.0, 20, 3)
