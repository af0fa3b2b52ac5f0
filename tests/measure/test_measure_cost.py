"""The cost meter: dollars so far, per million tokens, projected to the end, and on-demand."""

from __future__ import annotations

from pathlib import Path

import pytest

from thrifty.errors import ConfigError, ThriftyError
from thrifty.measure.cost import CostConfig, CostMeter
from thrifty.measure.resume_loss import LostWork, lost_work, lost_work_before_resume
from thrifty.plan.catalog import load_catalog

CATALOG = """
[[gpu]]
name = "TestGPU"
peak_tflops = { bf16 = 100 }
peak_source = "test"
memory_gib = 80
memory_bandwidth_gbs = 2000
memory_source = "test"
interconnect = "NVLink"
interconnect_gbs_per_direction = 300

[[instance]]
name = "test.8x"
provider = "test"
region = "test-1"
gpu = "TestGPU"
gpu_count = 8
on_demand = 32.0
spot = 8.0
price_source = "test"
price_date = "2026-01-01"

[[instance]]
name = "test.1x-no-spot"
provider = "test"
region = "test-1"
gpu = "TestGPU"
gpu_count = 1
on_demand_per_gpu = 3.0
price_source = "test"
price_date = "2026-01-01"
"""


@pytest.fixture
def catalog_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("THRIFTY_CATALOG", raising=False)
    path = tmp_path / "prices.toml"
    path.write_text(CATALOG)
    return path


def test_two_gpus_at_four_dollars_for_half_an_hour_cost_four_dollars() -> None:
    meter = CostMeter.from_price(4.0, gpus=2)
    snapshot = meter.update(1800, tokens=2_000_000, samples=1000)
    assert snapshot.usd == pytest.approx(4.0)
    assert snapshot.usd_per_million_tokens == pytest.approx(2.0)
    assert snapshot.usd_per_thousand_samples == pytest.approx(4.0)
    summary = meter.summary()
    assert summary.gpu_hours == pytest.approx(1.0)
    assert summary.usd == pytest.approx(4.0)
    assert summary.on_demand_usd == pytest.approx(4.0)  # the price paid was on-demand


def test_progress_text_shows_dollars_per_million_tokens_or_per_thousand_samples() -> None:
    meter = CostMeter.from_price(3.6, gpus=1)
    assert meter.update(1000, tokens=1_000_000).describe() == "$1.00 · $1/M tokens"
    assert meter.update(1000, samples=500).describe() == "$1.00 · $2/k samples"
    assert meter.update(0).describe() == "$0.00"


def test_projection_continues_the_pace_so_far() -> None:
    meter = CostMeter.from_price(4.0, gpus=2)  # $8/hour
    meter.update(1800)
    projection = meter.project(0.25)  # a quarter done in 30 min: 90 min to go
    assert projection.remaining_seconds == pytest.approx(5400)
    assert projection.remaining_usd == pytest.approx(12.0)
    assert projection.total_usd == pytest.approx(16.0)
    assert meter.project(remaining_seconds=3600).remaining_usd == pytest.approx(8.0)
    with pytest.raises(ValueError):
        meter.project(0.0)


def test_spot_instance_summary_says_what_on_demand_would_have_cost(catalog_file: Path) -> None:
    config = CostConfig(instance="test.8x", pricing="spot", catalog=str(catalog_file))
    meter = CostMeter.from_config(config)
    meter.update(3600)
    summary = meter.summary()
    assert summary.usd == pytest.approx(8.0)
    assert summary.on_demand_usd == pytest.approx(32.0)
    assert summary.gpu_hours == pytest.approx(8.0)  # the whole instance is billed
    assert "on-demand would have cost $32.00 (75% saved)" in summary.describe()
    assert "test.8x" in summary.source and "2026-01-01" in summary.source


def test_more_gpus_than_an_instance_holds_bill_whole_instances(catalog_file: Path) -> None:
    meter = CostMeter.from_instance("test.8x", gpus=12, catalog=load_catalog(catalog_file))
    assert meter.usd_per_hour == pytest.approx(64.0)
    assert meter.gpus == 16


def test_unknown_instance_suggests_the_closest_names(catalog_file: Path) -> None:
    with pytest.raises(ThriftyError, match=r"cost.instance = 'test.8y' is invalid.*test\.8x"):
        CostMeter.from_instance("test.8y", catalog=load_catalog(catalog_file))


def test_spot_pricing_without_a_spot_price_is_an_error(catalog_file: Path) -> None:
    with pytest.raises(ConfigError, match=r"cost.pricing = 'spot' is invalid.*no spot price"):
        CostMeter.from_instance(
            "test.1x-no-spot", pricing="spot", catalog=load_catalog(catalog_file)
        )


