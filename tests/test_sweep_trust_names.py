"""A sweep's names on the console are shown as written: a study (by default the --out folder's
name) or a parameter holding rich markup (`[/]`, `[red]`, `sweep[lr]`), a newline or an
escape sequence neither breaks the table after the trials are spent nor reaches the terminal
raw."""

from __future__ import annotations

from pathlib import Path

import test_sweep
from test_sweep import CONFIG, sweep_command

here = test_sweep.here  # the fixture

NAME = "a[/]b [red]c sweep[lr]\nd\x1b[31me"
SHOWN = "a[/]b [red]c sweep[lr]\\nd\\x1b[31me"  # as the table's title and the best line print it
FOLDER = "[red]c sweep[lr]\nd\x1b[31me"  # --out's name, in the best line's command
FOLDER_SHOWN = "[red]c sweep[lr]\\nd\\x1b[31me"
NOTE = "[bold]x[/bold]\x1b]0;pwned\x07"
NOTE_SHOWN = "[bold]x[/bold]\\x1b]0;pwned\\x07"


def inputs(tmp_path: Path) -> tuple[Path, Path]:
    text = CONFIG.format(steps=10).replace(
        'model = "dist_task:model"', 'model = "sweep_trust_task:model"'
    )
    text = text.replace("[task]\n", '[task]\nmodel_args = { note = "" }\n')
    config, space = tmp_path / "base.toml", tmp_path / "space.toml"
    config.write_text(text)
    escaped = NOTE.replace("\x1b", "\\u001b").replace("\x07", "\\u0007")
    space.write_text(f'["task.model_args.note"]\nchoices = ["{escaped}"]\n')
    return config, space


def test_a_study_and_a_parameter_with_markup_and_escapes_print_as_written(tmp_path: Path, here):
    config, space = inputs(tmp_path)
    out = tmp_path / "one" / FOLDER
    code, stdout, stderr = here(sweep_command(config, space, out, "--trials", "1", "--study", NAME))
    assert code == 0, stderr
    assert "\x1b" not in stdout and "\x07" not in stdout and "\x1b" not in stderr
    assert f"thrifty sweep: {SHOWN}" in stdout  # the table's title, whole
    best = next(line for line in stdout.splitlines() if line.startswith("best: trial 0"))
    assert f"(task.model_args.note={NOTE_SHOWN})" in best
    assert f"/one/{FOLDER_SHOWN}/best.toml'` runs it" in best, best


def test_the_default_study_name_is_the_out_folders_shown_as_written(tmp_path: Path, here):
    config, space = inputs(tmp_path)
    code, stdout, stderr = here(sweep_command(config, space, tmp_path / FOLDER, "--trials", "1"))
    assert code == 0, stderr
    assert f"thrifty sweep: {FOLDER_SHOWN}" in stdout and "\x1b" not in stdout
