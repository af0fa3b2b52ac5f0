"""`thrifty plan fit` and `--fit FILE` read only what they can bound: a regular file (a FIFO is
refused, never opened), of bounded size, with bounded cells, JSON of bounded depth, numbers in
range and a bounded bootstrap; each refusal is one line with exit code 2. A fit shows its
progress on stderr."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from plan.test_lawfit import grid_points, write_run  # tests/ is on the path
from plan.test_plan_fit_cli import write_csv
from thrifty.plan.lawfile import save_fit
from thrifty.plan.lawfit import fit_scaling_law

DEEP = 100_000


@contextlib.contextmanager
def within(seconds: int) -> Iterator[None]:
    """Fail, rather than hang the suite, if the block blocks (an open of a FIFO waits forever)."""

    def expired(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = tmp_path_factory.mktemp("fit") / "fit.json"
    save_fit(fit_scaling_law(grid_points(), resamples=20, sources=["runs.csv"]), str(path))
    return json.loads(path.read_text())


def test_a_fifo_given_to_plan_fit_is_refused_without_opening_it(cli, tmp_path: Path) -> None:
    fifo = tmp_path / "runs.csv"
    os.mkfifo(fifo)
    with within(20):
        r = cli("plan", "fit", str(fifo), "--bootstrap", "20")
    assert r.code == 2
    assert f"{fifo} is a FIFO (named pipe), not a file: give a CSV file" in one_line(r.err)


def test_a_fifo_given_as_a_saved_fit_is_refused_without_opening_it(cli, tmp_path: Path) -> None:
    fifo = tmp_path / "fit.json"
    os.mkfifo(fifo)
    with within(20):
        r = cli("plan", "--budget-flops", "1e21", "--fit", str(fifo))
    assert r.code == 2
    assert f"{fifo} is a FIFO (named pipe), not a file: give a saved scaling-law fit" in one_line(
        r.err
    )


def test_a_fifo_as_a_runs_summary_is_refused(cli, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "summary.json")
    with within(20):
        r = cli("plan", "fit", str(tmp_path / "summary.json"))
    assert r.code == 2
    assert "summary.json is a FIFO (named pipe), not a file" in one_line(r.err)


def test_a_csv_cell_over_128_kib_is_one_line_naming_the_line(cli, tmp_path: Path) -> None:
    csv = write_csv(tmp_path / "runs.csv", grid_points())
    csv.write_text(csv.read_text() + "r99,1e8," + "1" * 200_000 + ",3.0\n")
    r = cli("plan", "fit", str(csv))
    assert r.code == 2
    assert f"{csv} line 32: a cell longer than 128 KiB" in one_line(r.err)


def test_a_runs_summary_nested_100000_deep_is_one_line(cli, tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("[" * DEEP + "]" * DEEP)
    r = cli("plan", "fit", str(run))
    assert r.code == 2
    assert f"{run / 'summary.json'}: JSON nested 100,000 deep; the most read is 64" in one_line(
        r.err
    )


def test_a_saved_fit_nested_100000_deep_is_one_line(cli, tmp_path: Path) -> None:
    path = tmp_path / "fit.json"
    path.write_text('{"format": ' + "[" * DEEP + "]" * DEEP + "}")
    r = cli("plan", "--budget-flops", "1e21", "--fit", str(path))
    assert r.code == 2
    assert f"{path}: JSON nested 100,001 deep; the most read is 64" in one_line(r.err)


def test_a_400_digit_parameter_count_is_out_of_range(cli, tmp_path: Path) -> None:
    for i, p in enumerate(grid_points()):
        write_run(tmp_path / f"r{i:02d}", p.params, p.tokens, p.loss)
    summary = tmp_path / "r00" / "summary.json"
    summary.write_text(
        summary.read_text().replace('"parameters": 10000000.0', '"parameters": ' + "9" * 400)
    )
    r = cli("plan", "fit", str(tmp_path))
    assert r.code == 2
    line = one_line(r.err)
    assert f"run {tmp_path / 'r00'}: parameters must be a finite number > 0, got 999" in line
    assert "(400 characters); the range allowed: 1 to 1e+15" in line


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        (("constants", "alpha"), 1e-300, "constants.alpha must be a finite number from 0.001 to 5"),
        (
            ("constants", "B"),
            1e300,
            "constants.B must be a finite number > 0, got 1e+300; the "
            "range allowed: > 0, at most 1e+100",
        ),
        (
            ("bootstrap", "samples", 3, 4),
            1e-300,
            "bootstrap.samples[3].beta must be a finite number",
        ),
    ],
)
def test_a_saved_fit_with_a_constant_out_of_range_is_one_line(
    cli, tmp_path: Path, saved: dict, field: tuple, value: float, words: str
) -> None:
    data = json.loads(json.dumps(saved))
    *parents, last = field
    holder = data
    for key in parents:
        holder = holder[key]
    holder[last] = value
    path = tmp_path / "fit.json"
    path.write_text(json.dumps(data))
    r = cli("plan", "--budget-flops", "1e21", "--fit", str(path))
    assert r.code == 2
    assert f"{path}: {words}" in one_line(r.err)


def test_bootstrap_is_bounded_before_any_work(cli, tmp_path: Path) -> None:
    csv = write_csv(tmp_path / "runs.csv", grid_points())
    r = cli("plan", "fit", str(csv), "--bootstrap", "1000000000000")
    assert r.code == 2
    assert (
        "argument --bootstrap: bootstrap must be at least 20 resamples and at most 100,000, a "
        "whole number (the fit's time grows with runs x resamples), got '1000000000000'"
    ) in r.err
    assert "Traceback" not in r.err


def test_a_fit_tells_its_progress_on_stderr(cli, tmp_path: Path) -> None:
    csv = write_csv(tmp_path / "runs.csv", grid_points())
    r = cli("plan", "fit", str(csv), "--bootstrap", "20")
    assert r.code == 0, r.err
    lines = r.err.splitlines()
    assert lines[0] == "thrifty plan fit: fitting 30 runs from 4,500 starts"
    assert lines[1] == "thrifty plan fit: bootstrap: 20 resamples of 30 runs"
    told = [line.split(" resamples")[0] for line in lines[2:]]
    assert told == [f"thrifty plan fit: bootstrap: {k}/20" for k in range(2, 21, 2)]


def test_the_default_bootstrap_is_1000_resamples() -> None:
    # 200 left a 95% interval's ends 10-20% off a 1,000-resample run's on the published runs
    # (docs/planner.md, "Cost and resamples"): the default is the run the tails are judged by
    from thrifty.cli import build_parser
    from thrifty.plan import lawfit

    args = build_parser().parse_args(["plan", "fit", "runs.csv"])
    assert args.bootstrap == lawfit.DEFAULT_RESAMPLES == 1000


def test_a_law_whose_optimum_underflows_is_one_line_in_python(tmp_path: Path, saved: dict) -> None:
    import dataclasses

    from thrifty.errors import ConfigError
    from thrifty.plan.chinchilla import LossFit
    from thrifty.plan.lawfile import load_fit
    from thrifty.plan.lawpredict import predict

    path = tmp_path / "fit.json"
    path.write_text(json.dumps(saved))
    fit = load_fit(str(path))
    tiny = dataclasses.replace(fit, law=LossFit(1.8, 482.0, 2085.0, 1e-300, 0.37, source="x"))
    with pytest.raises(ConfigError, match="the fitted law's optimum for 1e\\+21 FLOPs is out of"):
        predict(tiny, 1e21)
