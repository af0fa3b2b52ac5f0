"""A damaged metrics.jsonl never blocks a resume: a line cut short by a kill or a full disk,
bad bytes, or a line that is not a record, anywhere in the file, is set aside in
metrics.jsonl.damaged with one warning line; every whole record is kept and the run goes on."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from helpers import TokenDataset, tiny_gpt
from test_resume import SigtermAt, config
from thrifty import Trainer
from thrifty.measure.resume_loss import lost_work_before_resume
from thrifty.rundir.files import read_metrics, truncate_metrics

DAMAGE = {
    "a-line-cut-short-at-the-end": (None, b'{"step": 6, "loss": 5.4, "grad_no'),
    "bad-bytes": (2, b'{"step": 2, "loss": 1.0, "note": "\xff\xfe"}'),
    "a-list": (3, b"[1, 2]"),
    "a-string": (1, b'"x"'),
    "a-number": (4, b"42"),
}


def fit(out: Path, at: int | None = None):
    torch.manual_seed(0)
    model = SigtermAt(tiny_gpt(n_layer=2), at)
    return Trainer(model, TokenDataset(n=40), config(out, steps=8)).fit()


@pytest.fixture(scope="module")
def preempted(tmp_path_factory) -> Path:
    """A run preempted at step 5 (its emergency checkpoint), to copy for each damage."""
    out = tmp_path_factory.mktemp("preempted") / "run"
    result = fit(out, at=5)
    assert result.stop_reason == "preempted" and result.steps == 5
    return out


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_a_damaged_metrics_log_is_set_aside_and_the_run_resumes(
    tmp_path, preempted, caplog, damage
):
    run = tmp_path / "run"
    shutil.copytree(preempted, run)
    metrics = run / "metrics.jsonl"
    whole = metrics.read_bytes().splitlines()
    after, bad = DAMAGE[damage]
    lines = whole + [bad] if after is None else [*whole[:after], bad, *whole[after:]]
    metrics.write_bytes(b"\n".join(lines) + (b"" if after is None else b"\n"))

    with caplog.at_level(logging.WARNING, logger="thrifty"):
        result = fit(run)

    assert result.steps == 8 and result.stop_reason == "max_steps"
    records = read_metrics(metrics)
    kept = [json.loads(line) for line in whole if json.loads(line)["step"] <= 5]
    assert records[: len(kept)] == kept  # every whole record up to the checkpoint, in order
    assert [r["step"] for r in records if "loss" in r] == list(range(1, 9))
    assert (run / "metrics.jsonl.damaged").read_bytes() == bad + b"\n"
    warnings = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert warnings == [
        f"{metrics} held 1 damaged line (cut short by a kill or a full disk, bad bytes, or not "
        f"a record): set aside in {run / 'metrics.jsonl.damaged'}; its {len(whole)} whole "
        "records are kept"
    ]


def test_truncating_keeps_the_bytes_of_whole_records_and_appends_the_damage(tmp_path):
    path = tmp_path / "metrics.jsonl"
    good = [b'{"step": 1, "loss": 2.0}', b'{"step": 2, "note": "\\u00e9t\\u00e9"}']
    path.write_bytes(b"\n".join([good[0], b"\xc3(", good[1], b'{"step": 3}', b'{"st']))
    (tmp_path / "metrics.jsonl.damaged").write_bytes(b"from an earlier resume\n")
    cut = truncate_metrics(path, 2)
    assert path.read_bytes() == b"\n".join(good) + b"\n"
    assert (tmp_path / "metrics.jsonl.damaged").read_bytes() == (
        b'from an earlier resume\n\xc3(\n{"st\n'
    )
    assert cut.damaged == 2 and [r["step"] for r in cut.records] == [1, 2, 3]


def test_lost_work_reads_past_bad_bytes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 4, "step_seconds": 0.5}\n\xff\xfe\n')
    assert lost_work_before_resume(path, 3).seconds == 0.5
