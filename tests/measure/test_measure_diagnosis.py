"""The diagnosis rules, on hand-made evidence: each bottleneck, the numbers quoted, the order."""

from __future__ import annotations

import json

import pytest

from thrifty.errors import ThriftyError
from thrifty.measure.diagnosis import BOTTLENECKS, Evidence, diagnose
from thrifty.measure.loader_workers import WORKER_HANDOFF_SECONDS

GIB = 2**30


def _compute_heavy(**overrides: object) -> Evidence:
    """A 100 ms step that is almost all compute, as a base to change one thing at a time."""
    fields: dict[str, object] = {
        "step_seconds": 0.100,
        "steps": 20,
        "data_wait_seconds": 0.002,
        "host_to_device_seconds": 0.001,
        "forward_seconds": 0.030,
        "backward_seconds": 0.060,
        "optimizer_seconds": 0.005,
        "device_type": "cuda",
        "device_name": "NVIDIA H100 80GB HBM3",
        "precision": "bf16",
        "native_bf16": True,
        "micro_batch": 16,
        "num_workers": 4,
        "cpus": 8,
        "aten_ops_per_step": 1200,
        "mfu": 0.45,
        "peak_source": "catalog",
    }
    fields.update(overrides)
    return Evidence(**fields)  # type: ignore[arg-type]


def test_copies_taking_a_third_of_the_step_are_host_to_device() -> None:
    evidence = _compute_heavy(
        host_to_device_seconds=0.035,
        forward_seconds=0.020,
        backward_seconds=0.035,
        optimizer_seconds=0.005,
    )
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "host_to_device"
    assert diagnosis.evidence[0].startswith("35% of step time is spent copying")
    first = diagnosis.recommendations[0]
    assert first.area == "data" and "pin_memory" in first.text and "35%" in first.expected


def test_low_mfu_with_ops_that_are_not_tiny_is_memory_bound() -> None:
    evidence = _compute_heavy(mfu=0.08, aten_ops_per_step=2000)  # 45 µs per op
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "memory_bound"
    assert "45.0 µs" in diagnosis.evidence[0]
    assert any(r.area == "memory" and "compile" in r.text for r in diagnosis.recommendations)


def test_high_mfu_is_compute_bound() -> None:
    diagnosis = diagnose(_compute_heavy(mfu=0.45))
    assert diagnosis.bottleneck == "compute_bound"
    assert "47% of peak" in diagnosis.evidence[0]  # judged on compute time: 0.45 × 100 / 95


def test_a_cpu_run_slowed_by_neighbours_is_judged_on_the_time_it_held_the_cpu() -> None:
    """The same compute-bound job on a shared machine: another process held the core 3/4 of
    the time, so every compute phase took 4x its wall time and the MFU over the step fell to
    a quarter. The CPU time the run held is what it was given; judged on it, it still is
    compute-bound (against a peak timed the same way)."""
    slowed = {"forward_seconds": 0.120, "backward_seconds": 0.240, "optimizer_seconds": 0.020}
    cpu = {
        "step_seconds": 0.383,
        "device_type": "cpu",
        "device_name": None,
        "precision": "fp32",
        "native_bf16": False,
        "mfu": 0.45 * 0.100 / 0.383,
        **slowed,
    }
    wall_only = diagnose(_compute_heavy(**cpu))
    assert wall_only.bottleneck == "memory_bound"  # what a neighbour's load used to do
    held = {"forward": 0.030, "backward": 0.060, "optimizer": 0.005}
    diagnosis = diagnose(_compute_heavy(**cpu, busy_seconds=held))
    assert diagnosis.bottleneck == "compute_bound"
    assert "47% of peak" in diagnosis.evidence[0]
    assert diagnosis.measured.seconds_per_op == pytest.approx(0.090 / 1200)


def test_tiny_ops_with_low_mfu_are_overhead_bound() -> None:
    diagnosis = diagnose(_compute_heavy(mfu=0.02, aten_ops_per_step=9000))  # 10 µs per op
    assert diagnosis.bottleneck == "overhead_bound"
    texts = " ".join(r.text for r in diagnosis.recommendations)
    assert "compile" in texts and "micro-batch 16 →" in texts


def test_an_idle_gpu_with_nothing_waiting_is_overhead_bound() -> None:
    evidence = _compute_heavy(mfu=0.10, aten_ops_per_step=500, gpu_util_mean=35.0)
    assert diagnose(evidence).bottleneck == "overhead_bound"


def test_time_outside_every_phase_is_loop_overhead() -> None:
    evidence = _compute_heavy(forward_seconds=0.015, backward_seconds=0.030)  # 52 ms unaccounted
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "overhead_bound"
    assert any("log_every" in r.text for r in diagnosis.recommendations)


def test_without_mfu_compute_and_memory_bound_are_not_told_apart() -> None:
    diagnosis = diagnose(_compute_heavy(mfu=None))
    assert diagnosis.bottleneck == "compute_bound"
    assert "cannot be told apart" in diagnosis.evidence[0]


