from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from thrifty.cli import main

REPO = Path(__file__).resolve().parents[1]

BAD_MODULE = """
import torch
from torch import nn

class Logits(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2)
    def forward(self, x, y):
        return self.lin(x)

def model():
    return Logits()

def data():
    return torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 2))
"""


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def user_project(tmp_path, monkeypatch):
    (tmp_path / "userproj.py").write_text(BAD_MODULE)
    config = tmp_path / "job.toml"
    config.write_text(
        '[run]\nmax_steps = 2\nprogress = "off"\n[batch]\nmicro = 4\n[data]\nnum_workers = 0\n'
        '[schedule]\ndecay = "constant"\n[task]\nmodel = "userproj:model"\ntrain_data = "userproj:data"\n'
    )
    monkeypatch.chdir(tmp_path)
    return config


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "batch.micro=abc"], "batch.micro = 'abc' is invalid: expected an integer"),
        (["--set", "batch.micro=0"], "batch.micro = 0 is invalid: must be greater than 0"),
        (
            ["--set", "batch.effective=6"],
            "batch.effective = 6 is invalid: must be a multiple of batch.micro = 4",
        ),
        (
            ["--set", "optimizer.learning_rate=1"],
            "unknown key optimizer.learning_rate in optimizer",
        ),
        (
            ["--set", "task.model=missing_module:build"],
            "task.model = 'missing_module:build' does not import",
        ),
        (["--set", "task.model=userproj:nothing"], "userproj has no attribute 'nothing'"),
        ([], "the model returned a tensor of shape (4, 2), not a loss"),
        (["--set", "nonsense"], "--set 'nonsense' is invalid: use --set section.key=value"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, user_project, tmp_path, args, message):
    code, out, err = run_cli(
        capsys, "train", str(user_project), "--out", str(tmp_path / "r"), *args
    )
    assert code == 2
    assert err.startswith("thrifty: error: ") and message in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_key_in_the_file_is_an_error(capsys, user_project, tmp_path):
    user_project.write_text(user_project.read_text() + "[early_stopping]\npatiense = 3\n")
    code, _, err = run_cli(capsys, "train", str(user_project))
    assert code == 2 and "did you mean early_stopping.patience?" in err


