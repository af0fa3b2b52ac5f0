"""No recommendation goes against its own measurement: a gain must exceed the noise of the
figures it rests on, a worker must beat what taking a batch from it costs, and on a CPU bf16
and torch.compile need a measurement that shows them faster."""

from __future__ import annotations

import json
import math

import pytest

from thrifty.measure.diagnosis import Evidence, diagnose
from thrifty.measure.evidence import LeverMeasurement
from thrifty.measure.spread import WindowSpread


def _step(**overrides: object) -> Evidence:
    """A 40 ms step, 12 ms of it waiting for data fetched in the training process."""
    fields: dict[str, object] = {
        "step_seconds": 0.040,
        "steps": 40,
        "data_wait_seconds": 0.012,
        "forward_seconds": 0.009,
        "backward_seconds": 0.016,
        "optimizer_seconds": 0.003,
        "num_workers": 0,
        "cpus": 8,
        "micro_batch": 32,
        "device_type": "cpu",
        "precision": "fp32",
        "spread_seconds": {"data_wait": 0.0011, "step": 0.0008},
        "spread_windows": 10,
    }
    fields.update(overrides)
    return Evidence(**fields)  # type: ignore[arg-type]


def _workers(evidence: Evidence) -> list[str]:
    return [r.text for r in diagnose(evidence).recommendations if "num_workers" in r.text]


def test_a_workers_advice_quotes_the_wait_and_step_with_their_noise() -> None:
    diagnosis = diagnose(_step())
    advice = next(r for r in diagnosis.recommendations if "num_workers" in r.text)
    assert "data wait is 30% of step time (12.0 ± 1.1 ms of 40.0 ± 0.8 ms per step)" in advice.text
    report = json.loads(json.dumps(diagnosis.to_dict()))
    figures = report["recommendations"][0]["figures"]
    assert figures["data_wait_seconds"] == 0.012 and figures["data_wait_noise_seconds"] == 0.0011
    assert figures["step_seconds"] == 0.040 and figures["step_noise_seconds"] == 0.0008
    assert report["measured"]["spread_seconds"] == {"data_wait": 0.0011, "step": 0.0008}


def test_in_memory_data_measured_faster_without_workers_gets_no_workers_advice() -> None:
    """The case that made a step 3.4x slower: 0.1 ms of wait in a 1 ms step, and the loader
    measured at 1.1 ms a batch with one worker. Taking a batch from the worker costs more than
    the whole wait."""
    evidence = _step(
        step_seconds=0.0010,
        data_wait_seconds=0.0001,
        forward_seconds=0.0003,
        backward_seconds=0.0005,
        optimizer_seconds=0.0001,
        fetch_seconds_per_batch={0: 0.0001, 1: 0.0011, 2: 0.0009},
        spread_seconds={"data_wait": 0.00002, "step": 0.00005},
    )
    assert diagnose(evidence).breakdown["data_wait"] >= 0.10  # a share worth acting on
    assert _workers(evidence) == []


def test_a_short_wait_gets_no_workers_advice_without_a_fetch_measurement() -> None:
    """0.3 ms of wait in a 1.2 ms step with nothing measured of workers: what a batch from a
    worker costs the loop (a millisecond or two) exceeds the wait it would remove."""
    evidence = _step(
        step_seconds=0.0012,
        data_wait_seconds=0.0003,
        forward_seconds=0.0003,
        backward_seconds=0.0005,
        optimizer_seconds=0.0001,
        spread_seconds={"data_wait": 0.00002, "step": 0.00005},
    )
    assert _workers(evidence) == []


def test_a_wait_within_its_own_noise_gets_no_workers_advice() -> None:
    assert _workers(_step(spread_seconds={"data_wait": 0.013, "step": 0.0008})) == []
    assert _workers(_step(spread_seconds={"data_wait": 0.011, "step": 0.0008})) != []