def test_the_largest_wait_wins_when_several_pass_their_threshold() -> None:
    evidence = _compute_heavy(
        data_wait_seconds=0.040,
        host_to_device_seconds=0.030,
        forward_seconds=0.010,
        backward_seconds=0.015,
        optimizer_seconds=0.005,
    )
    assert diagnose(evidence).bottleneck == "data_loading"


def test_workers_are_suggested_from_measured_fetch_time_and_capped_at_the_cpus() -> None:
    # 41% of a 100 ms step waiting with 2 workers; one process takes 300 ms per batch and the
    # step computes for 59 ms, so ceil(300 / 59) = 6 workers keep up (8 CPUs, 7 usable).
    evidence = _compute_heavy(
        data_wait_seconds=0.041,
        forward_seconds=0.018,
        backward_seconds=0.036,
        optimizer_seconds=0.002,
        num_workers=2,
        fetch_seconds_per_batch={0: 0.300, 2: 0.150},
    )
    diagnosis = diagnose(evidence)
    assert diagnosis.bottleneck == "data_loading"
    data = diagnosis.recommendations[0]
    assert data.area == "data"
    assert data.text.startswith(
        "data wait is 41% of step time (41.0 ms of 100.0 ms per step): raise data.num_workers "
        "from 2 to 6"
    )
    assert "measured fetch 300.0 ms/batch" in data.text
    assert "1.7× faster" in data.expected  # 100 ms → 59 ms
    # A process fetching 300 ms a batch in a 359 ms step: 6 workers would keep up with 59 ms
    # of compute (and a few ms to take each batch from a worker), 3 of 4 CPUs are all there is.
    capped = diagnose(
        _compute_heavy(
            step_seconds=0.359,
            data_wait_seconds=0.300,
            num_workers=0,
            cpus=4,
            fetch_seconds_per_batch={0: 0.300},
        )
    ).recommendations[0]
    assert "from 0 to 3" in capped.text and "capped at 3 of 4 CPUs" in capped.text
    handoff = WORKER_HANDOFF_SECONDS  # what taking a batch from a worker costs the loop
    assert capped.figures["modelled_step_seconds"] == pytest.approx((0.300 + handoff) / 3)


def test_workers_already_at_the_cpu_limit_make_items_cheaper_instead() -> None:
    evidence = _compute_heavy(
        data_wait_seconds=0.050,
        forward_seconds=0.015,
        backward_seconds=0.030,
        num_workers=3,
        cpus=4,
    )
    text = diagnose(evidence).recommendations[0].text
    assert "already at the CPU limit" in text and "cache decoded samples" in text


def test_recommendations_go_data_then_memory_then_compute_with_numbers() -> None:
    evidence = _compute_heavy(
        data_wait_seconds=0.015,
        precision="fp32",
        tf32=True,
        bf16_speedup=2.0,
        num_workers=1,
        fetch_seconds_per_batch={0: 0.120},
        peak_memory_bytes=76 * GIB,
        device_memory_bytes=80 * GIB,
        activation_bytes=40 * GIB,
    )
    recommendations = diagnose(evidence).recommendations
    areas = [r.area for r in recommendations]
    assert areas == sorted(areas, key=["data", "memory", "compute"].index)
    assert areas[:2] == ["data", "memory"] and "compute" in areas
    memory = next(r for r in recommendations if r.area == "memory")
    # frees 45% of 40 GiB; 36 GiB fixed + 1.375 GiB per sample fits 23 in 85% of 80 GiB
    assert "activation checkpointing every_other frees ~45% of activation memory" in memory.text
    assert "micro-batch 16 → 23 fits" in memory.text
    precision = next(r for r in recommendations if "bf16" in r.text)
    assert precision.area == "compute"
    assert "tf32 matmuls on hardware with native bf16" in precision.text
    assert precision.expected.startswith("about 2× on the matmuls")


def test_checkpointing_with_memory_to_spare_is_worth_turning_off() -> None:
    evidence = _compute_heavy(
        activation_checkpointing="every_other",
        peak_memory_bytes=20 * GIB,
        device_memory_bytes=80 * GIB,
    )
    recommendation = next(r for r in diagnose(evidence).recommendations if r.area == "memory")
    assert "turn it off" in recommendation.text and "15%" in recommendation.expected


def test_checkpoint_saves_that_stall_the_step_are_reported() -> None:
    evidence = _compute_heavy(
        forward_seconds=0.025, backward_seconds=0.055, checkpoint_seconds=0.010
    )
    recommendation = diagnose(evidence).recommendations[0]
    assert recommendation.area == "data" and "checkpoint saves stall 10%" in recommendation.text


def test_report_is_json_with_the_required_keys_and_a_breakdown_summing_to_one() -> None:
    evidence = _compute_heavy(
        fetch_seconds_per_batch={0: 0.1, 4: 0.03}, gpu_util_mean=80.0, gpu_util_std=30.0
    )
    report = json.loads(json.dumps(diagnose(evidence).to_dict()))
    assert {"bottleneck", "evidence", "recommendations", "breakdown", "mfu"} <= set(report)
    assert report["bottleneck"] in BOTTLENECKS
    assert sum(report["breakdown"].values()) == pytest.approx(1.0)
    assert report["mfu"] == pytest.approx(0.45)
    assert report["measured"]["fetch_seconds_per_batch"] == {"0": 0.1, "4": 0.03}
    assert any("swings" in fact for fact in report["evidence"])