def test_a_given_spot_price_compares_with_the_given_on_demand_price() -> None:
    meter = CostMeter.from_price(1.0, gpus=4, pricing="spot", on_demand_usd_per_gpu_hour=3.0)
    meter.update(3600)
    assert meter.summary().usd == pytest.approx(4.0)
    assert meter.summary().on_demand_usd == pytest.approx(12.0)
    unknown = CostMeter.from_price(1.0, pricing="spot")
    unknown.update(3600)
    assert unknown.summary().on_demand_usd is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"usd_per_gpu_hour": -2.0}, r"^cost.usd_per_gpu_hour = -2.0 is invalid: must be a price"),
        ({"usd_per_gpu_hour": 0}, r"^cost.usd_per_gpu_hour = 0 is invalid"),
        ({"usd_per_gpu_hour": 2.0, "gpus": 0}, r"^cost.gpus = 0 is invalid: must be a whole"),
        ({"usd_per_gpu_hour": 2.0, "gpus": 1.5}, r"^cost.gpus = 1.5 is invalid"),
        ({"usd_per_gpu_hour": 2.0, "pricing": "reserved"}, r"^cost.pricing = 'reserved' is inv"),
        ({"instance": "p5.48xlarge", "usd_per_gpu_hour": 2.0}, r"not both"),
        ({"instance": " "}, r"^cost.instance = ' ' is invalid"),
        ({"usd_per_gpu_hour": 2.0, "on_demand_usd_per_gpu_hour": 3.0}, r"only compares with"),
        ({"catalog": ""}, r"^cost.catalog = '' is invalid"),
    ],
)
def test_bad_cost_settings_are_one_line_errors_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        CostConfig(**fields)
    assert "\n" not in str(caught.value)


def test_no_price_means_no_meter() -> None:
    config = CostConfig()
    assert not config.enabled
    with pytest.raises(ConfigError, match="cost has no price"):
        CostMeter.from_config(config)


def test_negative_elapsed_time_is_refused() -> None:
    with pytest.raises(ValueError):
        CostMeter.from_price(1.0).update(-1)


def test_a_per_gpu_price_bills_one_gpu_per_process_unless_cost_gpus_says_otherwise() -> None:
    config = CostConfig(usd_per_gpu_hour=2.0)
    meter = CostMeter.from_config(config, world_size=64)
    assert meter.gpus == 64
    assert meter.usd_per_hour == pytest.approx(128.0)  # not one GPU's $2/hour
    assert CostMeter.from_config(config).gpus == 1  # one process
    pinned = CostMeter.from_config(CostConfig(usd_per_gpu_hour=2.0, gpus=8), world_size=64)
    assert pinned.usd_per_hour == pytest.approx(16.0)


def test_a_catalog_instance_bills_the_whole_instances_the_world_size_needs(
    catalog_file: Path,
) -> None:
    config = CostConfig(instance="test.8x", catalog=str(catalog_file))
    assert CostMeter.from_config(config, world_size=12).usd_per_hour == pytest.approx(64.0)
    assert CostMeter.from_config(config, world_size=1).usd_per_hour == pytest.approx(32.0)


def test_work_a_preemption_threw_away_is_billed_and_reported() -> None:
    meter = CostMeter.from_price(2.0, gpus=2)  # $4/hour
    meter.add_wasted(LostWork(seconds=1800, steps=50))
    snapshot = meter.update(3600, tokens=1_000_000)
    assert snapshot.usd == pytest.approx(6.0)  # the kept hour and the lost half hour
    assert snapshot.wasted_usd == pytest.approx(2.0)
    assert snapshot.elapsed_seconds == 3600  # training time kept in the run is unchanged
    summary = meter.summary()
    assert (summary.seconds, summary.gpu_hours) == (pytest.approx(5400), pytest.approx(3.0))
    assert (summary.wasted_usd, summary.redone_steps) == (pytest.approx(2.0), 50)
    assert "$2.00 of it paid for 50 steps a preemption threw away" in summary.describe()
    assert meter.project(remaining_seconds=3600).total_usd == pytest.approx(10.0)


def attempt(first: int, last: int, step_seconds: float, start: float) -> list[dict]:
    """metrics.jsonl records of steps first..last, with a cost snapshot every 5 steps."""
    records = []
    for step in range(first, last + 1):
        record = {"step": step, "loss": 1.0, "step_seconds": step_seconds}
        if step % 5 == 0:
            record["cost"] = {"elapsed_seconds": start + (step - first + 1) * step_seconds * 1.1}
        records.append(record)
    return records


def test_the_steps_past_the_checkpoint_are_the_lost_work() -> None:
    records = attempt(1, 10, 1.0, start=0.0)  # reached step 10, the checkpoint is at 6
    lost = lost_work(records, step=6, seconds=6.2)
    assert lost.steps == 4
    # 4 s of step time, but the snapshot at step 10 (11 s) says 4.8 s went by after step 6
    assert lost.seconds == pytest.approx(11.0 - 6.2)
    assert lost_work(records, step=6) == LostWork(4.0, 4)  # step times alone
    assert lost_work(records, step=10, seconds=11.0) == LostWork()


