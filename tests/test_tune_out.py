"""`thrifty tune --out DIR` never destroys what thrifty did not write: a folder holding anything
but a tune's own files is refused in one line naming what it found, --overwrite or not, and is
left byte for byte; --overwrite replaces an earlier tune's files only. A full disk under --out
is one line, and once there is space the same command finishes the tune."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from test_tune import CONFIG, FakeTrials, one_line_error
from thrifty import cli
from thrifty.search.tune import session
from thrifty.search.tune.session import make_plan, run_tune

TESTS = Path(__file__).resolve().parent
MINE = bytes(range(256)) * 4  # a user's file: every byte value, so any rewrite shows


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(CONFIG.format(model="dist_task:model"))
    return path


def earlier_tune(config: Path, out: Path) -> None:
    """A finished tune in `out` (trials that take time on a fake clock, each with a log)."""
    fake = FakeTrials()
    run_tune(
        make_plan(session.read_given(config), str(config), out=out, levers="micro"),
        fake,
        fake.clock,
    )
    for name in ("00-baseline", "01-micro"):
        (out / "trials" / name).mkdir(parents=True)
        (out / "trials" / name / "train.log").write_text(f"{name}'s output")


def tree(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_users_file_in_out_is_refused_by_name_and_kept_byte_for_byte(
    config, tmp_path, capsys, overwrite
):
    out = tmp_path / "tune"
    out.mkdir()
    (out / "notes.txt").write_bytes(MINE)
    line = one_line_error(capsys, ["tune", str(config), "--out", str(out), *overwrite])
    assert line.startswith(
        f"thrifty: error: --out {out} holds notes.txt, which thrifty tune did not write: choose "
        "a new or empty --out; a tune never deletes or replaces what it did not write"
    )
    assert ("--overwrite replaces an earlier tune's files only" in line) == bool(overwrite)
    assert tree(out) == {"notes.txt": MINE}


def test_overwrite_does_not_replace_an_earlier_tune_that_holds_a_users_file(
    config, tmp_path, capsys
):
    out = tmp_path / "tune"
    earlier_tune(config, out)
    (out / "trials" / "my-notes.md").write_bytes(MINE)
    (out / "plot.png").write_bytes(MINE)
    before = tree(out)
    line = one_line_error(capsys, ["tune", str(config), "--out", str(out), "--overwrite"])
    assert f"--out {out} holds plot.png and 1 more, which thrifty tune did not write" in line
    assert tree(out) == before  # the earlier tune's files too: nothing is half-replaced


@pytest.mark.parametrize("folder", ["trials", "workers"])
def test_a_file_in_trials_or_workers_is_named_with_its_folder(config, tmp_path, capsys, folder):
    out = tmp_path / "tune"
    (out / folder).mkdir(parents=True)
    (out / folder / "keep.txt").write_bytes(MINE)
    line = one_line_error(capsys, ["tune", str(config), "--out", str(out), "--overwrite"])
    assert f"--out {out} holds {folder}/keep.txt, which thrifty tune did not write" in line
    assert tree(out) == {f"{folder}/keep.txt": MINE}


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]], ids=["resume", "overwrite"])
def test_a_users_file_inside_a_trials_folder_is_refused_and_kept(
    config, tmp_path, capsys, overwrite
):
    out = tmp_path / "tune"
    earlier_tune(config, out)
    baseline = out / "trials" / "00-baseline"
    (baseline / "my_notes.txt").write_bytes(MINE)
    (baseline / "mydata").mkdir()
    (baseline / "mydata" / "file.csv").write_bytes(MINE)
    (out / "trials" / "01-micro" / "checkpoints").mkdir()
    (out / "trials" / "01-micro" / "checkpoints" / "best.pt").write_bytes(MINE)
    before = tree(out)
    line = one_line_error(capsys, ["tune", str(config), "--out", str(out), *overwrite])
    assert line.startswith(
        f"thrifty: error: --out {out} holds trials/00-baseline/my_notes.txt and 2 more, which "
        "thrifty tune did not write"
    )
    assert tree(out) == before


def test_an_unfinished_tune_of_another_search_is_not_replaced_without_overwrite(
    config, tmp_path, capsys
):
    out = tmp_path / "tune"
    out.mkdir()
    record = {"state": "stopped", "search_key": "another search", "trials": []}
    (out / "tune.json").write_text(json.dumps(record))
    line = one_line_error(capsys, ["tune", str(config), "--out", str(out)])
    assert line == (
        f"thrifty: error: --out {out} holds an unfinished tune of another search (another "
        "config, or other --steps, --levers or --micro): resume it with the command that "
        "started it, choose another --out, or replace it with --overwrite"
    )
    assert json.loads((out / "tune.json").read_text()) == record


# --------------------------------------------------------------------------------------------
# A full disk


DISK_KIB = 128  # room for a finished tune of two trials, each with its report.html, in 4 KiB blocks


@pytest.fixture
def small_disk(tmp_path: Path):
    """A tmpfs of DISK_KIB of its own (mounting needs root); unmounted after the test."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_KIB}k", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.decode().strip()}")
    yield disk
    if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def tune(capsys, config: Path, out: Path) -> tuple[int, str]:
    """The command run here (its trials are processes of their own): exit code and stderr."""
    argv = ["tune", str(config), "--levers", "micro", "--micro", "8", "--steps", "2"]
    code = cli.main([*argv, "--out", str(out)])  # an error it does not expect raises here
    return code, capsys.readouterr().err


@pytest.mark.parametrize("free_kib", [0, 12])
def test_a_full_disk_under_out_is_one_line_and_the_same_command_then_finishes(
    config, small_disk, free_kib, capsys, monkeypatch
):
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)  # the trials import dist_task
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * ((DISK_KIB - free_kib) * 1024))
    out = small_disk / "tune"
    code, err = tune(capsys, config, out)
    assert code == 1, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-1].startswith(f"thrifty: error: no space left on the disk holding --out {out}")
    assert lines[-1].endswith(
        "free some space, then run the same command again; the finished trials are kept"
    )
    assert [line for line in lines if line.startswith("thrifty: error:")] == [lines[-1]]

    filler.unlink()
    code, err = tune(capsys, config, out)
    assert code == 0, err
    assert json.loads((out / "tune.json").read_text())["state"] == "finished"


def test_a_second_tune_in_the_same_out_is_refused_while_the_first_holds_it(
    config, tmp_path, capsys
):
    fcntl = pytest.importorskip("fcntl")
    out = tmp_path / "tune"
    out.mkdir()
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # what a running tune holds
        line = one_line_error(capsys, ["tune", str(config), "--out", str(out)])
    finally:
        os.close(fd)
    assert line == (
        f"thrifty: error: another thrifty tune is writing to --out {out}: wait for it to end, "
        "or choose another --out"
    )
    assert list(out.iterdir()) == []
