"""`thrifty launch --sweep`: the study's name (--study, else run.name) names every node's
output folder, `runs/sweep-NAME`, so it is one plain path component or refused in one line
(exit 2) before any cost is printed or any job file written; and every value reaches the
node's command as one word, in the sbatch script as bash reads it and in the SkyPilot task as
YAML and then bash read it."""

from __future__ import annotations

import shlex

import pytest
import yaml

from fleet import test_launch_sweep
from fleet.test_launch_sweep import STORAGE, job_file, launch

project = test_launch_sweep.project  # the fixture

HOSTILE_SET = "run.name=a b; touch PWNED $(id) `id` 'q' \"d\"\nx"


@pytest.mark.parametrize(
    "study",
    [
        "../../../x",
        "-x",
        "--help",
        "a/b",
        "..",
        ".",
        "a b",
        "x;touch PWNED",
        "",
        "a\nb",
        "é",
        "x" * 129,
    ],
)
def test_a_study_name_that_is_not_one_plain_folder_is_refused_in_one_line(project, capsys, study):
    code, out, err = launch(
        capsys, "--sweep", "space.toml", "--storage", STORAGE, f"--study={study}", "--dry-run",
        "--engine", "slurm",
    )  # fmt: skip
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"thrifty: error: --study {study!r} is invalid for --sweep: "), err
    assert "1 to 128 letters, digits, '.', '_' or '-', not starting with '-'" in err
    assert out == ""  # nothing printed: no cost, no job file
    assert not list(project.glob("*.sbatch")) and not list(project.glob("*.sky.yaml"))


def test_a_run_name_that_cannot_name_the_study_is_refused_naming_run_name(project, capsys):
    code, out, err = launch(
        capsys, "--sweep", "space.toml", "--storage", STORAGE, "--set", "run.name=../../x",
        "--dry-run",
    )  # fmt: skip
    assert code == 2 and out == ""
    assert err.startswith(
        "thrifty: error: run.name '../../x' (the study's name) is invalid for --sweep: "
    )
    assert err.rstrip().endswith("; give --study NAME")


def node_command(script: str) -> list[str]:
    """The words of the sweep worker's command, as bash reads the script."""
    words = shlex.split(script.replace("\\\n", " "), comments=True)
    starts = [
        i for i in range(len(words)) if words[i : i + 4] == ["python", "-m", "thrifty", "sweep"]
    ]
    assert len(starts) == 1, words
    return words[starts[0] :]


def check_words(words: list[str], study: str) -> None:
    assert words[words.index("--study") + 1] == study
    assert words[words.index("--out") + 1] == f"runs/sweep-{study}"
    assert words[words.index("--space") + 1] == "space.toml"
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    assert HOSTILE_SET in sets


@pytest.mark.parametrize("study", ["lr.v2_a-b", "x..y", "_7"])
def test_every_value_reaches_the_sbatch_script_as_one_word(project, capsys, study):
    code, out, err = launch(
        capsys, "--sweep", "space.toml", "--storage", STORAGE, "--study", study, "--dry-run",
        "--engine", "slurm", "--set", HOSTILE_SET,
    )  # fmt: skip
    assert code == 0, err
    check_words(node_command(job_file(out)), study)


def test_every_value_reaches_the_skypilot_task_as_one_word(project, capsys):
    code, out, err = launch(
        capsys, "--sweep", "space.toml", "--storage", STORAGE, "--study", "lr.v2", "--dry-run",
        "--set", HOSTILE_SET,
    )  # fmt: skip
    assert code == 0, err
    task = yaml.safe_load(job_file(out))
    check_words(node_command(task["run"]), "lr.v2")
