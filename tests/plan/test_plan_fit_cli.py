"""`thrifty plan fit` and `thrifty plan --fit FILE`, run in-process: tables, saved fits, the
extrapolation warning and every kind of bad input as one line with exit code 2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import thrifty.cli
from plan.test_lawfit import (  # tests/ is on the path: tests/plan is `plan`
    grid_points,
    isoflop_points,
    write_run,
)
from thrifty.plan.lawfile import save_fit
from thrifty.plan.lawfit import fit_scaling_law
from thrifty.plan.lawpoints import Point


def write_csv(path: Path, points: list[Point]) -> Path:
    lines = ["run,params,tokens,loss"]
    lines += [f"r{i},{p.params:.6g},{p.tokens:.6g},{p.loss:.6f}" for i, p in enumerate(points)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fit of the synthetic grid saved as the folder's scaling-fit.json."""
    path = tmp_path_factory.mktemp("fit") / "scaling-fit.json"
    save_fit(fit_scaling_law(grid_points(), resamples=40, sources=["runs.csv"]), str(path))
    return path


def test_plan_fit_prints_the_constants_and_the_allocation_beside_the_published_fits(
    cli, tmp_path: Path
) -> None:
    csv = write_csv(tmp_path / "runs.csv", grid_points())
    out = tmp_path / "fit.json"
    r = cli(
        "plan", "fit", str(csv), "--bootstrap", "20", "--budget-flops", "1e21", "--out", str(out)
    )
    assert r.code == 0, r.err
    for text in (
        "Fitted L(N, D) = E + A/N^alpha + B/D^beta (30 runs)",
        "95% interval",
        "alpha",
        "a: N* ~ C^a",
        "runs: 30 (N 10M to 1B, D 100M to 100B",
        "approach 2: not available",
        "Compute-optimal allocation for 1e+21 FLOPs",
        "fitted (chosen)",
        "hoffmann",
        "tokens-per-param",
        "reach: N* is",
        "C is 1.67x the largest fitted budget (6e+20)",
    ):
        assert text in r.out, text
    assert "warning" not in r.out
    assert f"saved the fit to {out}" in r.err
    data = json.loads(out.read_text())
    assert data["points"]["count"] == 30 and data["sources"] == [str(csv)]

    plan = cli("plan", "--budget-flops", "1e21", "--fit", str(out))
    assert plan.code == 0, plan.err
    assert "fit.json (chosen)" in plan.out and "reach: N* is" in plan.out
    assert f"fit: saved fit {out} (30 runs from {csv})" in plan.out
    fitted = cli("plan", "--budget-flops", "1e21", "--fit", str(out), "--json").json()
    again = cli("plan", "fit", str(csv), "--bootstrap", "20", "--budget-flops", "1e21", "--json")
    assert fitted["chinchilla"]["params"] == again.json()["chinchilla"]["params"]
    assert fitted["chinchilla"]["intervals"] == again.json()["chinchilla"]["intervals"]


def test_plan_fit_on_isoflop_runs_compares_approach_2_with_approach_3(cli, tmp_path) -> None:
    csv = write_csv(tmp_path / "iso.csv", isoflop_points())
    r = cli("plan", "fit", str(csv), "--bootstrap", "20")
    assert r.code == 0, r.err
    assert "approach 2: IsoFLOP minima of 4 groups give N* ~ C^0.51" in r.out
    assert "they agree" in r.out


def test_a_folder_with_a_saved_fit_is_used_by_plan(cli, saved: Path) -> None:
    data = cli("plan", "--budget-flops", "1e21", "--fit", str(saved.parent), "--json").json()
    chosen = data["chinchilla"]
    assert chosen["fit"] == f"{saved.parent.name}/scaling-fit.json (chosen)"
    assert chosen["source"] == f"saved fit {saved}"
    assert chosen["intervals"]["params"][0] < chosen["params"] < chosen["intervals"]["params"][1]
    assert [o["fit"] for o in chosen["other_fits"]] == ["epoch", "hoffmann", "tokens-per-param"]


