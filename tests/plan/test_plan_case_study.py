"""The "$50K -> $18K" case study: recomputed per year, and its disagreements listed with numbers.

Source of every published figure: the seed article "Training Cost Optimization: From $50K to $18K
Without Losing Accuracy" (its text, its breakdown table and its Chinchilla example).
"""

from __future__ import annotations

import dataclasses

import pytest

from thrifty.commands.plan.case_study import PUBLISHED, case_study
from thrifty.errors import ConfigError
from thrifty.plan.catalog import Catalog, load_catalog
from thrifty.plan.units import fmt_dollars


@pytest.fixture(scope="module")
def study():
    return case_study()


def _line(study, claim: str) -> str:
    matches = [line for line in study.disagreements if line.startswith(claim)]
    assert len(matches) == 1, study.disagreements
    return matches[0]


def _check(study, claim: str):
    matches = [c for c in study.checks if c.claim == claim]
    assert len(matches) == 1, [c.claim for c in study.checks]
    return matches[0]


def test_it_is_priced_at_a_dated_catalog_row(study) -> None:
    row = load_catalog().instance("p4d.24xlarge@v7")
    assert study.instance == "p4d.24xlarge@v7"
    assert study.price_source == row.dated_source and row.price_date


def test_the_articles_yearly_figures_are_twenty_four_runs() -> None:
    # Article text: "$37,748 per run. Two runs per month: $75,496/month, $905,952/year" and
    # "$18,200 per run"; "annual cost dropped from $905,952 to $436,800".
    assert 24 * 37_748 == 905_952 == 12 * 75_496 == PUBLISHED["annual_before"]
    assert 24 * 18_200 == 436_800 == PUBLISHED["annual_after"]
    assert 2 * 12 == PUBLISHED["runs_per_year"]


def test_the_levers_are_costed_per_year_at_the_catalog_price(study) -> None:
    # p4d.24xlarge@v7: $32.77/h on-demand (SkyPilot catalog snapshot v7); 24 runs a year.
    spot = load_catalog().instance("p4d.24xlarge@v7").spot_per_hour
    plan = study.catalog_levers
    assert plan.period == "year"
    costs = [plan.baseline] + [s.after for s in plan.steps]
    assert costs == pytest.approx(
        [24 * 72 * 32.77, 24 * 72 * spot, 24 * 48 * spot, 24 * 40 * spot, 22.4 * 40 * spot]
    )
    assert plan.baseline == pytest.approx(56_626.56)


def test_at_its_own_prices_the_article_saves_far_more_a_year_than_it_says(study) -> None:
    article = study.article_levers
    assert article.period == "year"
    # $905,952 a year = 24 x $37,748, not a month.
    assert article.baseline == pytest.approx(24 * 37_748) == PUBLISHED["annual_before"]
    assert article.steps[0].after == pytest.approx(24 * 13_512)
    # 4 of 24 runs stopped at 60%: 22.4 runs x 40 h x ($13,512 / 72 h) = $168,149 a year,
    # $14,012 a month.
    assert article.final == pytest.approx(22.4 * 40 * 13_512 / 72) == pytest.approx(168_149.33)
    assert article.final / 12 == pytest.approx(14_012.44)
    assert article.saving_pct == pytest.approx(1 - 168_149.33 / 905_952)


def test_the_headline_labels_yearly_figures_per_year(cli) -> None:
    r = cli("plan", "--case-study")
    assert r.code == 0
    assert "$905,952 -> $168,149 per year" in r.out
    # The catalog row: 24 x 72 h x $32.77 = $56,627 on-demand, then 22.4 x 40 h at its spot price.
    spot = load_catalog().instance("p4d.24xlarge@v7").spot_per_hour
    assert f"$56,627 -> {fmt_dollars(22.4 * 40 * spot)} per year" in r.out
    assert "per month" not in r.out.split("\n")[1].split("the article prints")[0]
    # The article's own: 1 - 436,800 / 905,952 = 51.8% a year; 1 - 21,800 / 75,496 = 71.1%.
    assert "$905,952 -> $436,800 (-51.8%) per year" in r.out
    assert "$75,496 -> $21,800 (-71.1%) per month" in r.out
    assert "(USD per year)" in r.out and "(USD per month)" not in r.out


def test_the_run_count_agrees_with_the_yearly_figures(study) -> None:
    for claim in (
        "annual before = 12 x monthly",
        "annual before = 24 runs x cost per run",
        "annual after = 24 runs x cost per run",
        "annual saving",
    ):
        assert _check(study, claim).agrees, claim
    assert not any(line.startswith("runs per month") for line in study.disagreements)


def test_the_table_labels_a_yearly_run_count_monthly(study) -> None:
    # Table: "Early stopping (4 runs/month) | 24 runs x 40h"; the article runs 2 a month.
    line = _line(study, "early stopping: runs a month")
    assert "'(4 runs/month)' beside '24 runs x 40h'" in line
    assert "2 runs a month x 12 = 24" in line and "4 of 24 runs a year, 0.33 a month" in line


def test_the_monthly_table_total_disagrees_with_the_annual_figure(study) -> None:
    # $436,800 / 12 = $36,400, not the table's $21,800.
    line = _line(study, "monthly cost after the levers")
    assert "$21,800" in line and "$36,400" in line


