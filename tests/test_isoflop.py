"""`thrifty plan isoflop`: an IsoFLOP grid laid out from the model as built (parameters counted,
tokens per step read from the data), run as a sweep whose trials are exactly the grid's runs,
once each even when the command runs again, and read back by `thrifty plan fit`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tomli_w

from thrifty import cli
from thrifty.demo import DEMO_CONFIG, build_model
from thrifty.errors import ConfigError
from thrifty.plan.lawpoints import read_points
from thrifty.search.sweep.isoflop import MIN_STEPS, layout, parse_sizes

TESTS = Path(__file__).resolve().parent
KEY = "task.model_args.n_embd"
# The demo GPT on text made by byte_task (not the demo's, read from the standard library).
CONFIG = {
    **DEMO_CONFIG,
    "run": {"device": "cpu", "seed": 0, "log_every": 5, "progress": "off"},
    "precision": {"mode": "fp32"},
    "batch": {"micro": 4, "effective": 4},
    "data": {"num_workers": 0},
    "eval": {"every": 1000, "batches": 2, "micro": 8},
    "measure": {"breakdown": False, "system": False},
    "task": {
        **DEMO_CONFIG["task"],
        "train_data": "byte_task:train_data",
        "val_data": "byte_task:val_data",
        "model_args": {"n_layer": 1, "n_head": 1, "n_embd": 8, "block_size": 16},
        "data_args": {"block_size": 16, "max_bytes": 40_000},
    },
}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(CONFIG))
    return path


def test_the_grid_counts_parameters_by_building_the_model_and_spends_each_budget(config):
    runs = layout(config, KEY, [8, 12, 16], [2e8, 6e8])
    assert len(runs) == 6
    for run in runs:
        model_args = {**CONFIG["task"]["model_args"], "n_embd": run.size}
        built = sum(p.numel() for p in build_model(**model_args).parameters())
        assert run.params == built
        assert run.tokens_per_step == 4 * 16  # the effective batch times a sample's input_ids
        assert 6 * run.params * run.tokens == pytest.approx(run.flops, rel=0.5 / run.steps + 1e-9)
    small, large = runs[0], runs[2]  # one budget: the larger model trains on fewer tokens
    assert small.flops == large.flops and small.tokens > large.tokens


@pytest.mark.parametrize(
    ("size", "flops", "words"),
    [
        ("task.model_args.n_embd=8,12", [1e9], "give at least 3 different sizes"),
        ("task.model_args.width=8,12,16", [1e9], "the config does not set task.model_args.width"),
        ("task.model_args.n_embd=8,x,16", [1e9], "'x' is not a number"),
        ("n_embd", [1e9], "is not KEY=V1,V2,..."),
        ("task.model_args.n_embd=8,12,16", [1e6], f"the least is {MIN_STEPS}"),
        ("task.model_args.n_embd=8,12,16", [-1.0], "FLOP budgets above 0"),
    ],
)
def test_a_grid_that_cannot_be_laid_out_is_one_line(config, size, flops, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        key, sizes = parse_sizes(size)
        layout(config, key, sizes, flops)


# The grid the command runs: its runs train 11 to 51 steps (the least is MIN_STEPS, 10).
FLOPS = [5e7, 1e8]


def isoflop(capsys, config: Path, out: Path, *extra: str) -> tuple[int, str]:
    """The command run here (its runs are processes of their own): its exit code and stderr."""
    argv = ["plan", "isoflop", str(config)]
    argv += ["--size", f"{KEY}=8,12,16", "--flops", ",".join(f"{c:g}" for c in FLOPS)]
    argv += ["--out", str(out), *extra]
    code = cli.main(argv)
    return code, capsys.readouterr().err


def test_the_grid_runs_as_a_sweep_once_and_plan_fit_reads_its_runs(
    config, tmp_path, capsys, monkeypatch
):
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the runs import byte_task
    out = tmp_path / "grid 'one'"
    code, err = isoflop(capsys, config, out, "--workers", "2")
    assert code == 0, err
    assert "thrifty plan fit " in err
    expected = {(r.size, r.steps) for r in layout(config, KEY, [8, 12, 16], FLOPS)}
    record = json.loads((out / "sweep.json").read_text())
    ran = {(t["params"][KEY], t["params"]["run.max_steps"]) for t in record["trials"]}
    assert ran == expected and len(record["trials"]) == 6
    assert all(t["state"] == "complete" for t in record["trials"])
    # Every run trained the steps and the size its point was laid out for.
    points = read_points([str(out)]).points
    by_steps = {steps: size for size, steps in expected}
    assert len(points) == 6
    for p in points:
        steps = p.tokens / (4 * 16)
        assert steps in by_steps
        model_args = {**CONFIG["task"]["model_args"], "n_embd": by_steps[int(steps)]}
        assert p.params == sum(q.numel() for q in build_model(**model_args).parameters())
    # The same command again runs nothing more: the grid's points were queued once.
    code, err = isoflop(capsys, config, out)
    assert code == 0, err
    assert len(json.loads((out / "sweep.json").read_text())["trials"]) == 6
    assert len(list((out / "trials").iterdir())) == 6
