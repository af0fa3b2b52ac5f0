"""`--storage sqlite:///PATH` naming a database that is not an Optuna study's (the user's own
tables, or a file that is no database) is refused in one line before any table is created:
the user's file is left byte for byte as it was. A new file, or a study's own database,
is taken."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from test_sweep import write_inputs
from test_sweep_input import one_line_error, sweep_args
from thrifty.search.sweep.study import open_storage


def users_database(path: Path) -> bytes:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        db.execute("INSERT INTO customers (name) VALUES ('Ada'), ('Grace')")
    db.close()
    return path.read_bytes()


def test_a_users_own_sqlite_database_is_refused_and_left_unchanged(tmp_path, capsys):
    config, space = write_inputs(tmp_path, steps=10)
    mine = tmp_path / "shop.db"
    before = users_database(mine)
    err = one_line_error(
        capsys,
        sweep_args(
            config, space, tmp_path / "out", "--storage", f"sqlite:///{mine}", "--trials", "1"
        ),
    )
    assert err == (
        f"thrifty: error: --storage sqlite:///{mine}: {mine} is another database (it holds the "
        "table 'customers', which is not an Optuna study's): a sweep never adds its tables to "
        "it; give a new file (or a study's database) to --storage"
    )
    assert mine.read_bytes() == before
    with sqlite3.connect(f"{mine.as_uri()}?mode=ro", uri=True) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"customers"}


def test_a_file_that_is_no_database_is_refused_and_left_unchanged(tmp_path, capsys):
    config, space = write_inputs(tmp_path, steps=10)
    notes = tmp_path / "notes.db"
    notes.write_text("my notes, not a database\n")
    err = one_line_error(
        capsys,
        sweep_args(
            config, space, tmp_path / "out", "--storage", f"sqlite:///{notes}", "--trials", "1"
        ),
    )
    assert f"{notes} is not a SQLite database" in err
    assert notes.read_text() == "my notes, not a database\n"


@pytest.mark.parametrize("existing", [False, True])
def test_a_new_file_or_a_studys_own_database_is_taken(tmp_path, existing):
    path = tmp_path / "study.db"
    if existing:
        open_storage(tmp_path, f"sqlite:///{path}")  # Optuna's tables, and nothing else
    storage = open_storage(tmp_path, f"sqlite:///{path}")
    assert storage.get_all_studies() == []
