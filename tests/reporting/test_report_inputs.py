"""`thrifty report` on bad input: each case one line and exit code 2 from the command line, a
ThriftyError from Python; and a run's own report never fails the run."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from reporting.report_helpers import step, write_run
from thrifty import cli
from thrifty.errors import ThriftyError
from thrifty.reporting import load, render_report, write_run_report


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(["report", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("thrifty: error: "), err
    return err[0]


def test_the_command_writes_report_html_into_the_run_directory(tmp_path, capsys):
    run = write_run(tmp_path / "run", [step(1), step(2)])
    assert cli.main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {run / 'report.html'}"
    assert (run / "report.html").read_text().startswith("<!DOCTYPE html>")


def test_a_path_that_is_not_a_run_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    line = one_line_error(capsys, [str(tmp_path / "missing")])
    assert "missing does not exist: give a run directory (it holds metrics.jsonl)" in line
    line = one_line_error(capsys, [str(tmp_path / "file.txt")])
    assert "file.txt is not a directory" in line
    line = one_line_error(capsys, [str(tmp_path / "empty")])
    assert "empty is not a run: it has no metrics.jsonl" in line


def test_a_run_that_died_before_its_first_flush_is_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text('[run]\nname = "run"\n')
    line = one_line_error(capsys, [str(run)])
    assert "has no metrics.jsonl: the run ended before its first metrics flush" in line
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.5, "grad_n')
    line = one_line_error(capsys, [str(run)])
    assert "metrics.jsonl holds no step record yet" in line


def test_a_last_line_cut_short_is_left_out(tmp_path):
    run = write_run(tmp_path / "run", [step(1), step(2)], tail='{"step": 3, "loss": 1.')
    assert [r["step"] for r in load(run).steps] == [1, 2]
    assert render_report(run) == run / "report.html"


def test_a_damaged_line_before_the_last_names_its_line(tmp_path, capsys):
    run = write_run(tmp_path / "run", [step(1)], tail='{"step": 2, "lo\n' + '{"step": 3}\n')
    line = one_line_error(capsys, [str(run)])
    assert "metrics.jsonl line 2 is not JSON: the file was damaged" in line


def test_an_output_that_cannot_be_written_is_one_line(tmp_path, capsys):
    run = write_run(tmp_path / "run", [step(1)])
    (tmp_path / "a-file").write_text("x")
    line = one_line_error(capsys, [str(run), "--out", str(tmp_path / "a-file" / "report.html")])
    assert "cannot write the report to" in line and "give another --out" in line
    line = one_line_error(capsys, [str(run), "--out", str(tmp_path)])
    assert "it is a directory; give a file name" in line


def test_several_runs_need_an_output_file(tmp_path, capsys):
    a = write_run(tmp_path / "a", [step(1)])
    b = write_run(tmp_path / "b", [step(1)])
    line = one_line_error(capsys, [str(a), str(b)])
    assert "a report of several runs needs --out FILE" in line
    assert cli.main(["report", str(a), str(b), "--out", str(tmp_path / "ab.html")]) == 0


def test_render_report_raises_thrifty_error(tmp_path):
    with pytest.raises(ThriftyError, match="does not exist"):
        render_report([tmp_path / "missing"])


def test_a_runs_own_report_never_raises_and_says_why_in_one_line(tmp_path, caplog):
    run = tmp_path / "run"
    run.mkdir()
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        assert write_run_report(run) is None
    (record,) = caplog.records
    assert "no report.html for" in record.getMessage() and "no metrics.jsonl" in record.getMessage()
    good = write_run(tmp_path / "good", [step(1)])
    assert write_run_report(good) == good / "report.html"


def test_registering_the_command_does_not_import_torch():
    code = (
        "import sys, thrifty.cli; thrifty.cli.build_parser(); import thrifty.reporting; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
