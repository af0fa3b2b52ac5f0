"""`thrifty launch` never destroys a file it did not write.

`--overwrite` replaces a job file only while it begins with launch's marker line; the folder
that holds the shipped wheel is launch's only while its marker file is in it; a wheel that
SkyPilot's upload would leave out is refused before anything is submitted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.launch_sandbox import Sandbox
from thrifty.cli import main
from thrifty.fleet.files import FOLDER_MARKER, MARKER

REPO = Path(__file__).resolve().parents[2]
COST = ("--params", "1M", "--tokens", "1M")
SUFFIX = {"skypilot": ".sky.yaml", "slurm": ".sbatch"}


@pytest.fixture
def box(tmp_path, monkeypatch) -> Sandbox:
    """The demo project in the current directory, with stand-ins for sky and sbatch."""
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "examples" / "demo.toml", project / "demo.toml")
    monkeypatch.chdir(project)
    box = Sandbox(tmp_path, project)
    monkeypatch.setenv("PATH", os.pathsep.join([str(box.bin), "/usr/bin", "/bin"]))
    return box


def launch(capsys, engine: str, *args: str) -> tuple[int, str, str]:
    if engine == "skypilot":
        pytest.importorskip(
            "sky", reason="SkyPilot is not installed: pip install 'thrifty[skypilot]'"
        )
    code = main(["launch", "demo.toml", "--gpus", "H100:8", "--engine", engine, *COST, *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("engine", ["skypilot", "slurm"])
def test_overwrite_replaces_a_job_file_launch_wrote(box, capsys, engine):
    assert launch(capsys, engine)[0] == 0
    written = box.project / f"demo{SUFFIX[engine]}"
    assert MARKER in written.read_text().splitlines()[:2]
    code, _, err = launch(capsys, engine, "--overwrite", "--set", "run.name=second")
    assert code == 0, err
    assert "thrifty-second" in written.read_text()


@pytest.mark.parametrize("engine", ["skypilot", "slurm"])
@pytest.mark.parametrize(
    "mine",
    ["mine\n", "#!/bin/bash\n# my own job\nsrun train.sh\n", f"# {MARKER}\n", ""],
    ids=["text", "a script", "the marker quoted", "empty"],
)
def test_overwrite_never_replaces_a_file_launch_did_not_write(box, capsys, engine, mine):
    out = box.project / f"demo{SUFFIX[engine]}"
    out.write_text(mine)
    code, stdout, err = launch(capsys, engine, "--overwrite")
    assert code == 2 and stdout == ""
    assert err == (
        f"thrifty: error: {out.name} is a file thrifty did not write (it does not begin with "
        "thrifty launch's marker line): --overwrite replaces only a job file launch wrote; "
        "move it away or give another --out\n"
    )
    assert out.read_text() == mine
    assert box.calls("sky") == box.calls("sbatch") == []
    assert not (box.project / ".thrifty-launch").exists()


def test_out_through_a_link_is_refused_and_its_target_kept(box, capsys):
    target = box.root / "elsewhere.sbatch"
    target.write_text("mine\n")
    (box.project / "demo.sbatch").symlink_to(target)
    code, _, err = launch(capsys, "slurm", "--overwrite")
    assert code == 2
    assert err == "thrifty: error: --out demo.sbatch is a symbolic link: give the path of a file\n"
    assert target.read_text() == "mine\n"


@pytest.mark.parametrize("kind", ["a folder of the user's", "a file of the user's"])
def test_a_wheel_folder_launch_did_not_write_is_left_alone(box, capsys, kind):
    folder = box.project / ".thrifty-launch"
    if kind == "a file of the user's":
        folder.write_text("mine\n")
        found = "a file thrifty did not write: move it away"
    else:
        folder.mkdir()
        (folder / "notes.txt").write_text("mine\n")
        found = f"a folder thrifty did not write (it has no {FOLDER_MARKER} file): move it away"
    code, out, err = launch(capsys, "skypilot", "--bucket", "s3://b/run")
    assert code == 2 and out == ""
    assert err == (
        f"thrifty: error: .thrifty-launch is {found} (thrifty launch keeps the thrifty it "
        "ships to the machines in a folder of that name)\n"
    )
    assert sorted(p.name for p in box.project.iterdir()) == [".thrifty-launch", "demo.toml"]
    if folder.is_dir():
        assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    assert box.calls("sky") == []


def test_launchs_own_folder_gets_the_new_wheel_and_keeps_other_files(box, capsys):
    assert launch(capsys, "skypilot", "--bucket", "s3://b/run")[0] == 0
    folder = box.project / ".thrifty-launch"
    (wheel,) = folder.glob("*.whl")
    wheel.write_bytes(b"stale")
    (folder / "notes.txt").write_text("kept\n")
    assert launch(capsys, "skypilot", "--bucket", "s3://b/run", "--overwrite")[0] == 0
    assert wheel.read_bytes()[:2] == b"PK"
    assert (folder / "notes.txt").read_text() == "kept\n"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_wheel_skypilot_would_not_upload_is_refused_before_submitting(box, capsys):
    subprocess.run(["git", "init", "-q", str(box.project)], check=True)
    (box.project / ".gitignore").write_text(".thrifty-launch/\n")
    code, out, err = launch(capsys, "skypilot", "--bucket", "s3://b/run")
    assert code == 2 and out == ""
    assert err == (
        "thrifty: error: .thrifty-launch/thrifty-0.1.0-py3-none-any.whl, the thrifty the job "
        "installs, would not be uploaded: .gitignore leaves it out of SkyPilot's workdir; keep "
        ".thrifty-launch/ out of that file (SkyPilot reads .skyignore instead of .gitignore "
        "when there is one)\n"
    )
    assert sorted(p.name for p in box.project.iterdir()) == [".git", ".gitignore", "demo.toml"]
    assert box.calls("sky") == []
