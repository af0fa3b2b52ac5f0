"""An FSDP run resumed with another optimizer (`--allow-config-change`): the model's shards are
read back and the new optimizer starts from nothing, instead of the load failing on the saved
optimizer's keys."""

from __future__ import annotations

import shutil

import pytest

from distributed.test_distributed import losses, newest_checkpoint, ok, train, write_config


def test_an_fsdp_resume_with_another_optimizer_keeps_the_model_and_starts_the_optimizer_anew(
    tmp_path,
):
    config = write_config(tmp_path, "fsdp", strategy="fsdp", steps=6, every=3)
    config.write_text(config.read_text().replace('optimizer = "dist_task:sgd"\n', ""))
    adamw = ("--set", "schedule.decay=constant", "--set", "optimizer.lr=0.01")
    out = tmp_path / "run"
    ok(train(config, out, *adamw, "--steps", "4", nprocs=2))
    first = losses(out)
    # As if preempted after step 3's save: step 4's checkpoint and the summary are gone.
    shutil.rmtree(newest_checkpoint(out))
    (out / "summary.json").unlink()
    sgd = (*adamw, "--set", "optimizer.name=sgd", "--allow-config-change")
    result = ok(train(config, out, *sgd, nprocs=2))
    assert "resumed from step 3" in result.stderr
    assert "optimizer.name 'adamw' → 'sgd'" in result.stderr
    resumed = losses(out)
    assert sorted(resumed) == list(range(1, 7))
    # Step 4's loss is the model after step 3, before the new optimizer's first step: read back
    # from the shards, it is the loss the first run had there.
    assert resumed[4] == pytest.approx(first[4], rel=1e-5)