def test_a_folder_of_runs_is_fitted_on_the_fly(cli, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("thrifty.plan.lawfit.DEFAULT_RESAMPLES", 20)
    for i, p in enumerate(grid_points()[::2]):
        write_run(tmp_path / "runs" / f"{i:02d}", p.params, p.tokens, p.loss)
    r = cli("plan", "--budget-flops", "1e20", "--fit", str(tmp_path / "runs"))
    assert r.code == 0, r.err
    assert "runs/ (fitted now) (chosen)" in r.out and "fit: fitted now (15 runs from" in r.out


def test_the_warning_appears_beyond_100x_of_the_fitted_range_only(cli, saved: Path) -> None:
    far = cli("plan", "--budget-flops", "1e24", "--fit", str(saved))
    assert far.code == 0, far.err
    warnings = [line for line in far.out.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "beyond 100x of the fitted range (C 1,667x" in warnings[0]
    near = cli("plan", "--budget-flops", "5e22", "--fit", str(saved))  # 83x the largest budget
    assert near.code == 0 and "warning" not in near.out and "C is 83.3x" in near.out


def test_the_named_fits_print_as_before(cli) -> None:
    r = cli("plan", "--budget-flops", "5.88e23", "--fit", "hoffmann")
    assert r.code == 0 and "hoffmann (chosen)" in r.out and "reach" not in r.out


def test_budget_options_given_before_fit_are_kept() -> None:
    parser = thrifty.cli.build_parser()
    args = parser.parse_args(["plan", "--budget-flops", "1e21", "fit", "runs.csv"])
    assert args.budget_flops == 1e21 and args.paths == ["runs.csv"]
    assert args.handler.__name__ == "_run_fit"
    args = parser.parse_args(["plan", "fit", "runs.csv", "--budget-dollars", "5k"])
    assert args.budget_dollars == 5000 and args.budget_flops is None and args.bootstrap == 1000


def _csv(tmp_path: Path, text: str) -> str:
    path = tmp_path / "points.csv"
    path.write_text(text)
    return str(path)


def _rows(pairs: list[tuple[float, float]], loss: str = "3.0") -> str:
    return "params,tokens,loss\n" + "".join(f"{n:g},{d:g},{loss}\n" for n, d in pairs)


FIVE = [(1e7, 1e9), (3e7, 2e9), (1e8, 4e9), (3e8, 8e9), (1e9, 1.6e10)]


def _varied(text: str) -> str:
    """Loss varied so that only the one thing a case breaks is wrong."""
    rng = random.Random(0)
    return "\n".join(
        line.replace(",3.0", f",{3 + rng.random():.3f}") if i else line
        for i, line in enumerate(text.splitlines())
    )


BAD_CSV = [
    (_rows(FIVE[:4]), "4 point(s); a fit of the 5 constants E, A, B, alpha, beta needs at least 5"),
    (
        _varied(_rows([(1e8, d) for _, d in FIVE])),
        "every point has the same parameter count (1e+08): alpha cannot be fitted; add runs of "
        "other sizes",
    ),
    (
        _varied(_rows([(n, 1e9) for n, _ in FIVE])),
        "every point has the same token count (1e+09): beta cannot be fitted",
    ),
    (_rows(FIVE, loss="0"), "line 2: loss must be a finite number > 0, got '0'"),
    (_rows(FIVE, loss="nan"), "line 2: loss must be a finite number > 0, got 'nan'"),
    (_rows(FIVE, loss="inf"), "got 'inf'"),
    ("params,tokens,loss\n-1e7,1e9,3\n", "line 2: params must be a finite number > 0, got '-1e7'"),
    ("params,tokens,loss\n1e7,lots,3\n", "line 2: tokens 'lots' is not a number"),
    ("params,tokens,loss\n1e7,,3\n", "line 2: tokens is missing"),
    (
        "n,d,loss\n1e7,1e9,3\n",
        "the header lacks the columns params, tokens; found 'n,d,loss' on line 1",
    ),
    ("", "empty; a CSV of points starts with the header params,tokens,loss"),
]


@pytest.mark.parametrize(("content", "message"), BAD_CSV)
def test_bad_points_are_one_line_with_exit_code_2(cli, tmp_path, content, message) -> None:
    r = cli("plan", "fit", _csv(tmp_path, content))
    assert r.code == 2
    assert r.err.startswith("thrifty: error: ") and r.err.count("\n") == 1, r.err
    assert message in r.err and "Traceback" not in r.err + r.out


def test_bad_paths_and_options_are_one_line_with_exit_code_2(cli, tmp_path) -> None:
    write_run(tmp_path / "runs" / "a", 1e7, 1e9, None)
    (tmp_path / "empty").mkdir()
    good = _csv(tmp_path, _varied(_rows(FIVE)))
    other = tmp_path / "notes.json"
    other.write_text('{"mine": 1}')
    cases = [
        (
            ["plan", "fit", str(tmp_path / "runs")],
            f"run {tmp_path / 'runs' / 'a'} has no validation",
        ),
        (["plan", "fit", str(tmp_path / "nowhere")], f"no such file or folder: {tmp_path}/nowhere"),
        (["plan", "fit", str(tmp_path / "empty")], "no runs found; a finished run's directory"),
        (["plan", "fit", good, "--bootstrap", "5"], "bootstrap must be at least 20 resamples"),
        (["plan", "fit", good, "--seed=-1"], "seed must be a whole number from 0"),
        (["plan", "fit", good, "--out", str(other)], "is not a scaling-law fit thrifty wrote"),
        (["plan", "fit", good, "--out", str(tmp_path)], "is a folder: give a file name"),
        (["plan", "fit", good, "--budget-dollars", "5k"], "needs an instance to price it"),
        (["plan", "fit"], "the following arguments are required: PATH"),
        (["plan", "--budget-flops", "1e21", "--fit", "nowhere.json"], "no such file or folder"),
        (["plan", "--budget-flops", "1e21", "--fit", str(other)], "is not a saved scaling-law"),
    ]
    for argv, message in cases:
        r = cli(*argv)
        assert r.code == 2, (argv, r.err)
        assert r.err.startswith("thrifty: error: ") and r.err.count("\n") == 1, r.err
        assert message in r.err and "Traceback" not in r.err + r.out, (argv, r.err)
    assert other.read_text() == '{"mine": 1}'