def test_lost_work_adds_up_over_several_resumes_through_metrics_jsonl(tmp_path: Path) -> None:
    from thrifty.rundir.files import MetricsLog, read_metrics, truncate_metrics

    path = tmp_path / "metrics.jsonl"

    def append(records: list[dict]) -> None:
        log = MetricsLog(path)
        log.write(records)
        log.close()

    append(attempt(1, 10, 1.0, start=0.0))
    first = lost_work_before_resume(path, 6)  # killed at 10, resumed from 6
    truncate_metrics(path, 6)
    append([{"step": 6, "event": "resumed", **first.to_record()}])
    append(attempt(7, 9, 2.0, start=6.0))
    second = lost_work_before_resume(path, 7)  # killed at 9, resumed from 7
    assert first == LostWork(4.0, 4)
    assert second == LostWork(4.0 + 4.0, 4 + 2)
    truncate_metrics(path, 7)
    append([{"step": 7, "event": "resumed", **second.to_record()}])
    assert max(r["step"] for r in read_metrics(path)) == 7
    assert lost_work_before_resume(path, 7) == second  # nothing new lost


def test_no_metrics_file_or_a_line_cut_short_by_the_kill_loses_nothing_known(
    tmp_path: Path,
) -> None:
    assert lost_work_before_resume(tmp_path / "missing.jsonl", 3) == LostWork()
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 4, "step_seconds": 0.5}\n{"step": 5, "step_sec')
    assert lost_work_before_resume(path, 3) == LostWork(0.5, 1)


def test_cost_gpus_unset_in_a_config_file_means_the_world_size(tmp_path: Path) -> None:
    from thrifty.config import load_config

    job = tmp_path / "job.toml"
    job.write_text(
        "[run]\nmax_steps = 1\n[cost]\nusd_per_gpu_hour = 2.0\n"
        '[task]\nmodel = "m:f"\ntrain_data = "m:d"\n'
    )
    assert load_config(job, []).cost.gpus is None
    with pytest.raises(ConfigError, match=r"^cost.gpus = 0 is invalid: .*unset: one per process"):
        load_config(job, [("cost.gpus", "0")])


def test_a_run_killed_past_its_checkpoint_bills_the_redone_steps_after_resuming(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from thrifty.rundir.files import read_metrics

    job = tmp_path / "job.toml"
    job.write_text(
        '[run]\nmax_steps = 400\nlog_every = 1\nprogress = "off"\n[batch]\nmicro = 4\n'
        '[data]\nnum_workers = 0\n[checkpoint]\nevery = 4\n[spot]\nprovider = "none"\n'
        "[cost]\nusd_per_gpu_hour = 3.6\n[measure]\nsystem = false\n"
        '[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "thrifty.demo:train_dataset"\n'
        "model_args = { n_layer = 2, n_head = 2, n_embd = 32, block_size = 32 }\n"
        "data_args = { block_size = 32, max_bytes = 100000 }\n"
    )
    out = tmp_path / "run"
    command = [sys.executable, "-m", "thrifty", "train", str(job), "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "THRIFTY_SPOT_PROVIDER": "none"}
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    metrics = out / "metrics.jsonl"

    def steps_logged() -> int:
        try:
            return max((r["step"] for r in read_metrics(metrics) if "loss" in r), default=0)
        except (FileNotFoundError, json.JSONDecodeError):
            return 0

    try:
        deadline = time.monotonic() + 120
        while steps_logged() < 9 or steps_logged() % 4 not in (1, 2):  # past a checkpoint
            assert proc.poll() is None and time.monotonic() < deadline, "run ended early"
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # no emergency checkpoint: the work is lost
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()  # type: ignore[union-attr]
    reached = steps_logged()
    saved = max(int(p.parent.name[5:]) for p in out.glob("checkpoints/step-*/manifest.json"))
    assert saved < reached
    # The same command resumes it, run here: the kill was the separate process's.
    from thrifty.cli import main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    code = main([*command[3:], "--steps", str(reached + 1)])
    assert code == 0, capsys.readouterr().err[-3000:]
    cost = json.loads((out / "summary.json").read_text())["cost"]
    assert cost["redone_steps"] == reached - saved
    assert 0 < cost["wasted_usd"] < cost["usd"]
    assert cost["wasted_usd"] == pytest.approx(cost["wasted_seconds"] * 3.6 / 3600)
    resumed = [r for r in read_metrics(metrics) if r.get("event") == "resumed"]
    assert resumed[-1]["redone_steps"] == reached - saved
