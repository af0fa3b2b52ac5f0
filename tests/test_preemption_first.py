"""A preemption notice leaves 30 s (GCP, Azure) to 2 min (AWS): the emergency checkpoint comes
before an evaluation due at the same step, and the resumed run does that evaluation first, so
the run still matches one that was never interrupted."""

from __future__ import annotations

import torch

from test_resume import losses, train
from thrifty.rundir.files import read_metrics


def val_losses(out) -> dict[int, float]:
    return {
        r["step"]: r["val_loss"] for r in read_metrics(out / "metrics.jsonl") if "val_loss" in r
    }


def test_the_emergency_checkpoint_comes_before_a_due_evaluation(tmp_path):
    # eval.every = 5 and the notice arrives during step 5.
    _, first = train(tmp_path / "cut", at=5, steps=10)
    assert first.stop_reason == "preempted" and first.steps == 5
    assert 5 not in val_losses(tmp_path / "cut")  # put off, not paid for inside the notice
    assert (tmp_path / "cut" / "checkpoints" / "step-00000005").is_dir()

    reference, _ = train(tmp_path / "ref", steps=10)
    resumed, second = train(tmp_path / "cut", steps=10)
    assert second.stop_reason == "max_steps"
    assert val_losses(tmp_path / "cut") == val_losses(tmp_path / "ref")  # step 5's included
    assert losses(tmp_path / "cut") == losses(tmp_path / "ref")
    for a, b in zip(reference.state_dict().values(), resumed.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_a_run_preempted_at_its_last_step_resumes_to_its_evaluation_and_no_step_more(tmp_path):
    _, first = train(tmp_path / "cut", at=10, steps=10)
    assert first.stop_reason == "preempted" and first.steps == 10
    assert not (tmp_path / "cut" / "summary.json").exists()
    _, second = train(tmp_path / "cut", steps=10)
    assert second.steps == 10 and second.stop_reason == "max_steps"
    assert (tmp_path / "cut" / "summary.json").exists()
    reference_dir = tmp_path / "ref"
    train(reference_dir, steps=10)
    assert val_losses(tmp_path / "cut") == val_losses(reference_dir)
