"""The catalog: shipped data, user overrides, malformed files, unknown names."""

from __future__ import annotations

import re

import pytest

from thrifty.plan.catalog import CatalogError, UnknownNameError, load_catalog

USER_ROW = """
[[instance]]
name = "p4d.24xlarge"
provider = "aws"
region = "us-west-2"
gpu = "A100"
gpu_count = 8
on_demand = 20.00
spot = 6.00
price_source = "my negotiated rate"
price_date = "2026-12-01"
"""


def test_every_instance_price_carries_a_source_and_a_date() -> None:
    catalog = load_catalog()
    assert len(catalog.instances) >= 8
    for instance in catalog.instances.values():
        assert instance.price_source and instance.price_date
        assert instance.on_demand_per_hour > 0
        assert instance.gpu.name in catalog.gpus


def test_gpu_peaks_match_the_reference_table() -> None:
    catalog = load_catalog()
    assert catalog.gpu("A100").peak_flops("bf16") == 312e12
    assert catalog.gpu("H100").peak_flops("bf16") == 989.5e12
    assert catalog.gpu("H100").peak_flops("fp8") == 1979e12
    assert catalog.gpu("H100-PCIe").peak_flops("tf32") == 378e12
    assert catalog.gpu("T4").peak_flops("fp16") == 65e12


def test_a_dtype_the_gpu_lacks_is_refused_with_the_ones_it_has() -> None:
    with pytest.raises(ValueError, match=r"no bf16 peak for T4 \(it has fp32, fp16\)"):
        load_catalog().gpu("T4").peak_flops("bf16")


def test_interconnect_is_carried_per_direction() -> None:
    catalog = load_catalog()
    assert catalog.gpu("A100").interconnect_gbs_per_direction == 300  # 600 GB/s bidirectional
    assert catalog.gpu("H100").interconnect_gbs_per_direction == 450  # 900 GB/s bidirectional
    assert catalog.instance("p4d.24xlarge").network_gbs == 50  # 400 Gbit/s


def test_uncertain_figures_are_marked_in_the_data() -> None:
    catalog = load_catalog()
    assert "peak_tflops.fp32" in catalog.gpu("L4").uncertain
    assert "peak_tflops.tf32" in catalog.gpu("L4").uncertain


def test_both_price_snapshots_are_kept_and_the_plain_name_is_the_newer() -> None:
    catalog = load_catalog()
    assert catalog.instance("p4d.24xlarge").on_demand_per_hour == 21.96
    assert catalog.instance("p4d.24xlarge@v7").on_demand_per_hour == 32.77
    assert catalog.instance("p4d.24xlarge@v7").spot_range == (5.0933, 9.6107)


def test_typical_spot_falls_back_to_the_midpoint_only_where_zones_are_not_listed(
    tmp_path,
) -> None:
    user = tmp_path / "range.toml"
    user.write_text(USER_ROW.replace("spot = 6.00", "spot_low = 5.09\nspot_high = 9.61"))
    instance = load_catalog(user).instance("p4d.24xlarge")
    assert instance.spot_per_hour == pytest.approx((5.09 + 9.61) / 2)
    assert instance.spot_basis == "midpoint of the range (zones not listed)"


def test_zones_and_a_range_together_are_refused(tmp_path) -> None:
    user = tmp_path / "both.toml"
    user.write_text(
        USER_ROW.replace("spot = 6.00", "spot_zones = { a = 1.0 }\nspot_low = 1\nspot_high = 2")
    )
    with pytest.raises(CatalogError, match="spot_zones' and spot_low/spot_high both given"):
        load_catalog(user)


def test_per_gpu_prices_are_multiplied_by_the_gpu_count() -> None:
    assert load_catalog().instance("lambda-8x-h100-sxm").on_demand_per_hour == pytest.approx(
        8 * 3.99
    )


