"""`thrifty report` on a run whose summary.json, diagnosis.json or records hold values of the
wrong type (a string for a number, a list for a table, null): the page is written, the field is
left out, and one line names the file and the field; never a traceback."""

from __future__ import annotations

import logging
from html import escape

import pytest

from reporting.report_helpers import step, write_run
from thrifty import cli
from thrifty.reporting import figures, load

SUMMARY = {
    "steps": "ten",
    "stop_reason": "max_steps",
    "breakdown": "fast",
    "cost": [1, 2],
    "micro_batch": 0,
    "accumulation_steps": "4",
    "mfu": None,
}
DIAGNOSIS = {
    "bottleneck": ["data"],
    "recommendations": 5,
    "evidence": 7,
    "guard": {"skipped_steps": 2, "rollbacks": [None, {"from_step": 4, "to_step": 2}]},
    "measured": "x",
}


def test_fields_of_the_wrong_type_are_left_out_and_named(tmp_path, caplog):
    records = [step(1, breakdown={"checkpoint": "slow"}), step(2, breakdown=[1, 2])]
    run = write_run(tmp_path / "run", records, summary=SUMMARY, diagnosis=DIAGNOSIS)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        assert cli.main(["report", str(run)]) == 0
    summary, diagnosis = run / "summary.json", run / "diagnosis.json"
    expected = [
        f"{summary}: steps is text, not a number: left out of the report",
        f"{summary}: breakdown is text, not a table: left out of the report",
        f"{summary}: cost is a list, not a table: left out of the report",
        f"{summary}: micro_batch is a number, not a positive whole number: left out of the report",
        f"{summary}: accumulation_steps is text, not a positive whole number: left out of the "
        "report",
        f"{diagnosis}: bottleneck is a list, not text: left out of the report",
        f"{diagnosis}: recommendations is a number, not a list: left out of the report",
        f"{diagnosis}: evidence is a number, not a list: left out of the report",
        f"{diagnosis}: measured is text, not a table: left out of the report",
    ]
    assert [r.getMessage() for r in caplog.records] == expected
    page = (run / "report.html").read_text()
    assert all(escape(line) in page for line in expected)
    assert "rolled back 4 → 2" in page  # the good rollback is kept, the null one left out
    assert "left out, a value in its files" not in page  # every section was drawn


def test_a_section_that_still_cannot_be_drawn_is_left_out_with_a_warning(
    tmp_path, caplog, monkeypatch
):
    run = write_run(tmp_path / "run", [step(1), step(2)])

    def broken(run):
        raise TypeError("'<' not supported between instances of 'str' and 'int'")

    monkeypatch.setattr(figures, "headline", broken)
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        assert cli.main(["report", str(run)]) == 0
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"{run}: Headline left out of the report: a value in its files")
    page = (run / "report.html").read_text()
    assert 'data-section="headline"' in page and "Headline: left out" in page
    assert 'data-section="loss"' in page


@pytest.mark.parametrize("bad", ["3", "[1, 2]", '"x"'])
def test_a_config_table_of_the_wrong_type_is_left_out(tmp_path, bad):
    run = write_run(tmp_path / "run", [step(1)])
    (run / "config.toml").write_text(f"batch = {bad}\n[cost]\npricing = 1\n")
    assert load(run).config == {"cost": {"pricing": 1}}
    assert cli.main(["report", str(run)]) == 0
