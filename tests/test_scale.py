"""`thrifty scale`: the same job at several process counts with the same global batch; measured
scaling efficiency beside the planner's prediction."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from thrifty import cli
from thrifty.children import first_error_line
from thrifty.commands import scale
from thrifty.errors import ConfigError, ThriftyError
from thrifty.measure.bandwidth import bus_gbs, measure_bus_bandwidth
from thrifty.plan.scaling import scaling

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
[run]
name = "tiny"
max_steps = 5
device = "cpu"

[batch]
micro = 4
{effective}
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(CONFIG.format(effective="effective = 8"))
    return path


def parse(*argv: str):
    parser = cli._Parser(prog="thrifty")
    scale.register(parser.add_subparsers(parser_class=cli._Parser))
    return parser.parse_args(["scale", *argv])


def summary(n: int, rate: float, step_seconds: float, params: int = 50_000, batch: int = 8):
    """What `thrifty train --nprocs n` leaves in summary.json (the keys scale reads)."""
    return {
        "tokens_per_second": 0.0,
        "samples_per_second": rate,
        "step_seconds": step_seconds,
        "parameters": params,
        "world_size": n,
        "strategy": "single" if n == 1 else "ddp",
        "effective_batch": batch,
        "accumulation_steps": batch // (4 * n),
        "steps": 5,
    }


def fake_runner(rates: dict[int, float], step_seconds: dict[int, float], **kw):
    calls = []

    def run(n: int):
        calls.append(n)
        return summary(n, rates[n], step_seconds[n], **kw)

    run.calls = calls  # type: ignore[attr-defined]
    return run


@pytest.fixture
def with_scale_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """`thrifty scale` through cli.main, whether or not cli.py lists it yet."""
    if "thrifty.commands.scale" not in cli.COMMAND_MODULES:
        monkeypatch.setattr(
            cli, "COMMAND_MODULES", (*cli.COMMAND_MODULES, "thrifty.commands.scale")
        )


def table_rows(out: str) -> list[list[str]]:
    """The table's rows: processes first, then speed-up (1.80x) and efficiency (90%)."""
    rows = (line.split() for line in out.splitlines())
    return [r for r in rows if len(r) > 8 and r[0].isdigit() and r[6].endswith("x")]


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("thrifty: error: ")
    return err


# --------------------------------------------------------------------------------------------
# Efficiency and the report


def test_efficiency_is_throughput_against_n_times_the_smallest_count(config, tmp_path, capsys):
    runner = fake_runner({1: 100.0, 2: 180.0}, {1: 0.08, 2: 0.0445})
    args = parse(str(config), "--nprocs", "2,1", "--out", str(tmp_path / "out"), "--json")
    assert scale.run_scale(args, runner=runner, bus_meter=lambda n, nbytes, backend: 5.0) == 0
    assert runner.calls == [1, 2]  # smallest first: it is the baseline
    report = json.loads(capsys.readouterr().out)
    one, two = report["counts"]
    assert (one["speedup"], one["efficiency"]) == (1.0, 1.0)
    assert two["speedup"] == pytest.approx(1.8)
    assert two["efficiency"] == pytest.approx(0.90)
    assert report["unit"] == "samples/s"
    assert json.loads((tmp_path / "out" / "scale.json").read_text()) == report


def test_efficiency_is_relative_to_the_smallest_count_when_it_is_not_one(config, tmp_path, capsys):
    runner = fake_runner({2: 200.0, 4: 300.0}, {2: 0.04, 4: 0.027}, batch=16)
    args = parse(str(config), "--nprocs", "2,4", "--out", str(tmp_path / "o"), "--bus-gbs", "5")
    args.overrides, args.json = ["batch.effective=16"], True
    scale.run_scale(args, runner=runner)
    two, four = json.loads(capsys.readouterr().out)["counts"]
    assert four["efficiency"] == pytest.approx(300 / (2 * 200))
    assert two["predicted_efficiency_no_overlap"] == 1.0  # the baseline predicts itself


