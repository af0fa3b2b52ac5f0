"""`thrifty plan isoflop` bounds its sizes and budgets before it builds anything: one line,
exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomli_w

from test_isoflop import CONFIG, KEY, isoflop


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(tomli_w.dumps(CONFIG))
    return path


@pytest.mark.parametrize(
    ("size", "flops", "words"),
    [
        ("8,16,1e300", "1e8", "sizes must be above 0 and at most 1e+09, got '1e300'"),
        ("8,16,24", "1e8,1e300", "--flops needs FLOP budgets above 0 and at most 1e+30"),
    ],
)
def test_sizes_and_budgets_out_of_range_are_one_line(capsys, config, tmp_path, size, flops, words):
    code, err = isoflop(
        capsys, config, tmp_path / "grid", "--size", f"{KEY}={size}", "--flops", flops, "--dry-run"
    )
    assert code == 2
    assert words in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1