def test_the_on_demand_price_disagrees_with_the_catalog(study) -> None:
    # $37,748 / 72 h / 8 GPUs = $65.53/GPU-h; p4d $32.77 / 8 = $4.10, $21.96 / 8 = $2.75.
    line = _line(study, "on-demand price implied by $37,748")
    assert "$65.53/GPU-h" in line and "$4.10/GPU-h" in line and "$2.75/GPU-h" in line


def test_the_per_run_figure_disagrees_with_its_own_levers(study) -> None:
    # $13,512 x 48/72 x 40/48 = $7,507.
    line = _line(study, "cost per run after spot, BF16 and larger batch")
    assert "$18,200" in line and "$7,507" in line


def test_fifty_two_percent_disagrees_with_seventy_one(study) -> None:
    line = _line(study, "reduction: text vs table")
    assert "-52%" in line and "-71%" in line and "-51.8%" in line


def test_the_chinchilla_examples_budget_buys_1_37e22_flops(study) -> None:
    # Article: budget_flops = 50_000 / 9.83 * 3600 * 8 * 312e12 * 0.30.
    flops = 50_000 / 9.83 * 3600 * 8 * 312e12 * 0.30
    assert flops == pytest.approx(1.3711e22, rel=1e-4)
    check = _check(study, "Chinchilla example: FLOPs its $50K budget buys")
    assert check.agrees and check.published == "1.37e22 FLOP"


def test_the_chinchilla_example_prices_gpu_hours_at_the_instance_rate(study) -> None:
    # Article: a100_hours = flops / (312e12 * 0.30) / 3600, then spot_cost_usd = a100_hours * 9.83
    # with $9.83/h the whole 8-GPU p4d: 40,692 GPU-h x $9.83 = $400,000 = 8 x $50,000.
    gpu_hours = 50_000 / 9.83 * 3600 * 8 * 312e12 * 0.30 / (312e12 * 0.30) / 3600
    assert gpu_hours == pytest.approx(40_691.76)
    assert gpu_hours * 9.83 == pytest.approx(8 * 50_000)
    line = _line(study, "Chinchilla example: cost of those FLOPs")
    assert "40,692 single-GPU hours" in line and "$400,000, 8x the budget" in line
    assert "at $1.23/GPU-h it is $50,000" in line


def test_the_chinchilla_examples_docstring_is_13_7x_off_its_conversion(study) -> None:
    # Docstring: "1e21 for ~$50K on A100s"; its conversion gives 1.37e22 for $50K, and 1e21
    # costs 1e21 / (312e12 x 0.30 x 3600 x 8) instance-hours x $9.83 = $3,647.
    assert 1.3711e22 / 1e21 == pytest.approx(13.7, abs=0.05)
    assert 1e21 / (312e12 * 0.30 * 3600 * 8) * 9.83 == pytest.approx(3_646.58, abs=0.01)
    line = _line(study, "Chinchilla example: docstring '1e21 for ~$50K on A100s'")
    assert "13.7x more" in line and "1e21 FLOP costs $3,647" in line


def test_internally_consistent_figures_are_reported_as_agreeing(study) -> None:
    agreeing = {c.claim for c in study.checks if c.agrees}
    assert {
        "spot saving $ = on-demand - spot",
        "BF16 72 -> 48 h saving",
        "larger batch 48 -> 40 h saving",
        "annual saving",
    } <= agreeing


def test_each_disagreement_is_one_line(study) -> None:
    assert len(study.disagreements) == 12
    assert all("\n" not in line for line in study.disagreements)


def test_another_a100_instance_can_price_the_case_study() -> None:
    # p4d.24xlarge (SkyPilot catalog v8): $21.96/h.
    newer = case_study("p4d.24xlarge")
    assert newer.catalog_levers.baseline == pytest.approx(24 * 72 * 21.96)


def test_a_non_a100_instance_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="^instance 'lambda-8x-h100-sxm' carries H100-SXM") as e:
        case_study("lambda-8x-h100-sxm")
    assert "measured on A100s; choose an A100 instance: p4d.24xlarge" in str(e.value)
    assert "\n" not in str(e.value)


def test_the_command_refuses_a_non_a100_instance_with_exit_2(cli) -> None:
    r = cli("plan", "--case-study", "--instance", "lambda-8x-h100-sxm")
    assert r.code == 2
    assert "carries H100-SXM GPUs" in r.err and "choose an A100 instance" in r.err
    assert "$0.00" not in r.out + r.err


def test_an_a100_instance_without_a_spot_price_says_the_lever_does_not_apply() -> None:
    catalog = load_catalog()
    row = dataclasses.replace(
        catalog.instance("p4d.24xlarge"), name="a100-no-spot", spot_per_hour=None, spot_range=None
    )
    own = Catalog(gpus=catalog.gpus, instances={**catalog.instances, row.name: row})
    study = case_study("a100-no-spot", catalog=own)
    assert [s.lever for s in study.catalog_levers.steps][0] == "precision"
    assert "no spot price in the catalog, so the spot lever does not apply" in study.assumptions[0]
    assert not any("$0.00" in note for note in study.assumptions)
    assert not any(c.claim.startswith("spot price implied") for c in study.checks)
