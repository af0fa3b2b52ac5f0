"""StopReason: the words summary.json has always carried, and one order deciding which wins."""

from __future__ import annotations

import json

import pytest

from thrifty.records.budget import Budget
from thrifty.records.stop import StopReason


def test_each_reason_is_the_word_it_always_was():
    words = [
        "data_error",
        "diverged",
        "preempted",
        "max_steps",
        "max_tokens",
        "max_time",
        "early_stopping",
        "forecast",
        "pruned",
        "callback",
        "data_exhausted",
    ]
    assert [r.value for r in StopReason] == words
    for reason, word in zip(StopReason, words, strict=True):
        assert reason == word and StopReason(word) is reason
        assert str(reason) == f"{reason}" == f"{reason:>3}".strip() == word
        assert "%s" % reason == word  # noqa: UP031 (how the log lines format it)
        assert json.dumps({"stop_reason": reason}) == json.dumps({"stop_reason": word})
        assert word in {reason} and {word: 1}[reason] == 1


def test_the_winner_follows_the_declared_precedence():
    order = list(StopReason)
    for i, high in enumerate(order):
        for low in order[i + 1 :]:
            assert StopReason.decide(low, high) is high
            assert StopReason.decide(high, None, low) is high
    # Today's rules, one by one: divergence over a preemption notice; a preemption over the
    # budget spent at that step; the budget over an evaluation's verdict; early stopping over
    # the forecast; running out of data only when nothing else was said.
    assert StopReason.decide("preempted", "diverged") is StopReason.DIVERGED
    assert StopReason.decide("max_steps", "preempted") is StopReason.PREEMPTED
    assert StopReason.decide("max_time", "early_stopping") is StopReason.MAX_TIME
    assert StopReason.decide("forecast", "early_stopping") is StopReason.EARLY_STOPPING
    assert StopReason.decide("pruned", "forecast") is StopReason.FORECAST
    assert StopReason.decide("max_steps", "pruned") is StopReason.MAX_STEPS
    assert StopReason.decide("callback", "pruned") is StopReason.PRUNED  # thrifty's own first
    assert StopReason.decide("data_exhausted", "callback") is StopReason.CALLBACK
    assert StopReason.decide(None, "data_exhausted") is StopReason.DATA_EXHAUSTED
    assert StopReason.decide() is None and StopReason.decide(None, None) is None


def test_an_unknown_reason_is_refused():
    with pytest.raises(ValueError, match="'max_stpes' is not a valid StopReason"):
        StopReason.decide("max_stpes")


def test_the_budget_names_its_limits_in_the_same_order():
    budget = Budget(max_steps=10, max_tokens=100, max_seconds=5.0)
    assert budget.exceeded(10, 100, 5.0) is StopReason.MAX_STEPS
    assert budget.exceeded(9, 100, 5.0) is StopReason.MAX_TOKENS
    assert budget.exceeded(9, 99, 5.0) is StopReason.MAX_TIME
    assert budget.exceeded(9, 99, 4.9) is None


def test_what_each_reason_means_for_the_run():
    early = {r for r in StopReason if r.early}
    assert early == {
        StopReason.EARLY_STOPPING,
        StopReason.FORECAST,
        StopReason.PRUNED,
        StopReason.DIVERGED,
    }
    unfinished = {r for r in StopReason if r.unfinished}
    assert unfinished == {StopReason.PREEMPTED, StopReason.DATA_ERROR}
    no_final = {r for r in StopReason if not r.saves_final}
    assert no_final == {StopReason.PREEMPTED, StopReason.DIVERGED, StopReason.DATA_ERROR}
