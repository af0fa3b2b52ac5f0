"""`thrifty plan` and `thrifty prices`, run in-process: tables, JSON, charts and bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

JOB = ["plan", "--params", "7B", "--tokens", "140B", "--instance", "p4d.24xlarge@v7"]


def test_prices_lists_gpus_and_instances_with_sources_and_dates(cli) -> None:
    r = cli("prices")
    assert r.code == 0
    for text in (
        "GPUs (peak dense TFLOP/s per GPU)",
        "H100-SXM",
        "989.5",
        "p4d.24xlarge@v7",
        "32.77",
        "2026-02-12",
        "SkyPilot catalog snapshot v7",
    ):
        assert text in r.out


def test_prices_shows_one_entry_in_full(cli) -> None:
    r = cli("prices", "a2-highgpu-8g")
    assert r.code == 0
    assert "google-cloud-pricing-cost-calculator" in r.out and "us-central1" in r.out


def test_prices_json_is_machine_readable(cli) -> None:
    data = cli("prices", "--instances", "--json").json()
    assert data["gpus"] == []
    row = next(i for i in data["instances"] if i["name"] == "p5.48xlarge")
    assert row["on_demand_per_hour"] == 55.04 and row["price_date"] == "2026"


def test_prices_reads_a_user_catalog(cli, tmp_path) -> None:
    user = tmp_path / "mine.toml"
    user.write_text(
        '[[instance]]\nname = "box"\nprovider = "onprem"\nregion = "lab"\ngpu = "L4"\n'
        'gpu_count = 4\non_demand = 3.0\nprice_source = "amortised"\nprice_date = "2026-10"\n'
    )
    r = cli("prices", "--instances", "--provider", "onprem", "--catalog", str(user))
    assert r.code == 0 and "box" in r.out and "p4d" not in r.out


def test_plan_prints_estimate_and_memory_with_assumptions(cli) -> None:
    r = cli(*JOB)
    assert r.code == 0
    for text in (
        "Job estimate",
        "cost, on-demand",
        "Memory per GPU",
        "MFU 35.0% assumed",
        "SkyPilot catalog snapshot v7",
        "fits",
    ):
        assert text in r.out


def test_plan_json_matches_the_python_api(cli) -> None:
    from thrifty.plan import estimate

    data = cli(*JOB, "--json").json()
    api = estimate(7e9, 140e9, instance="p4d.24xlarge@v7")
    assert data["estimate"]["hours"] == pytest.approx(api.hours)
    assert data["estimate"]["cost"]["spot"] == pytest.approx(api.cost["spot"])
    assert data["memory"]["per_param_total"] == 16
    assert data["estimate"]["assumptions"]


def test_plan_from_a_transformer_shape_and_steps_adds_scaling(cli) -> None:
    r = cli(
        "plan",
        "--layers",
        "12",
        "--hidden",
        "768",
        "--heads",
        "12",
        "--vocab",
        "50257",
        "--seq",
        "1024",
        "--steps",
        "600000",
        "--batch",
        "480",
        "--instance",
        "p4d.24xlarge",
        "--json",
    )
    data = r.json()
    assert data["estimate"]["tokens"] == 600000 * 480 * 1024
    assert data["memory"]["activations"] > 0
    assert data["scaling"]["gpus"] == 8 and 0 < data["scaling"]["efficiency_no_overlap"] <= 1


def test_plan_with_an_advisor_bucket_adds_spot_economics(cli) -> None:
    data = cli(*JOB, "--advisor", "5-10%", "--save-seconds", "120", "--json").json()
    spot = data["spot"]
    assert spot["save_seconds"] == 120
    assert spot["spot_cost"] < spot["on_demand_cost"]
    assert spot["break_even_rate_per_hour"] > spot["rate_per_hour"]


def test_a_fleet_of_64_spot_instances_is_interrupted_64_times_as_often(cli) -> None:
    # Issue 14: p5.48xlarge x 64 at advisor '>20%' (3.94e-4/h per instance) gave 0.36
    # interruptions and a 33,080 s interval; the job's rate is 64 times that.
    data = cli(
        "plan",
        *("--params", "70B", "--tokens", "1.4T", "--instance", "p5.48xlarge", "--count", "64"),
        *("--advisor", ">20%", "--json"),
    ).json()["spot"]
    assert data["instances"] == 64
    assert data["rate_per_instance_per_hour"] == pytest.approx(3.938e-4, rel=1e-3)
    assert data["rate_per_hour"] == pytest.approx(64 * 3.938e-4, rel=1e-3)
    assert data["interval_seconds"] == pytest.approx(4100, rel=0.01)
    assert data["expected_interruptions"] == pytest.approx(
        data["rate_per_hour"] * data["work_hours"], rel=0.05
    )
    assert data["break_even_rate_per_instance_per_hour"] == pytest.approx(
        data["break_even_rate_per_hour"] / 64
    )


def test_spot_break_even_comes_from_the_exact_model(cli) -> None:
    from thrifty.plan.spot import break_even_rate

    spot = cli(
        *JOB, "--interruptions-per-hour", "0.1", "--save-seconds", "120", "--restart-seconds", "900"
    )
    assert spot.code == 0
    assert "first-order approximations" in spot.out
    data = cli(
        *(JOB + ["--interruptions-per-hour", "0.1", "--save-seconds", "120"]),
        *("--restart-seconds", "900", "--json"),
    ).json()["spot"]
    od, price, work = data["on_demand_per_hour"], data["spot_per_hour"], data["work_hours"]
    assert data["break_even_rate_per_hour"] == pytest.approx(
        break_even_rate(od, price, 120, 900, work_hours=work)
    )


def test_a_job_shorter_than_one_interval_prints_the_same_spot_cost_with_or_without_checkpoints(
    cli,
) -> None:
    # 11.3 min of work: the only save is the final one, which on-demand writes too. It was
    # charged to spot alone: 1.177x, $4.47 beside $3.80 without checkpoints, break-even 3.55/h.
    r = cli(
        *("plan", "--params", "125M", "--tokens", "2.5B", "--instance", "p5.48xlarge"),
        *("--advisor", "5-10%", "--save-seconds", "120"),
    )
    assert r.code == 0, r.err
    rows = {
        line.split("   ")[0].strip(): line.split("   ", 1)[1].strip()
        for line in r.out.splitlines()
        if line.startswith("  ") and "   " in line.strip()
    }
    assert rows["expected cost, spot"].startswith("$4.47 at $20.20/h")
    assert rows["without checkpoints"].startswith("13.3 min, $4.47 expected")
    assert rows["expected wall-clock"].startswith("13.3 min vs 13.3 min on-demand (1.00x")
    assert rows["break-even rate"].startswith("4.51/h")


def test_five_interruptions_an_hour_with_a_900_s_restart_is_planned_not_refused(cli) -> None:
    # Issue 14: refused before with "the job never finishes"; about 3.5x the work.
    r = cli(*JOB, "--interruptions-per-hour", "5", "--restart-seconds", "900", "--json")
    assert r.code == 0, r.err
    assert r.json()["spot"]["overhead_factor"] == pytest.approx(3.49, abs=0.01)


def test_an_mfu_out_of_range_is_refused_alike_with_or_without_tokens(cli) -> None:
    without = cli("plan", "--params", "7B", "--instance", "p4d.24xlarge", "--mfu", "35")
    with_tokens = cli(*JOB, "--mfu", "35")
    assert without.code == with_tokens.code == 2
    assert without.err == with_tokens.err
    assert without.out == with_tokens.out == ""


def test_a_whole_count_may_be_written_in_exponent_form(cli) -> None:
    data = cli(
        "plan", "--params", "7B", "--tokens", "1T", "--gpu", "A100", "--count", "1e3", "--json"
    ).json()
    assert data["estimate"]["gpus"] == 1000


def test_a_reader_that_closes_the_pipe_early_ends_the_plan_quietly() -> None:
    """`thrifty plan ... --json | head`: stdout whose reader has gone (EPIPE on every write)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {k: v for k, v in os.environ.items() if k != "THRIFTY_CATALOG"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "thrifty.cli", *JOB, "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=env,
            timeout=120,
        )
    finally:
        os.close(write_end)
    assert done.stderr.decode() == ""
    assert done.returncode == 0


