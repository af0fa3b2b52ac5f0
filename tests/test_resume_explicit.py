"""An explicit checkpoint.resume is never dropped: the same command relaunched resumes the
run's own newest save; a checkpoint named anew, in a run with saves of its own, is refused in
one line, or taken as asked with --overwrite (and another model's then refused)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import TokenDataset, tiny_gpt
from test_resume import SigtermAt, assert_same_weights, config, train
from thrifty import Trainer
from thrifty.config import TrainConfig
from thrifty.errors import ThriftyError
from thrifty.rundir.files import read_metrics


def own_steps(out) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))


def resumed_at(out) -> list[int]:
    return [r["step"] for r in read_metrics(out / "metrics.jsonl") if r.get("event") == "resumed"]


def overwriting(cfg: TrainConfig) -> TrainConfig:
    data = cfg.to_dict()
    return TrainConfig.from_dict({**data, "run": {**data["run"], "overwrite": True}})


def test_the_same_command_relaunched_resumes_the_runs_own_newest_save(tmp_path):
    train(tmp_path / "a", every=4)  # saves at 8 and 12 kept
    start = tmp_path / "a" / "checkpoints" / "step-00000008"
    settings = {"checkpoint": {"resume": str(start)}, "steps": 14}
    reference, _ = train(tmp_path / "ref", **settings)
    train(tmp_path / "b", at=3, **settings)  # preempted after a save past step 8
    own = max(own_steps(tmp_path / "b"))
    assert own > 8
    model, result = train(tmp_path / "b", **settings)  # the command repeated, resume and all
    assert result.steps == 14
    assert resumed_at(tmp_path / "b") == [8, own]
    assert_same_weights(model, reference)  # the weights went on from its own save


def test_a_newly_named_checkpoint_in_a_run_with_saves_of_its_own_is_refused(tmp_path):
    train(tmp_path / "a", every=4)
    other = tmp_path / "a" / "checkpoints" / "step-00000008"
    train(tmp_path / "b", at=10, every=3)  # resume = auto; saved at 3, 6, 9, then at 10
    before = (tmp_path / "b" / "metrics.jsonl").read_bytes()
    saves = own_steps(tmp_path / "b")
    assert saves[-1] > 8  # the old code took this one, silently, over the one named
    cfg = config(tmp_path / "b", checkpoint={"resume": str(other)}, every=3)
    with pytest.raises(ThriftyError) as caught:
        Trainer(SigtermAt(tiny_gpt(dropout=0.1), None), TokenDataset(n=40), cfg).fit()
    assert str(caught.value) == (
        f"checkpoint.resume changed from 'auto' to '{other}', and run directory "
        f"{tmp_path / 'b'} holds the run's own checkpoints at {tmp_path / 'b' / 'checkpoints'}: "
        f"to start from {other}, give another run directory (RunConfig(out=...)), or start this "
        "run over from it with RunConfig(overwrite=True); to continue this run, "
        "checkpoint.resume = auto"
    )
    assert (tmp_path / "b" / "metrics.jsonl").read_bytes() == before  # nothing touched
    assert own_steps(tmp_path / "b") == saves
    # As the line says: resume = auto goes on from the run's own newest save.
    _, result = train(tmp_path / "b", every=3)
    assert result.steps == 12 and resumed_at(tmp_path / "b") == [saves[-1]]


def test_overwrite_starts_the_run_over_from_the_checkpoint_named(tmp_path):
    torch.manual_seed(0)
    source, _ = train(tmp_path / "a", every=4, steps=8)  # its step-8 save holds these weights
    named = tmp_path / "a" / "checkpoints" / "step-00000008"
    train(tmp_path / "b", at=10, every=3)  # a run of its own, saved up to step 10
    cfg = overwriting(config(tmp_path / "b", checkpoint={"resume": str(named)}, steps=8))
    model = SigtermAt(tiny_gpt(dropout=0.1), None)
    result = Trainer(model, TokenDataset(n=40), cfg).fit()
    assert result.steps == 8
    assert resumed_at(tmp_path / "b") == [8]
    assert read_metrics(tmp_path / "b" / "metrics.jsonl")[0] == {"step": 8, "event": "resumed"}
    assert_same_weights(model, source)  # the named checkpoint's weights, not step 0's or 9's
    assert own_steps(tmp_path / "b") == [8]  # the run's earlier saves went with --overwrite


def test_a_checkpoint_of_the_runs_own_is_refused_with_overwrite_before_anything_is_deleted(
    tmp_path,
):
    train(tmp_path / "b", at=10, every=3)
    saves = own_steps(tmp_path / "b")
    own = tmp_path / "b" / "checkpoints" / f"step-{saves[0]:08d}"
    cfg = overwriting(config(tmp_path / "b", checkpoint={"resume": str(own)}, every=3))
    with pytest.raises(ThriftyError, match="is one of this run's own checkpoints, which"):
        Trainer(SigtermAt(tiny_gpt(dropout=0.1), None), TokenDataset(n=40), cfg).fit()
    assert own_steps(tmp_path / "b") == saves


def tiny_job(tmp_path, name: str, n_layer: int) -> str:
    config = tmp_path / f"{name}.toml"
    config.write_text(
        '[run]\nmax_steps = 3\nlog_every = 1\nprogress = "off"\n'
        '[batch]\nmicro = 4\n[data]\nnum_workers = 0\n[schedule]\ndecay = "constant"\n'
        '[checkpoint]\nevery = "off"\n[spot]\nprovider = "none"\n'
        '[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "thrifty.demo:train_dataset"\n'
        f"model_args = {{ n_layer = {n_layer}, n_head = 2, n_embd = 32, block_size = 32 }}\n"
        "data_args = { block_size = 32, max_bytes = 100000 }\n"
    )
    return str(config)


def test_thrifty_train_with_another_models_checkpoint_named_anew_says_so_in_one_line(
    tmp_path, capsys
):
    from thrifty.cli import main

    other = tmp_path / "other"
    assert main(["train", tiny_job(tmp_path, "other", 3), "--out", str(other),
                 "--set", "run.max_steps=2"]) == 0  # fmt: skip
    run = tmp_path / "run"
    job = tiny_job(tmp_path, "job", 2)
    assert main(["train", job, "--out", str(run)]) == 0
    (run / "summary.json").unlink()  # as if it had been stopped after its save at step 3
    before = (run / "metrics.jsonl").read_bytes()
    capsys.readouterr()
    named = other / "checkpoints" / "step-00000002"
    assert main(["train", job, "--out", str(run), "--resume", str(named)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (
        f"thrifty: error: checkpoint.resume changed from 'auto' to '{named}', and run "
        f"directory {run} holds the run's own checkpoints at {run / 'checkpoints'}: to start "
        f"from {named}, choose another --out, or start this run over from it with --overwrite "
        "(run.overwrite = true); to continue this run, --resume auto"
    )
    assert (run / "metrics.jsonl").read_bytes() == before and not (run / "summary.json").exists()
    # Taken as asked with --overwrite: another model's checkpoint is refused in one line.
    assert main(["train", job, "--out", str(run), "--resume", str(named), "--overwrite"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("thrifty: error: the config changes the ")
    assert "task.model_args.n_layer 3 → 2" in err[0]
    assert not (run / "summary.json").exists() and not own_steps(run)
    assert json.loads((other / "summary.json").read_text())["steps"] == 2  # untouched
