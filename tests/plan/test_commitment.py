"""Single-GPU instances, committed prices and their break-even, and the planner's bounds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from thrifty.plan.catalog import load_catalog
from thrifty.plan.spot import interruption_rate, spot_economics

SINGLE_GPU = {
    "g5.xlarge": "A10G",
    "g6.xlarge": "L4",
    "g6e.xlarge": "L40S",
    "p5.4xlarge": "H100-SXM",
    "a2-highgpu-1g": "A100-SXM4-40GB",
    "g2-standard-4": "L4",
    "a3-highgpu-1g": "H100-SXM",
}


@pytest.mark.parametrize(("name", "gpu"), SINGLE_GPU.items())
def test_the_single_gpu_instances_people_start_on_are_priced_with_a_date_and_a_source(
    name, gpu
) -> None:
    instance = load_catalog().instance(name)
    assert (instance.gpu.name, instance.gpu_count) == (gpu, 1)
    assert instance.on_demand_per_hour > 0 and instance.price_date.startswith("2026")
    assert "http" in instance.price_source
    assert not instance.price_traced  # recalled or estimated, and marked so
    if instance.commitments():
        assert "commit_1y" in instance.uncertain and instance.commit_date


def test_a10g_for_two_hours_is_priced_on_g5_xlarge(cli) -> None:
    r = cli("plan", "--gpu", "A10G", "--hours", "2")
    assert r.code == 0, r.err
    assert "2.0 h on g5.xlarge" in r.out
    assert f"${2 * 1.006:.2f} at $1.006/h" in r.out
    assert "above 63.0% used" in r.out  # 0.634 / 1.006 of the year's hours


def test_commitment_break_even_against_on_demand_and_spot_with_interruptions(cli) -> None:
    r = cli("plan", "--instance", "a2-highgpu-8g", "--hours", "100", "--advisor", ">20%", "--json")
    assert r.code == 0, r.err
    data = json.loads(r.out)
    expected = spot_economics(
        100,
        on_demand_per_hour=29.39,
        spot_per_hour=10.35,
        rate_per_hour=interruption_rate(advisor_bucket=">20%"),
    )
    per_work_hour = expected.spot_cost / expected.on_demand_hours  # interruptions included
    terms = {t["term"]: t for t in data["commitment"]["terms"]}
    assert terms["1-year"]["break_even_on_demand"] == pytest.approx(18.52 / 29.39)
    assert terms["3-year"]["break_even_on_demand"] == pytest.approx(13.23 / 29.39)
    assert terms["1-year"]["break_even_spot"] == pytest.approx(18.52 / per_work_hour)
    assert terms["3-year"]["break_even_spot"] == pytest.approx(13.23 / per_work_hour)
    text = cli("plan", "--instance", "a2-highgpu-8g", "--hours", "100", "--advisor", ">20%").out
    assert f"never (needs {13.23 / per_work_hour * 100:.1f}%)" in text


def test_prices_shows_an_instances_commitments_and_their_break_even(cli) -> None:
    r = cli("prices", "p5.48xlarge")
    assert r.code == 0, r.err
    assert "Commitments on p5.48xlarge" in r.out
    assert f"above {35.78 / 55.04 * 100:.1f}% used" in r.out
    data = cli("prices", "g6.xlarge", "--json").json()
    shares = {t["term"]: t["break_even_on_demand"] for t in data["commitment"]["terms"]}
    assert shares == pytest.approx({"1-year": 0.507 / 0.8048, "3-year": 0.348 / 0.8048})
    listing = cli("prices", "--instances").out
    assert "g6.xlarge 0.51* / 0.35*" in listing


def test_a_commitment_at_or_above_on_demand_is_refused_in_one_line(cli, tmp_path) -> None:
    bad = tmp_path / "cat.toml"
    bad.write_text(
        '[[instance]]\nname = "x1"\nprovider = "aws"\nregion = "r"\ngpu = "A10G"\n'
        'gpu_count = 1\non_demand = 1.0\ncommit_1y = 1.5\ncommit_source = "quote"\n'
        'commit_date = "2026"\nprice_source = "quote"\nprice_date = "2026"\n'
    )
    r = cli("prices", "--catalog", str(bad))
    assert r.code == 2
    (line,) = r.err.strip().splitlines()
    assert "field 'commit_1y' (1.5) is not below the on-demand price (1.0)" in line


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--instance", "p4d.24xlarge", "--hours", "1e308"], "--hours"),
        (["--budget-flops", "1e300"], "--budget-flops"),
        (["--budget-gpu-hours", "1e300", "--gpu", "H100"], "--budget-gpu-hours"),
        (["--budget-dollars", "1e300", "--instance", "p4d.24xlarge"], "--budget-dollars"),
        (["--params", "1e300", "--tokens", "1T", "--gpu", "H100"], "--params"),
        (["--params", "7B", "--tokens", "1e300", "--gpu", "H100"], "--tokens"),
        (["--params", "7B", "--tokens", "1T", "--gpu", "H100", "--count", "1e12"], "--count"),
        (["--layers", "1e12"], "--layers"),
        (["--steps", "1e300"], "--steps"),
        (["--batch", "1e300"], "--batch"),
        (["--micro-batch", "1e300"], "--micro-batch"),
        (["--grad-accum", "1e300"], "--grad-accum"),
        (["--interruptions-per-hour", "1e300"], "--interruptions-per-hour"),
        (["--mtbi-hours", "1e300"], "--mtbi-hours"),
        (["--save-seconds", "1e300"], "--save-seconds"),
        (["--restart-seconds", "1e300"], "--restart-seconds"),
        (["--restart-seconds", "-5"], "--restart-seconds"),
        (["--checkpoint-interval", "1e300"], "--checkpoint-interval"),
        (["--bus-bandwidth", "1e300GB/s"], "--bus-bandwidth"),
        (["--runs", "1e300"], "--runs"),
        (["--early-stop", "1e300"], "--early-stop"),
        (["--early-stop", "-1"], "--early-stop"),
        (["--early-stop-at", "2"], "--early-stop-at"),
        (["--precision-speedup", "1e300"], "--precision-speedup"),
        (["--compile-speedup", "inf"], "--compile-speedup"),
    ],
)
def test_every_numeric_option_has_a_range_checked_before_any_work(cli, args, flag) -> None:
    r = cli("plan", *args)
    assert r.code == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert f"argument {flag}:" in line and "Traceback" not in r.err


def test_the_largest_accepted_values_still_give_figures(cli) -> None:
    r = cli("plan", "--instance", "p4d.24xlarge", "--hours", "1e6", "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["spot"]["work_hours"] == 1e6
    r = cli("plan", "--budget-flops", "1e30", "--json")
    assert r.code == 0, r.err


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", ["prices", "plan"])
@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: _fifo(p / "fifo.toml"), "is not a regular file"),
        (lambda p: p, "is a folder"),
        (lambda p: Path("/dev/zero"), "is not a regular file"),
    ],
)
def test_a_catalog_that_is_not_a_regular_file_is_refused_without_opening_it(
    cli, tmp_path, command, make, words
) -> None:
    target = make(tmp_path)
    extra = ["--hours", "2", "--gpu", "A10G"] if command == "plan" else []
    r = cli(command, "--catalog", str(target), *extra)  # a FIFO opened for reading would hang
    assert r.code == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert words in line


def test_a_catalog_over_the_size_bound_is_refused(cli, tmp_path) -> None:
    big = tmp_path / "big.toml"
    with big.open("wb") as file:
        file.truncate(5 * 2**20)
    r = cli("prices", "--catalog", str(big))
    assert r.code == 2
    (line,) = r.err.strip().splitlines()
    assert "over the 4 MiB a catalog may have" in line