def test_plan_levers_prints_a_table_and_writes_a_waterfall(cli, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    chart = tmp_path / "levers.png"
    r = cli(*JOB, "--levers", "--runs", "24", "--early-stop", "4", "--plot", str(chart))
    assert r.code == 0, r.err
    assert "price: spot instances" in r.out and "runs: early stopping" in r.out
    assert chart.read_bytes()[:4] == b"\x89PNG"


def test_plan_budget_prints_the_compute_optimal_allocation(cli) -> None:
    r = cli("plan", "--budget-flops", "5.88e23")
    assert r.code == 0
    assert "epoch (chosen)" in r.out and "hoffmann" in r.out and "tokens-per-param" in r.out
    data = cli("plan", "--budget-flops", "5.88e23", "--json").json()["chinchilla"]
    assert data["params"] == pytest.approx(70e9, rel=0.1)
    assert 6 * data["params"] * data["tokens"] == pytest.approx(5.88e23)


def test_plan_budget_in_dollars_is_priced_at_the_instance(cli) -> None:
    from thrifty.plan import load_catalog

    spot = load_catalog().instance("p5.48xlarge").spot_per_hour
    data = cli(
        "plan",
        "--budget-dollars",
        "50k",
        "--instance",
        "p5.48xlarge",
        "--pricing",
        "spot",
        "--json",
    ).json()["chinchilla"]
    assert any(f"spot ${spot:.2f}/h" in note for note in data["assumptions"])


def test_case_study_lists_each_disagreement_with_numbers(cli, tmp_path) -> None:
    r = cli("plan", "--case-study")
    assert r.code == 0
    assert "$65.53/GPU-h" in r.out and "$4.10/GPU-h" in r.out
    assert "DISAGREES" in r.out and "disagreements:" in r.out
    assert "per year" in r.out  # the article's 24 runs are a year's
    data = cli("plan", "--case-study", "--json").json()
    # 22.4 runs x 40 h at p4d@v7's spot median, $6.7915/h (SkyPilot's AWS catalog v7, three
    # us-east-1 zones): the levers' final yearly cost.
    assert data["catalog_levers"]["final"] == pytest.approx(22.4 * 40 * 6.7915)
    assert len(data["disagreements"]) == 12


BAD_INPUT = [
    (
        ["plan", "--params", "7B", "--tokens", "1T", "--gpu", "A1000"],
        "unknown GPU 'A1000': did you mean",
    ),
    (
        ["plan", "--params", "7B", "--tokens", "1T", "--instance", "p5.48xl"],
        "did you mean p5.48xlarge",
    ),
    (["prices", "H10"], "did you mean"),
    (
        ["plan", "--params", "0", "--tokens", "1T", "--gpu", "A100"],
        "--params: must be greater than 0",
    ),
    (
        ["plan", "--params", "7B", "--tokens=-1T", "--gpu", "A100"],
        "--tokens: must be greater than 0",
    ),
    (["plan", "--params", "7B", "--tokens", "1T", "--gpu", "A100", "--count", "0"], "--count"),
    (["plan", "--budget-flops", "0"], "--budget-flops: must be greater than 0"),
    (["plan", "--budget-dollars=-100", "--instance", "p4d.24xlarge"], "--budget-dollars: must be"),
    ([*JOB, "--interruptions-per-hour", "0"], "--interruptions-per-hour: must be greater than 0"),
    (
        [*JOB, "--interruptions-per-hour", "100", "--checkpoint-interval", "36000"],
        "runs through with probability e^-1,002, so the expected time exceeds 1e300 h",
    ),
    ([*JOB, "--advisor", "30%"], "advisor bucket must be one of"),
    ([*JOB, "--mfu", "2"], "--mfu: must be a fraction in (0, 1], got '2'; for 2% write 0.02"),
    (
        ["plan", "--params", "7B", "--instance", "p4d.24xlarge", "--mfu", "35"],
        "--mfu: must be a fraction in (0, 1], got '35'; for 35% write 0.35",
    ),
    (
        ["plan", "--params", "7B", "--tokens", "1,4T", "--gpu", "A100"],
        "--tokens: cannot read '1,4T': a comma could be a decimal mark or a thousands separator",
    ),
    (
        ["plan", "--params", "7,5B", "--tokens", "1T", "--gpu", "A100"],
        "--params: cannot read '7,5B': a comma",
    ),
    (
        ["plan", "--params", "7B", "--tokens", "1T", "--gpu", "A100", "--count", "1.5"],
        "--count: expected a whole number, got '1.5'",
    ),
    (["plan", "--params", "7B", "--tokens", "1T", "--gpu", "T4"], "no bf16 peak for T4"),
    ([*JOB, "--bus-bandwidth", "300"], "give a number with its unit"),
    (["plan"], "thrifty plan needs a model"),
    (
        ["plan", "--layers", "12", "--hidden", "768", "--gpu", "A100"],
        "needs --heads, --vocab, --seq",
    ),
    ([*JOB, "--plot", "x.png"], "--plot draws the lever waterfall"),
]


@pytest.mark.parametrize(("args", "expected"), BAD_INPUT)
def test_bad_input_is_one_clear_line_and_exit_code_2(cli, args: list[str], expected: str) -> None:
    r = cli(*args)
    assert r.code == 2
    assert r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1, r.err
    assert lines[0].startswith("thrifty: error: ")
    assert expected in lines[0]
    assert "Traceback" not in r.err


def test_a_malformed_catalog_file_is_reported_with_line_and_field(cli, tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[gpu]]\nname = "X1"\npeak_tflops = { bf17 = 3 }\n')
    r = cli("prices", "--catalog", str(bad))
    assert r.code == 2
    assert r.err.strip() == (
        f"thrifty: error: {bad} line 3: gpu 'X1' field 'peak_tflops.bf17' is not a dtype; "
        "use fp32, tf32, bf16, fp16, fp8"
    )


def test_hours_on_an_instance_are_priced_on_demand_and_on_spot_without_a_model(cli) -> None:
    import json

    from thrifty.plan.catalog import load_catalog
    from thrifty.plan.spot import interruption_rate

    p4d = load_catalog().instance("p4d.24xlarge")
    r = cli("plan", "--instance", "p4d.24xlarge", "--hours", "72", "--json")
    assert r.code == 0, r.err
    spot = json.loads(r.out)["spot"]
    assert spot["work_hours"] == 72
    assert spot["on_demand_cost"] == pytest.approx(p4d.on_demand_per_hour * spot["on_demand_hours"])
    assert spot["on_demand_hours"] == pytest.approx(72 + 60 / 3600)  # and the final save
    assert spot["rate_per_hour"] == pytest.approx(interruption_rate(advisor_bucket="5-10%"))
    assert spot["on_demand_hours"] < spot["expected_hours"]  # the interruptions' cost in time
    assert spot["spot_cost"] == pytest.approx(p4d.spot_per_hour * spot["expected_hours"])
    assert any("no rate given: thrifty's default" in a for a in spot["assumptions"])
    faster = cli("plan", "--instance", "p4d.24xlarge", "--hours", "72", "--advisor", ">20%")
    assert faster.code == 0 and "advisor bucket >20%:" in faster.out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--hours", "72"], "--hours needs a priced --instance, e.g. --instance p4d.24xlarge"),
        (
            ["--hours", "72", "--instance", "p4d.24xlarge", "--params", "7B"],
            "--hours prices hours of work on an instance: give it without a model",
        ),
    ],
)
def test_hours_without_what_it_needs_is_one_line(cli, args, expected) -> None:
    r = cli("plan", *args)
    assert r.code == 2 and r.out == ""
    (line,) = r.err.strip().splitlines()
    assert expected in line
