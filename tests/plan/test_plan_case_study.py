"""The "$50K -> $18K" case study: recomputed, and its disagreements listed with numbers."""

from __future__ import annotations

import pytest

from thrifty.plan.case_study import PUBLISHED, case_study


@pytest.fixture(scope="module")
def study():
    return case_study()


def test_it_is_priced_at_a_dated_catalog_row(study) -> None:
    assert study.instance == "p4d.24xlarge@v7"
    assert "2026" in study.price_source


def test_the_levers_are_recomputed_from_the_stated_inputs(study) -> None:
    costs = [study.catalog_levers.baseline] + [s.after for s in study.catalog_levers.steps]
    assert costs == pytest.approx([56626.56, 12700.80, 8467.20, 7056.00, 6585.60])


def test_at_its_own_prices_the_article_would_have_saved_far_more_than_it_says(study) -> None:
    article = study.article_levers
    assert article.baseline == pytest.approx(24 * 37_748)
    assert article.steps[0].after == pytest.approx(24 * 13_512)
    assert article.saving_pct == pytest.approx(1 - 22.4 * 40 * 13_512 / 72 / (24 * 37_748))


def _line(study, claim: str) -> str:
    matches = [line for line in study.disagreements if line.startswith(claim)]
    assert len(matches) == 1, study.disagreements
    return matches[0]


def test_the_on_demand_price_disagrees_with_the_catalog(study) -> None:
    line = _line(study, "on-demand price implied by $37,748")
    assert "$65.53/GPU-h" in line and "$4.10/GPU-h" in line and "$2.75/GPU-h" in line


def test_the_per_run_figure_disagrees_with_its_own_levers(study) -> None:
    line = _line(study, "cost per run after spot, BF16 and larger batch")
    assert "$18,200" in line and "$7,507" in line


def test_fifty_two_percent_disagrees_with_seventy_one(study) -> None:
    line = _line(study, "reduction: text vs table")
    assert "-52%" in line and "-71%" in line


def test_two_runs_a_month_disagrees_with_twenty_four(study) -> None:
    line = _line(study, "runs per month")
    assert "2 (text" in line and "24 runs" in line


def test_internally_consistent_figures_are_reported_as_agreeing(study) -> None:
    agreeing = {c.claim for c in study.checks if c.agrees}
    assert {
        "spot saving $ = on-demand - spot",
        "BF16 72 -> 48 h saving",
        "larger batch 48 -> 40 h saving",
        "annual saving",
    } <= agreeing


def test_each_disagreement_is_one_line(study) -> None:
    assert len(study.disagreements) >= 8
    assert all("\n" not in line for line in study.disagreements)


def test_the_published_figures_are_the_articles(study) -> None:
    assert PUBLISHED["on_demand_per_run"] - PUBLISHED["spot_per_run"] == PUBLISHED["spot_saving"]
    assert 12 * PUBLISHED["monthly_before"] == PUBLISHED["annual_before"]


def test_another_instance_can_price_the_case_study() -> None:
    newer = case_study("p4d.24xlarge")
    assert newer.catalog_levers.baseline == pytest.approx(24 * 72 * 21.96)