def test_a_modelled_gain_smaller_than_the_step_noise_is_not_recommended() -> None:
    """One worker on 2 CPUs takes 12 ms + 2 ms of handoff a batch while the loop computes for
    28 ms: the step would go from 40 to 30 ms. Ten milliseconds is a gain only where the step
    moves by less."""
    quiet = _step(cpus=2)
    advice = next(r for r in diagnose(quiet).recommendations if "num_workers" in r.text)
    assert "from 0 to 1" in advice.text
    assert advice.figures["modelled_step_seconds"] == pytest.approx(0.030)
    noisy = _step(cpus=2, spread_seconds={"data_wait": 0.0011, "step": 0.011})
    assert _workers(noisy) == []


def test_copies_and_loop_overhead_within_the_noise_are_not_recommended() -> None:
    copies = {"host_to_device_seconds": 0.008, "data_wait_seconds": 0.004}
    spread = {"host_to_device": 0.0005, "step": 0.0008}
    recommended = diagnose(_step(**copies, spread_seconds=spread)).recommendations
    assert any("pin host memory" in r.text and "8.0 ± 0.5 ms" in r.text for r in recommended)
    noisy = {"host_to_device": 0.009, "step": 0.0008}
    recommended = diagnose(_step(**copies, spread_seconds=noisy)).recommendations
    assert not any("pin host memory" in r.text for r in recommended)
    loop = {"data_wait_seconds": 0.001, "other_seconds": 0.012}
    recommended = diagnose(_step(**loop, spread_seconds={"other": 0.001})).recommendations
    assert any("log_every" in r.text for r in recommended)
    recommended = diagnose(_step(**loop, spread_seconds={"other": 0.015})).recommendations
    assert not any("log_every" in r.text for r in recommended)


# --- bf16 and torch.compile on a CPU -----------------------------------------------------------


def _cpu_with_slow_ops(**overrides: object) -> Evidence:
    """A CPU run in fp32 with bf16 instructions, uncompiled, each op 10 µs: overhead-bound —
    the case a GPU would be told to compile and to use bf16."""
    return _step(
        data_wait_seconds=0.001,
        native_bf16=True,
        aten_ops_per_step=2500,
        mfu=0.02,
        **overrides,
    )


def _texts(evidence: Evidence) -> str:
    return " ".join(r.text for r in diagnose(evidence).recommendations)


def test_on_a_cpu_bf16_and_compile_are_not_recommended_unmeasured() -> None:
    diagnosis = diagnose(_cpu_with_slow_ops())
    assert diagnosis.bottleneck == "overhead_bound"
    texts = _texts(_cpu_with_slow_ops())
    assert "bf16" not in texts and "compile" not in texts
    facts = " ".join(diagnosis.evidence)
    assert "bf16 and torch.compile not recommended" in facts
    assert "thrifty tune CONFIG.toml --levers precision,compile" in facts
    # the same step on a GPU is told both (modelled from its peaks and op sizes)
    gpu = _texts(_cpu_with_slow_ops(device_type="cuda"))
    assert "precision.mode = bf16" in gpu and "compile.mode = default" in gpu


def test_on_a_cpu_a_lever_measured_faster_is_recommended_with_its_figures() -> None:
    measured = {
        "bf16": LeverMeasurement(
            without_seconds=0.020,
            with_seconds=0.012,
            without_noise=0.0005,
            with_noise=0.0004,
            source="thrifty tune",
        ),
        "compile": LeverMeasurement(
            without_seconds=0.020, with_seconds=0.031, source="thrifty tune"
        ),
    }
    diagnosis = diagnose(_cpu_with_slow_ops(lever_measurements=measured))
    bf16 = next(r for r in diagnosis.recommendations if "bf16" in r.text)
    assert bf16.text == (
        "measured faster: bf16 12.0 ± 0.4 ms per step against 20.0 ± 0.5 ms in fp32 "
        "(thrifty tune): precision.mode = bf16"
    )
    assert bf16.expected.startswith("1.67× faster per step (8.0 ms saved")
    assert bf16.figures == {
        "without_seconds": 0.020,
        "without_noise_seconds": 0.0005,
        "with_seconds": 0.012,
        "with_noise_seconds": 0.0004,
    }
    assert "compile" not in " ".join(r.text for r in diagnosis.recommendations)
    facts = " ".join(diagnosis.evidence)
    assert "compiled 31.0 ± 0.0 ms per step against 20.0 ± 0.0 ms eager (thrifty tune)" in facts
    assert "not faster by more than the noise" in facts


