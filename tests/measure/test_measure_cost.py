"""The cost meter: dollars so far, per million tokens, projected to the end, and on-demand."""

from __future__ import annotations

from pathlib import Path

import pytest

from thrifty.errors import ConfigError, ThriftyError
from thrifty.measure.cost import CostConfig, CostMeter
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