def test_prediction_is_the_planners_for_the_same_setup(config, tmp_path, capsys):
    # 1M parameters, 100 ms per step on one process, 1 GB/s: two processes each compute 50 ms
    # and all-reduce 4 MB in 2 × (1/2) × 4e6 / 1e9 = 4 ms.
    runner = fake_runner({1: 100.0, 2: 150.0}, {1: 0.1, 2: 0.07}, params=1_000_000)
    args = parse(str(config), "--nprocs", "1,2", "--out", str(tmp_path / "o"), "--bus-gbs", "1")
    args.json = True
    scale.run_scale(args, runner=runner)
    report = json.loads(capsys.readouterr().out)
    two = report["counts"][1]
    planner = scaling(1_000_000, gpus_per_node=2, compute_seconds=0.05, intra_node_gbs=1.0)
    assert two["predicted_efficiency_no_overlap"] == pytest.approx(0.05 / 0.054)
    assert two["predicted_efficiency_no_overlap"] == pytest.approx(planner.efficiency_no_overlap)
    assert two["predicted_efficiency_overlap"] == pytest.approx(planner.efficiency_overlap)
    assert two["predicted_allreduce_seconds"] == pytest.approx(0.004)
    # gloo on CPU: the all-reduce competes with backward for the cores, so no overlap applies.
    assert report["prediction_applies"] == "no_overlap"
    assert two["predicted_efficiency"] == two["predicted_efficiency_no_overlap"]
    assert report["bus_source"] == "--bus-gbs"


def test_report_table_shows_every_count_and_one_conclusion(config, tmp_path, capsys):
    runner = fake_runner({1: 100.0, 2: 180.0}, {1: 0.08, 2: 0.0445})
    args = parse(str(config), "--nprocs", "1,2", "--out", str(tmp_path / "o"), "--bus-gbs", "2")
    scale.run_scale(args, runner=runner)
    out = capsys.readouterr().out
    rows = table_rows(out)
    assert [r[0] for r in rows] == ["1", "2"]
    assert rows[1][5:8] == ["180", "1.80x", "90%"]  # samples/s, speedup, efficiency
    assert "OMP_NUM_THREADS" in out and "bus bandwidth: --bus-gbs" in out
    assert out.strip().splitlines()[-1].startswith("2 processes give 1.80x the samples/s of 1")


def test_a_run_that_did_not_use_nprocs_processes_is_refused(config, tmp_path):
    def wrong(n: int):
        return {**summary(n, 100.0, 0.1), "world_size": 1}

    args = parse(str(config), "--nprocs", "1,2", "--out", str(tmp_path / "o"), "--bus-gbs", "1")
    with pytest.raises(ThriftyError, match="world size 1, not 2"):
        scale.run_scale(args, runner=wrong)


# --------------------------------------------------------------------------------------------
# What each child runs


def record_launches(tmp_path: Path, exit_code: int = 0):
    launches = []

    def launch(command, env, log):
        launches.append((list(command), dict(env)))
        n = int(command[command.index("--nprocs") + 1])
        if exit_code:
            log.write_text("starting\nthrifty: error: batch.micro = 0 is invalid\nTraceback\n")
            return exit_code
        run_dir = Path(command[command.index("--out") + 1])
        (run_dir / "summary.json").write_text(json.dumps(summary(n, 100.0 * n, 0.1 / n)))
        return 0

    launch.launches = launches  # type: ignore[attr-defined]
    return launch


def sets(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1] for i, arg in enumerate(command) if arg == "--set"]
    return dict(p.split("=", 1) for p in pairs)  # a later --set wins, as in thrifty train


