"""`thrifty report` on bad input: each case one line and exit code 2 from the command line, a
ThriftyError from Python; and a run's own report never fails the run."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from html import escape as html_escape

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


def test_damaged_lines_are_left_out_and_the_page_names_them(tmp_path, caplog):
    run = write_run(tmp_path / "run", [step(1)])
    damaged = [b'{"step": 2, "lo', b"\xff\xfe{", b"[1, 2]", b'"x"']
    lines = [*damaged, json.dumps(step(3)).encode(), b'{"step": 4, "loss": 1.']
    with open(run / "metrics.jsonl", "ab") as f:
        f.write(b"\n".join(lines))
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        assert cli.main(["report", str(run)]) == 0
    assert [r["step"] for r in load(run).steps] == [1, 3]
    note = f"{run / 'metrics.jsonl'}: 4 damaged lines left out (lines 2, 3, 4, 5: cut short"
    assert [r.getMessage() for r in caplog.records] == [load(run).notes[0]]
    assert load(run).notes[0].startswith(note)  # the last line, cut short by a kill: no word
    assert html_escape(note) in (run / "report.html").read_text()


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


def test_an_existing_out_file_needs_overwrite_and_is_then_replaced(tmp_path, capsys):
    run = write_run(tmp_path / "run", [step(1)])
    out = tmp_path / "compare.html"
    assert cli.main(["report", str(run), "--out", str(out)]) == 0
    first = out.read_bytes()
    line = one_line_error(capsys, [str(run), "--out", str(out)])
    assert line == f"thrifty: error: {out} exists: give --overwrite to replace it, or another --out"
    assert out.read_bytes() == first
    write_run(run, [step(1), step(2)])
    assert cli.main(["report", str(run), "--out", str(out), "--overwrite"]) == 0
    assert out.read_bytes() != first and out.read_text().startswith("<!DOCTYPE html>")


def test_a_file_thrifty_did_not_write_is_never_replaced_even_with_overwrite(tmp_path, capsys):
    run = write_run(tmp_path / "run", [step(1)])
    mine = tmp_path / "notes.html"
    mine.write_text("<html><body>my own page</body></html>")
    line = one_line_error(capsys, [str(run), "--out", str(mine), "--overwrite"])
    assert line == (
        f"thrifty: error: {mine} exists and thrifty did not write it: it is never replaced; "
        "move it away, or give another --out"
    )
    (run / "report.html").write_text("my report, by hand")
    line = one_line_error(capsys, [str(run)])
    assert "report.html exists and thrifty did not write it" in line
    assert "give --out FILE to write the report elsewhere" in line
    assert write_run_report(run) is None  # a run's end leaves it too, with a warning
    assert mine.read_text() == "<html><body>my own page</body></html>"
    assert (run / "report.html").read_text() == "my report, by hand"


def test_the_runs_own_report_html_is_rewritten_without_overwrite(tmp_path):
    run = write_run(tmp_path / "run", [step(1)])
    assert cli.main(["report", str(run)]) == 0
    before = (run / "report.html").read_text()
    write_run(run, [step(1), step(2, loss=1.0)])
    assert cli.main(["report", str(run)]) == 0
    assert (run / "report.html").read_text() != before
