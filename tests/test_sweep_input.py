"""Bad input to `thrifty sweep` is one line and exit code 2, before any trial runs; nothing a
sweep writes holds a secret."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_sweep import CONFIG, SPACE, write_inputs
from thrifty.cli import main
from thrifty.search.sweep.plan import make_sweep
from thrifty.search.sweep.results import BEST_TOML, write


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("thrifty: error: ")
    return err


def sweep_args(config: Path, space: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", str(config), "--space", str(space), "--out", str(out), *extra]


@pytest.mark.parametrize(
    ("space", "words"),
    [
        ('["optimizer.lrr"]\nlow = 0.1\nhigh = 1.0\n', "unknown key optimizer.lrr"),
        ('["optimizer.lr"]\nlow = 0.1\nhigh = 0.1\n', "is empty"),
        ('["optimizer.lr"]\nlow = 0.3\nhigh = 0.1\n', "is inverted"),
        ('["batch.micro"]\nchoices = [8, 12.5]\n', "batch.micro = 12.5 is invalid"),
        ('["optimizer.lr"\nlow = 1', "is not valid TOML"),
        (
            "lr = 0.1\n",
            'must be a table with low and high, or choices (quote the name, as in ["optimizer.lr"])',
        ),
        (
            "[lr]\nlow = 0.1\nhigh = 1.0\n",
            "is not a config key; use section.key, e.g. optimizer.lr",
        ),
    ],
)
def test_a_bad_space_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], space: str, words: str
) -> None:
    config, path = write_inputs(tmp_path, steps=20)
    path.write_text(space)
    err = one_line_error(capsys, sweep_args(config, path, tmp_path / "out"))
    assert words in err


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        (["--budget", "5m", "--set", "run.max_time=1h"], "less than one trial"),
        (["--budget", "$0"], "dollars above 0"),
        (["--budget", "soon"], "a time (90m, 2h) or dollars"),
        (
            [
                "--budget",
                "$5",
                "--set",
                "cost.usd_per_gpu_hour=0",
            ],
            "is invalid",
        ),
        (["--trials", "0"], "--trials 0 is invalid"),
        (["--workers", "0"], "--workers 0 is invalid"),
        (["--set", "run.out=elsewhere"], "remove run.out for a sweep"),
    ],
)
def test_bad_options_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], words: str
) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    err = one_line_error(capsys, sweep_args(config, space, tmp_path / "out", *extra))
    assert words in err


def test_a_dollar_budget_needs_a_price(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    config.write_text(config.read_text().replace("usd_per_gpu_hour = 3.6", ""))
    err = one_line_error(capsys, sweep_args(config, space, tmp_path / "out", "--budget", "$40"))
    assert "has no price: set cost.instance or cost.usd_per_gpu_hour" in err


def test_hyperband_needs_a_last_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    config.write_text(config.read_text().replace("max_steps = 20", 'max_time = "1h"'))
    err = one_line_error(capsys, sweep_args(config, space, tmp_path / "o", "--pruner", "hyperband"))
    assert "needs run.max_steps" in err


@pytest.mark.parametrize(
    "password", ["hunter2", "s3cr'et", 's3"cr et<x>'], ids=["plain", "quote", "others"]
)
def test_a_storage_that_cannot_be_reached_is_one_line_without_its_password(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], password: str
) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    url = f"postgresql+psycopg://sweeper:{password}@127.0.0.1:1/studies"
    err = one_line_error(capsys, sweep_args(config, space, tmp_path / "out", "--storage", url))
    assert "cannot open the study's database" in err and "127.0.0.1:1" in err
    assert password not in err and "s3cr" not in err and "sweeper" not in err


def test_a_study_made_from_another_config_or_space_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    out = tmp_path / "out"
    make_sweep(config, space, out, say=lambda _: None)  # the study exists; no trial ran
    config.write_text(config.read_text().replace("lr = 0.01", "lr = 0.02"))
    err = one_line_error(capsys, sweep_args(config, space, out))
    assert "was made from a different config or space" in err
    config.write_text(CONFIG.format(steps=20))
    space.write_text(SPACE.replace("0.3", "0.2"))
    err = one_line_error(capsys, sweep_args(config, space, out))
    assert "was made from a different config or space" in err


@pytest.mark.parametrize(
    "theirs", ["notes.txt", "workers/notes.txt", "workers/worker-0.log/x", "trials/0000.txt"]
)
def test_a_folder_holding_someone_elses_files_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], theirs: str
) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    out = tmp_path / "out"
    (out / theirs).parent.mkdir(parents=True)
    (out / theirs).write_text("mine")
    err = one_line_error(capsys, sweep_args(config, space, out))
    named = theirs if theirs.count("/") < 2 else theirs.rsplit("/", 1)[0]  # a folder: by name
    assert f"holds {named}, which thrifty sweep did not write" in err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [theirs]


def test_best_toml_and_the_study_hold_no_secret(tmp_path: Path) -> None:
    config, space = write_inputs(tmp_path, steps=20)
    config.write_text(config.read_text() + '\n[task.model_args]\napi_token = "s3cr3t-value"\n')
    out = tmp_path / "out"
    sweep = make_sweep(config, space, out, say=lambda _: None)
    trial = sweep.study.ask()
    params = sweep.space.suggest(trial)
    trial.report(0.5, 10)
    sweep.study.tell(trial, 0.5)
    write(sweep.study, out)
    best = (out / BEST_TOML).read_text()
    assert f"lr = {params['optimizer.lr']!r}" in best
    for path in out.rglob("*"):
        if path.is_file():
            assert b"s3cr3t-value" not in path.read_bytes(), path