def test_every_child_runs_the_same_global_batch(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    path = tmp_path / "job.toml"
    path.write_text(CONFIG.format(effective=""))  # no batch.effective: micro × lcm(counts)
    args = parse(str(path), "--nprocs", "1,2,4", "--out", str(tmp_path / "o"), "--steps", "7")
    args.overrides = ["optimizer.lr=0.01"]
    plan = scale.make_plan(args)
    launch = record_launches(tmp_path)
    runner = scale.ChildRunner(plan, launch)
    for n in plan.counts:
        runner(n)
    commands = [command for command, _ in launch.launches]
    assert [c[c.index("--nprocs") + 1] for c in commands] == ["1", "2", "4"]
    for n, command in zip(plan.counts, commands, strict=True):
        assert command[:5] == [sys.executable, "-m", "thrifty", "train", str(path)]
        assert command[command.index("--steps") + 1] == "7"
        assert command[command.index("--out") + 1] == str(tmp_path / "o" / f"nprocs-{n}")
        chosen = sets(command)
        assert chosen["batch.effective"] == "16"  # micro 4 × lcm(1, 2, 4), the same at every count
        assert chosen["optimizer.lr"] == "0.01"  # the user's --set passes through
        assert chosen["checkpoint.every"] == "off"
        assert chosen["spot.provider"] == "none"
        assert chosen["run.progress"] == "off"
        assert int(chosen["eval.every"]) > 7  # no validation inside the measured steps


def test_each_count_gets_its_share_of_the_cpus(config, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("thrifty.strategies.device.available_cpus", lambda: 8)
    args = parse(str(config), "--nprocs", "1,2,8", "--out", str(tmp_path / "o"))
    args.overrides = ["batch.effective=32"]
    plan = scale.make_plan(args)
    launch = record_launches(tmp_path)
    runner = scale.ChildRunner(plan, launch)
    for n in plan.counts:
        runner(n)
    assert [env["OMP_NUM_THREADS"] for _, env in launch.launches] == ["8", "4", "1"]
    assert [plan.threads(n) for n in (1, 2, 8, 16)] == [8, 4, 1, 1]


def test_omp_num_threads_you_set_is_kept(config, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    args = parse(str(config), "--nprocs", "1,2", "--out", str(tmp_path / "o"))
    plan = scale.make_plan(args)
    launch = record_launches(tmp_path)
    scale.ChildRunner(plan, launch)(2)
    assert launch.launches[0][1]["OMP_NUM_THREADS"] == "3"
    assert plan.threads(2) == 3


def test_a_failing_child_is_one_line_with_its_count_exit_code_and_log(config, tmp_path):
    args = parse(str(config), "--nprocs", "1,2", "--out", str(tmp_path / "o"))
    plan = scale.make_plan(args)
    runner = scale.ChildRunner(plan, record_launches(tmp_path, exit_code=2))
    with pytest.raises(ThriftyError) as raised:
        runner(2)
    message = str(raised.value)
    log = tmp_path / "o" / "nprocs-2" / "train.log"
    assert "\n" not in message
    assert "2 processes failed (exit 2): batch.micro = 0 is invalid" in message
    assert f"(log: {log})" in message


def test_the_first_error_of_several_ranks_is_the_one_shown(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(
        "thrifty: distributed: ddp over 2 processes\n"
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "run/trainer.py", line 1, in fit\n'
        "[rank1]: AttributeError: 'NoneType' object has no attribute 'write'\n"
        "thrifty: error: rank 0 lost contact with another rank\n"
    )
    assert first_error_line(log) == "AttributeError: 'NoneType' object has no attribute 'write'"


# --------------------------------------------------------------------------------------------
# Bad input: one line, exit 2


@pytest.mark.parametrize("nprocs", ["1,x", "0", "", "1,,2", "-1", "2.5"])
def test_bad_nprocs_is_one_line(nprocs, config, capsys, with_scale_command):
    err = one_line_error(capsys, ["scale", str(config), "--nprocs", nprocs])
    assert f"--nprocs {nprocs!r} is invalid" in err
    assert "e.g. --nprocs 1,2,4" in err
    with pytest.raises(ConfigError):
        scale.parse_nprocs(nprocs)


def test_nprocs_are_sorted_and_each_counted_once():
    assert scale.parse_nprocs(" 4,1, 2,2") == [1, 2, 4]


def test_an_effective_batch_a_count_cannot_split_is_one_line(config, capsys, with_scale_command):
    # effective 8 = micro 4 × 2: at 4 processes a step would need 16 samples.
    err = one_line_error(capsys, ["scale", str(config), "--nprocs", "1,2,4"])
    assert "batch.effective = 8 does not split into whole micro-batches at 4 processes" in err
    assert "--set batch.effective=16" in err
    with pytest.raises(ConfigError):
        scale.global_batch(4, 8, [1, 2, 4])
    assert scale.global_batch(4, None, [2, 3]) == 24  # micro × lcm: splits at both counts


def test_too_few_steps_and_a_bad_bandwidth_are_one_line(config, capsys, with_scale_command):
    assert "warm-up" in one_line_error(
        capsys, ["scale", str(config), "--nprocs", "1", "--steps", "1"]
    )
    err = one_line_error(capsys, ["scale", str(config), "--nprocs", "1,2", "--bus-gbs", "0"])
    assert "--bus-gbs 0 is invalid" in err


def test_existing_runs_are_refused_without_overwrite(config, tmp_path, capsys, with_scale_command):
    out = tmp_path / "out"
    (out / "nprocs-2").mkdir(parents=True)
    (out / "nprocs-2" / "train.log").write_text("an earlier run\n")
    (out / "notes.txt").write_text("the user's\n")
    err = one_line_error(capsys, ["scale", str(config), "--nprocs", "1,2", "--out", str(out)])
    assert "already holds nprocs-2" in err and "--overwrite" in err
    assert (out / "nprocs-2" / "train.log").exists()

    runner = fake_runner({1: 100.0, 2: 150.0}, {1: 0.1, 2: 0.07})
    args = parse(str(config), "--nprocs", "1,2", "--out", str(out), "--overwrite", "--bus-gbs", "1")
    scale.run_scale(args, runner=runner)
    assert not (out / "nprocs-2" / "train.log").exists()  # replaced
    assert (out / "notes.txt").read_text() == "the user's\n"  # not ours: left alone


def test_overwrite_never_deletes_a_directory_scale_did_not_write(config, tmp_path):
    out = tmp_path / "out"
    (out / "nprocs-1").mkdir(parents=True)
    (out / "nprocs-1" / "data.csv").write_text("1,2\n")
    args = parse(str(config), "--nprocs", "1,2", "--out", str(out), "--overwrite")
    with pytest.raises(ThriftyError, match="not written by thrifty scale"):
        scale.run_scale(args, runner=fake_runner({}, {}))
    assert (out / "nprocs-1" / "data.csv").exists()


def test_registering_the_command_does_not_import_torch():
    code = (
        "import argparse, sys; from thrifty.commands import scale; "
        "scale.register(argparse.ArgumentParser().add_subparsers()); "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------
# Bus bandwidth and the whole command


# the same measurement as test_scale_runs_one_and_two_processes_end_to_end's, of its model's
# gradients: slow
@pytest.mark.slow
def test_bus_bandwidth_of_two_gloo_processes_is_measured():
    gbs = measure_bus_bandwidth(2, 2**20, "gloo", timeout=60)
    assert math.isfinite(gbs) and gbs > 0


def test_bus_bandwidth_is_the_nccl_tests_bus_figure():
    # 1 GB in 1 s over 4 ranks: each link carries 2 × 3/4 of it.
    assert bus_gbs(1e9, 1.0, 4) == pytest.approx(1.5)


def test_scale_runs_one_and_two_processes_end_to_end(
    tmp_path, capsys, monkeypatch, with_scale_command
):
    # One thread per process at both counts: with cpus // N threads each (the default), a busy
    # 2-core machine can make the one-process baseline so slow that 2 processes look 2x better.
    # Run once, for the JSON: the table the same report prints has its own test above. The
    # command runs here; its runs and the bandwidth's ranks are processes of their own.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.chdir(ROOT)
    argv = ["scale", "examples/mlp.toml", "--nprocs", "1,2", "--steps", "6"]
    code = cli.main([*argv, "--out", str(tmp_path / "json"), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    report = json.loads(out)
    assert [c["processes"] for c in report["counts"]] == [1, 2]
    for count in report["counts"]:
        # measured on a shared machine: how each figure follows from the rates, not their size
        assert count["speedup"] > 0
        assert count["efficiency"] == pytest.approx(count["speedup"] / count["processes"])
        assert 0 < count["predicted_efficiency"] <= 1
    assert report["counts"][1]["strategy"] == "ddp"
    assert math.isfinite(report["counts"][1]["bus_gbs"]) and report["counts"][1]["bus_gbs"] > 0


def test_a_run_scale_started_dies_with_scale_even_by_sigkill(tmp_path):
    """`thrifty scale` killed outright (the OOM killer, a scheduler's SIGKILL to it alone)
    leaves no training running on: its child gets the kernel's SIGKILL too."""
    import os
    import signal
    import time

    pid_file = tmp_path / "child.pid"
    child = (
        f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    )
    parent = (
        "import sys; from pathlib import Path; from thrifty.children import launch; "
        f"launch([sys.executable, '-c', {child!r}], {{}}, Path({str(tmp_path / 'log')!r}))"
    )
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    pytest.fail("the child outlived the command that started it")