def test_missing_config_file(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", str(tmp_path / "nope.toml"))
    assert code == 2 and "cannot read config" in err and "nope.toml" in err


def test_bad_input_prints_no_traceback_from_the_real_command(user_project, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "thrifty", "train", str(user_project), "--set", "batch.micro=-1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip() == "thrifty: error: batch.micro = -1 is invalid: must be greater than 0"
    )


def test_demo_trains_and_writes_its_run_directory(capsys, tmp_path):
    out = tmp_path / "demo"
    code, stdout, _ = run_cli(
        capsys,
        "demo",
        "--steps",
        "6",
        "--out",
        str(out),
        "--set",
        "eval.batches=2",
        "--set",
        "data.num_workers=0",
        "--set",
        "schedule.warmup_steps=2",
    )
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["stop_reason"] == "max_steps"
    assert summary["final_val_loss"] < summary["initial_val_loss"] - 0.3
    # The MFU is reproducible from what the summary says it was measured against.
    basis = summary["mfu_basis"]
    assert basis["peak_flops_per_second"] == 1e12 and "THRIFTY_PEAK_TFLOPS" in basis["peak_source"]
    assert summary["mfu"] == pytest.approx(
        basis["flops_per_step"] / summary["step_seconds"] / basis["peak_flops_per_second"]
    )
    assert "thrifty run summary" in stdout
    assert (out / "config.toml").exists() and (out / "metrics.jsonl").exists()


@pytest.mark.parametrize("example", ["demo.toml", "mlp.toml"])
def test_examples_run(capsys, tmp_path, monkeypatch, example):
    monkeypatch.chdir(REPO)
    code, _, err = run_cli(
        capsys,
        "train",
        f"examples/{example}",
        "--steps",
        "3",
        "--out",
        str(tmp_path / example),
        "--set",
        "eval.batches=2",
        "--set",
        "data.num_workers=0",
    )
    assert code == 0, err
    assert json.loads((tmp_path / example / "summary.json").read_text())["steps"] == 3


def test_importing_thrifty_stays_cheap():
    code = "import sys, thrifty, thrifty.cli; thrifty.cli.build_parser(); print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip() == "False", proc.stderr


LOADS_TORCH = """
import gc, json, sys
from thrifty.lazy import load_torch

def state():
    return ["torch" in sys.modules, "torch._dynamo" in sys.modules, gc.get_freeze_count()]

load_torch(compiler=False)
launcher = state()
load_torch()
print(json.dumps([launcher, state()]))
"""


def test_a_process_that_trains_imports_torch_and_its_compiler_frozen_a_launcher_only_torch():
    proc = subprocess.run(
        [sys.executable, "-c", LOADS_TORCH], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    launcher, trainer = json.loads(proc.stdout)
    assert launcher[:2] == [True, False] and trainer[:2] == [True, True]
    # Frozen: the collector never walks what the imports built (about a million objects).
    assert launcher[2] > 100_000 and trainer[2] > launcher[2]


@pytest.mark.parametrize("nprocs, launches", [(None, False), (1, False), (2, True)])
def test_only_a_command_that_trains_here_loads_the_compiler(
    monkeypatch, tmp_path, nprocs, launches
):
    from thrifty.commands import training
    from thrifty.config import load_config
    from thrifty.records.stop_signals import stopping

    calls = []
    monkeypatch.setattr(training, "load_torch", lambda: calls.append("load_torch"))
    monkeypatch.setattr(training, "_launch", lambda args, config: calls.append("launch") or 0)
    monkeypatch.setattr(
        training, "_train", lambda config, stops, callbacks: calls.append("train") or 0
    )
    args = argparse.Namespace(nprocs=nprocs, argv=["train", "job.toml"], callbacks=())
    monkeypatch.chdir(tmp_path)  # its run directory, runs/run, is looked at for a lock
    with stopping() as stops:
        assert training._run(args, load_config(None, [("run.max_steps", "1")]), stops) == 0
    assert calls == (["launch"] if launches else ["load_torch", "train"])


def test_a_run_starts_again_from_its_saved_config_toml(capsys, tmp_path, monkeypatch):
    from thrifty.config import load_config

    monkeypatch.chdir(REPO)
    first, second = tmp_path / "first", tmp_path / "second"
    quick = ["--steps", "2", "--set", "eval.batches=2"]
    code, _, err = run_cli(capsys, "train", "examples/mlp.toml", "--out", str(first), *quick)
    assert code == 0, err
    saved = first / "config.toml"
    expected = [("run.out", str(first)), ("run.max_steps", 2), ("eval.batches", 2)]
    assert load_config(saved) == load_config("examples/mlp.toml", expected)
    code, _, err = run_cli(capsys, "train", str(saved), "--out", str(second))
    assert code == 0, err
    assert json.loads((second / "summary.json").read_text())["steps"] == 2


def test_allow_config_change_flag_sets_the_run_setting(user_project):
    from thrifty.cli import build_parser
    from thrifty.commands.training import _overrides
    from thrifty.config import load_config

    args = build_parser().parse_args(["train", str(user_project), "--allow-config-change"])
    assert load_config(args.config, _overrides(args)).run.allow_config_change is True
    args = build_parser().parse_args(["train", str(user_project)])
    assert load_config(args.config, _overrides(args)).run.allow_config_change is False


def test_error_lines_never_show_credentials(capsys, user_project):
    code, _, err = run_cli(
        capsys,
        "train",
        str(user_project),
        "--set",
        "checkpoint.every=s3://AKIAIOSFODNN7EXAMPLE:hunter2@b",
    )
    assert code == 2
    assert err.startswith("thrifty: error: checkpoint.every = 's3://b' is invalid")
    assert "hunter2" not in err and "AKIAIOSFODNN7EXAMPLE" not in err


def test_a_run_folder_named_with_a_newline_and_markup_prints_as_named_one_line_each(tmp_path):
    # A newline in the name once split "checkpoint step 1 written to ..." in two, its second
    # half a line of its own ("fake: line"); "[/]" made the summary table raise MarkupError
    # after the run had finished, and "[red]" vanished from the path shown.
    out = tmp_path / "a[/]b[red]c\nfake: line\x1b[2J"
    proc = subprocess.run(
        [sys.executable, "-m", "thrifty", "train", str(REPO / "examples" / "mlp.toml")]
        + ["--steps", "2", "--out", str(out), "--set", "data.num_workers=0"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "COLUMNS": "400"},  # the summary's cell unwrapped
    )
    assert proc.returncode == 0, proc.stderr
    lines = (proc.stdout + proc.stderr).splitlines()
    assert not [line for line in lines if line.startswith("fake")]
    assert "\x1b" not in proc.stdout + proc.stderr
    shown = str(out).replace("\n", "\\n").replace("\x1b", "\\x1b")
    assert f"thrifty: checkpoint step 2 written to {shown}/checkpoints" in lines
    assert any(shown in line for line in lines if line.startswith("│ run directory"))
    assert (out / "summary.json").is_file()  # the folder itself is named as given