def test_phases_longer_than_the_step_still_give_fractions_summing_to_one() -> None:
    evidence = Evidence(step_seconds=0.010, forward_seconds=0.006, backward_seconds=0.006)
    breakdown = evidence.breakdown()
    assert sum(breakdown.values()) == pytest.approx(1.0)
    assert breakdown["other"] == pytest.approx(0.0)


def test_a_profile_of_zero_steps_is_a_one_line_error() -> None:
    with pytest.raises(ThriftyError, match=r"profile of 0 step\(s\).*at least 1 step") as caught:
        Evidence(step_seconds=0.1, steps=0)
    assert "\n" not in str(caught.value)
    with pytest.raises(ThriftyError, match="cannot be diagnosed"):
        Evidence(step_seconds=0.0)


def test_a_change_below_a_millisecond_shows_in_its_figures():
    from thrifty.measure.evidence import ms

    assert (ms(0.00044), ms(0.00036)) == ("0.44 ms", "0.36 ms")  # not "0.4 ms → ~0.4 ms"
    assert (ms(0.0123), ms(12.5)) == ("12.3 ms", "12.5 s")


def test_a_busy_machine_is_named_in_one_line_and_a_quiet_one_is_not() -> None:
    from thrifty.measure.diagnosis import busy_machine

    assert busy_machine(_compute_heavy(load_per_cpu=1.0, steal_percent=0.5, step_swing=1.3)) is None
    busy = diagnose(_compute_heavy(load_per_cpu=2.4, steal_percent=12.0, step_swing=30.0))
    assert busy.busy == (
        "the machine was busy (a load average of 2.4 threads per CPU, 12% of the CPU time "
        "stolen by the hypervisor, steps 30x slower in one logging interval than in another): "
        "other work took the run's CPU time, so these figures and this diagnosis measure the "
        "machine as much as the run; measure again on a machine of its own"
    )
    assert busy.evidence[1] == busy.busy  # right after the bottleneck's reason
    assert json.loads(json.dumps(busy.to_dict()))["busy"] == busy.busy
    # Each sign alone is enough; a swing alone is not blamed on other work.
    swung = busy_machine(_compute_heavy(step_swing=3.0)) or ""
    assert swung.startswith(
        "the throughput swung (steps 3x slower in one logging interval than in another): "
    )
    assert "1.6 threads per CPU" in (busy_machine(_compute_heavy(load_per_cpu=1.6)) or "")
    assert "stolen" in (busy_machine(_compute_heavy(steal_percent=5.0)) or "")


def test_the_swing_is_the_slowest_intervals_mean_step_over_the_fastests() -> None:
    from thrifty.measure.spread import WindowSpread

    spread = WindowSpread()
    times: list[float] = []
    assert spread.swing is None
    for step_seconds in (0.01, 0.01, 0.30, 0.02):  # one interval of 2 steps each
        times += [step_seconds, step_seconds]
        spread.close_window({}, times)
    assert spread.swing == pytest.approx(30.0)


def test_a_run_whose_throughput_swings_says_so_in_its_diagnosis_and_at_its_end(
    tmp_path, capsys
) -> None:
    """A real run whose loader stalls on a quarter of the data: the steps that draw those rows
    are many times slower, and the run says so in one line where its diagnosis is shown and
    at its end, as it would on a machine that other work shares. (System sampling is off: the
    load average of the machine the test runs on is not the test's to set.)"""
    from thrifty.cli import main

    config = tmp_path / "job.toml"
    config.write_text(
        '[run]\nmax_steps = 12\nlog_every = 2\nprogress = "off"\ndevice = "cpu"\n'
        '[precision]\nmode = "fp32"\n[batch]\nmicro = 16\neffective = 16\n'
        '[data]\nnum_workers = 0\nshuffle = false\n[checkpoint]\nevery = "off"\nfinal = false\n'
        '[spot]\nprovider = "none"\n[measure]\nsystem = false\n[task]\nmodel = "dist_task:model"\n'
        'train_data = "dist_task:stalling_data"\noptimizer = "dist_task:sgd"\n'
        'loss_fn = "dist_task:cross_entropy"\n'
    )
    assert main(["train", str(config), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "the throughput swung" in line]
    assert len(lines) == 2, out  # in the diagnosis's evidence, and the warning at the end
    assert lines[0].startswith("  • the throughput swung (steps ")
    assert lines[1].startswith("thrifty: warning: the throughput swung (steps ")
    swing = int(lines[1].split("(steps ")[1].split("x slower")[0])
    assert swing >= 10  # 16 rows × 5 ms against a step of a millisecond or two
    diagnosis = json.loads((tmp_path / "run" / "diagnosis.json").read_text())
    assert diagnosis["busy"] == lines[1].removeprefix("thrifty: warning: ")