def test_a_user_file_overrides_a_row_by_name_and_keeps_the_rest(tmp_path) -> None:
    user = tmp_path / "prices.toml"
    user.write_text(USER_ROW)
    catalog = load_catalog(user)
    assert catalog.instance("p4d.24xlarge").on_demand_per_hour == 20.0
    assert catalog.instance("p4d.24xlarge").price_date == "2026-12-01"
    assert catalog.instance("p5.48xlarge").on_demand_per_hour == 55.04
    assert str(user) in catalog.files


def test_a_user_file_can_add_a_gpu_and_an_instance_that_uses_it(tmp_path) -> None:
    user = tmp_path / "more.toml"
    user.write_text(
        '[[gpu]]\nname = "B200"\npeak_tflops = { bf16 = 2250 }\npeak_source = "mine"\n'
        'memory_gib = 180\nmemory_bandwidth_gbs = 8000\nmemory_source = "mine"\n'
        'interconnect = "NVLink 5"\ninterconnect_gbs_per_direction = 900\n'
        + USER_ROW.replace('"p4d.24xlarge"', '"b200-box"').replace('"A100"', '"B200"')
    )
    catalog = load_catalog(user)
    assert catalog.instance("b200-box").gpu.peak_flops("bf16") == 2250e12


def test_the_environment_variable_names_a_user_catalog(tmp_path, monkeypatch) -> None:
    user = tmp_path / "env.toml"
    user.write_text(USER_ROW)
    monkeypatch.setenv("THRIFTY_CATALOG", str(user))
    assert load_catalog().instance("p4d.24xlarge").on_demand_per_hour == 20.0


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("[[instance]\nname = 1", r"malformed TOML: .*line 1"),
        (
            USER_ROW.replace("on_demand = 20.00", "on_demand = -3"),
            r"line 8: instance 'p4d.24xlarge' field 'on_demand' must be a number > 0, got -3",
        ),
        (
            USER_ROW.replace('price_date = "2026-12-01"\n', ""),
            r"line 2: instance 'p4d.24xlarge' field 'price_date' is missing",
        ),
        (
            USER_ROW.replace("gpu_count = 8", "gpu_count = 8.5"),
            r"line 7: instance 'p4d.24xlarge' field 'gpu_count' must be a whole number > 0",
        ),
        (
            USER_ROW.replace("spot = 6.00", "spott = 6.00"),
            r"line 9: instance 'p4d.24xlarge' field 'spott' is not a known field; "
            r"did you mean 'spot'\?",
        ),
        (
            USER_ROW.replace('gpu = "A100"', 'gpu = "A1000"'),
            r"line 6: instance 'p4d.24xlarge' field 'gpu' names unknown GPU 'A1000'",
        ),
        ("price = 3\n", r"line 1: unknown top-level key 'price'"),
    ],
)
def test_a_malformed_catalog_names_the_file_line_and_field(
    tmp_path, text: str, pattern: str
) -> None:
    user = tmp_path / "bad.toml"
    user.write_text(text)
    with pytest.raises(CatalogError) as info:
        load_catalog(user)
    message = str(info.value)
    assert str(user) in message
    assert re.search(pattern, message), message
    assert "\n" not in message


def test_a_missing_catalog_file_is_one_clear_error(tmp_path) -> None:
    with pytest.raises(CatalogError, match="cannot be read"):
        load_catalog(tmp_path / "nope.toml")


def test_an_unknown_instance_suggests_the_closest_names() -> None:
    with pytest.raises(UnknownNameError, match=r"did you mean p4d\.24xlarge"):
        load_catalog().instance("p4d.24xlrge")


def test_an_unknown_gpu_suggests_the_closest_names() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown GPU 'H10O': did you mean .*H100"):
        load_catalog().gpu("H10O")


def test_lookups_ignore_case_and_accept_aliases() -> None:
    catalog = load_catalog()
    assert catalog.gpu("a100").name == "A100-SXM4-40GB"
    assert catalog.instance("P5.48XLARGE").name == "p5.48xlarge"
    assert catalog.find("h200").name == "H200-SXM"
