"""A missing or wrong collator is one line naming collate_fn and the fix (exit code 2), before
the FLOP count, the loader's workers or the micro-batch search read the data: not a traceback
from inside torch's default_collate after a misleading FLOP line."""

from __future__ import annotations

import pytest

from test_cli import run_cli
from thrifty.data.collating import differing_shapes

PROJECT = """
import torch

class Ragged(torch.utils.data.Dataset):
    # Token sequences of 5 to 11 tokens, as a tokenizer returns them (no padding).
    def __len__(self):
        return 32

    def __getitem__(self, i):
        ids = torch.randint(0, 256, (5 + i % 7,))
        return {"input_ids": ids, "targets": ids}

def ragged():
    return Ragged()

def raises(samples):
    return {"input_ids": torch.stack([s["labels"] for s in samples])}

def renamed(samples):
    n = min(len(s["input_ids"]) for s in samples)
    return {"ids": torch.stack([s["input_ids"][:n] for s in samples])}

def truncated(samples):
    n = min(len(s["input_ids"]) for s in samples)
    return {k: torch.stack([s[k][:n] for s in samples]) for k in ("input_ids", "targets")}
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "collateproj.py").write_text(PROJECT)
    config = tmp_path / "job.toml"
    config.write_text(
        '[run]\nmax_steps = 2\nprogress = "off"\n[batch]\nmicro = 4\n[schedule]\n'
        'decay = "constant"\n[task]\nmodel = "thrifty.demo:build_model"\n'
        'train_data = "collateproj:ragged"\n'
        "model_args = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 16 }\n"
    )
    monkeypatch.chdir(tmp_path)
    return config


def train(capsys, config, tmp_path, *sets: str) -> tuple[int, str]:
    args = [a for s in sets for a in ("--set", s)]
    code, _, err = run_cli(capsys, "train", str(config), "--out", str(tmp_path / "r"), *args)
    return code, err


@pytest.mark.parametrize(
    "sets",
    [
        ("data.num_workers=auto",),  # the FLOP count, then the workers' measurement
        ("data.num_workers=auto", "measure.breakdown=false"),  # the workers' measurement
        (
            "batch.micro=auto",
            "batch.effective=8",
            "data.num_workers=0",
            "measure.breakdown=false",
        ),  # the search
        ("data.num_workers=0", "measure.breakdown=false"),  # the first step
    ],
    ids=["flops+workers", "workers", "micro-search", "first-step"],
)
def test_variable_length_samples_without_a_collator_are_one_line_naming_collate_fn(
    capsys, project, tmp_path, sets
):
    code, err = train(capsys, project, tmp_path, *sets)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err  # no FLOP line first, no traceback
    assert err.startswith(
        "thrifty: error: train_data's samples have different shapes (input_ids: (5,) in sample "
        "0, (6,) in sample 1, (7,) in sample 2) and no collate_fn pads them"
    ), err
    assert "give a collate_fn (in Python, collate_fn=...; in a config, [task] collate_fn" in err
    assert "DataCollatorWithPadding(tokenizer)" in err
    assert "DataCollatorForLanguageModeling(tokenizer, mlm=False)" in err


def test_a_collator_that_raises_is_one_line_naming_it(capsys, project, tmp_path):
    code, err = train(capsys, project, tmp_path, "task.collate_fn=collateproj:raises")
    assert code == 2, err
    assert err.strip() == (
        "thrifty: error: collate_fn (raises) raised KeyError: 'labels' on the first 4 samples "
        "of train_data: fix it so it returns the batch the model takes (a dict of tensors, a "
        "tuple or a tensor)"
    ), err


def test_a_collator_whose_batch_the_model_cannot_take_is_named(capsys, project, tmp_path):
    code, err = train(capsys, project, tmp_path, "task.collate_fn=collateproj:renamed")
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert "does not take the batch's keys ids as keyword arguments" in err
    assert err.strip().endswith("; the batch is what collate_fn (renamed) returned"), err


def test_a_collator_that_makes_equal_shapes_trains(capsys, project, tmp_path):
    code, err = train(capsys, project, tmp_path, "task.collate_fn=collateproj:truncated")
    assert code == 0, err


def test_differing_shapes_names_the_field_and_reads_lists_of_ids_by_length():
    import torch

    same = [{"input_ids": [1, 2, 3], "label": 0}, {"input_ids": [4, 5, 6], "label": 1}]
    assert differing_shapes(same) is None
    tokenized = [{"input_ids": [1, 2, 3], "label": 0}, {"input_ids": [4, 5], "label": 1}]
    assert differing_shapes(tokenized) == ("input_ids", "(3,) in sample 0, (2,) in sample 1")
    pairs = [(torch.zeros(3, 8), 0), (torch.zeros(3, 8), 1), (torch.zeros(3, 9), 1)]
    assert differing_shapes(pairs) == ("sample[0]", "(3, 8) in sample 0, (3, 9) in sample 2")