def test_a_lever_faster_by_less_than_its_noise_is_not_recommended() -> None:
    close = LeverMeasurement(
        without_seconds=0.020, with_seconds=0.019, without_noise=0.0008, with_noise=0.0006
    )
    assert not close.faster  # 1.0 ms saved, 1.4 ms of noise
    for device in ("cpu", "cuda"):  # a measurement outranks a GPU's modelled gain too
        evidence = _cpu_with_slow_ops(device_type=device, lever_measurements={"bf16": close})
        assert "bf16" not in _texts(evidence)
    clear = LeverMeasurement(without_seconds=0.020, with_seconds=0.017, without_noise=0.0008)
    assert "bf16" in _texts(_cpu_with_slow_ops(lever_measurements={"bf16": clear}))


def test_a_lever_measurement_for_an_unknown_lever_is_refused() -> None:
    lever = LeverMeasurement(without_seconds=0.02, with_seconds=0.01)
    with pytest.raises(ValueError, match="'fp8': give some of compile, bf16"):
        _step(lever_measurements={"fp8": lever})
    with pytest.raises(ValueError, match=r"with_seconds = 0: must be greater than 0"):
        LeverMeasurement(without_seconds=0.02, with_seconds=0)


# --- the noise itself --------------------------------------------------------------------------


def test_the_noise_is_the_spread_of_the_logging_intervals_means() -> None:
    """Three intervals of 4 steps with data waits of 10, 12 and 14 ms a step: a noise of
    2 ms (their standard deviation), whatever the steps did inside each interval."""
    spread = WindowSpread()
    totals = {"data_wait": 0.0, "checkpoint": 0.0}
    steps: list[float] = []
    for wait in (0.010, 0.012, 0.014):
        totals["data_wait"] += 4 * wait
        steps += [0.030 + wait, 0.050 + wait, 0.040 + wait, 0.040 + wait]
        spread.close_window(totals, steps)
    noise = spread.spread(steps)
    assert noise is not None and spread.windows == 3
    assert noise["data_wait"] == pytest.approx(0.002)
    assert noise["step"] == pytest.approx(0.002)  # the step moved with the wait only


def test_checkpoint_saves_are_not_noise_in_the_step() -> None:
    """A save of 40 ms every other interval makes those intervals' steps longer: that is the
    saves' period, and the step's noise leaves it out."""
    spread = WindowSpread()
    totals = {"checkpoint": 0.0}
    steps: list[float] = []
    for save in (0.0, 0.040, 0.0, 0.040):
        totals["checkpoint"] += save
        steps += [0.020, 0.020, 0.020, 0.020 + save]
        spread.close_window(totals, steps)
    noise = spread.spread(steps)
    assert noise is not None and noise["step"] == pytest.approx(0.0)
    assert noise["checkpoint"] > 0


def test_a_single_interval_takes_the_per_step_spread_of_the_step() -> None:
    spread = WindowSpread()
    steps = [0.010, 0.012, 0.014]
    spread.close_window({"data_wait": 0.009}, steps)
    noise = spread.spread(steps)
    assert noise == {"data_wait": pytest.approx(0.002), "step": pytest.approx(0.002)}
    assert WindowSpread().spread([0.010]) is None
    assert math.isclose(_step(spread_seconds=None).noise("data_wait"), 0.0)
