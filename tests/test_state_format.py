"""A checkpoint's state carries the number of its layout, and a state written before the
number (version 1: no scheduler kind, guard, epoch order or accumulation recorded) still
resumes, on the same trajectory as the run that was never interrupted."""

from __future__ import annotations

import logging

import pytest
import torch

from helpers import TokenDataset, tiny_gpt
from test_resume import SigtermAt, config, losses
from thrifty import Trainer
from thrifty.checkpointing.saving.state_format import STATE_VERSION, upgrade_state
from thrifty.checkpointing.store import CheckpointManager, load_checkpoint
from thrifty.errors import ThriftyError

# The keys a version-1 state may lack: written only by later versions.
LATER_KEYS = ("state_version", "scheduler_kind", "guard", "shuffle", "accumulation")


def run(out, **kw):
    torch.manual_seed(0)
    model = SigtermAt(tiny_gpt(dropout=0.1), None)
    cfg = config(out, **kw)
    return Trainer(model, TokenDataset(n=40), cfg, val_data=TokenDataset(n=8, seed=1)).fit()


def test_a_checkpoint_saved_without_the_format_version_still_resumes_bit_for_bit(tmp_path, caplog):
    run(tmp_path / "ref", every=4)  # checkpoints at 4, 8, 12; 8 and 12 kept
    folder = tmp_path / "ref" / "checkpoints" / "step-00000008"
    state = load_checkpoint(str(folder))
    assert state["state_version"] == STATE_VERSION == 2

    # The same state as the thrifty before the version number wrote it.
    old = {k: v for k, v in state.items() if k not in LATER_KEYS}
    store = CheckpointManager(str(tmp_path / "old"))
    store.save(8, old)
    store.close()
    with caplog.at_level(logging.WARNING, logger="thrifty"):
        result = run(
            tmp_path / "resumed", checkpoint={"resume": str(tmp_path / "old" / "step-00000008")}
        )
    assert result.steps == 12 and result.stop_reason == "max_steps"
    reference = losses(tmp_path / "ref")
    assert losses(tmp_path / "resumed") == {s: reference[s] for s in range(9, 13)}
    # Version 1 recorded no epoch order: the one before feistel, which the log names.
    assert any("another epoch order (randperm" in r.getMessage() for r in caplog.records)


def test_a_state_of_a_newer_layout_is_refused_with_the_versions_this_thrifty_reads():
    with pytest.raises(
        ThriftyError, match="layout version 3 and this thrifty reads versions 1 to 2"
    ):
        upgrade_state({"state_version": 3}, accumulation=1)
