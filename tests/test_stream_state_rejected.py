"""A stream whose own `load_state_dict` rejects the position a checkpoint saved (a new version of
the pipeline, say): the resume ends in one line naming the data and the way out, the checkpoints
are kept, and the pipeline that wrote them resumes there."""

from __future__ import annotations

import logging
import subprocess

import pytest

from streams import Picky
from test_your_data import env, job, kill_after_checkpoint, one_line, run_in_process, train
from thrifty.cli import main
from thrifty.data import sources


def rejected(what: str, error: str) -> str:
    return (
        f"{what} rejected the checkpoint's data position ({error}): its load_state_dict does "
        "not take the state this run saved; resume with the data pipeline that wrote the "
        "checkpoint, or start the run over (--overwrite, run.overwrite = true)"
    )


@pytest.mark.parametrize(
    "workers, kind, error",
    [
        (2, "KeyError", "KeyError: 'offset'"),  # raised in a loader worker (StatefulDataLoader)
        (0, "ValueError", "ValueError: state format 1, this stream reads format 2"),
    ],
    ids=["in-a-worker", "in-the-main-process"],
)
def test_a_killed_run_whose_stream_rejects_its_state_says_so_in_one_line(
    tmp_path, capsys, caplog, workers, kind, error
):
    config = job(tmp_path, "streams:picky_stream", workers=workers)
    run = tmp_path / "run"
    last = kill_after_checkpoint(train(config, run), run, 4)
    refused = subprocess.run(
        train(config, run),
        capture_output=True,
        text=True,
        env={**env(), "STREAM_REJECTS": kind},
        timeout=120,  # the workers stop: the process does not wait for them at its exit
    )
    assert refused.returncode == 2, refused.stderr
    assert "Traceback" not in refused.stderr
    line = refused.stderr.strip().splitlines()[-1]
    assert line == "thrifty: error: " + rejected("train_data (Picky)", error)
    # Nothing was lost: the pipeline that wrote the checkpoint resumes from it.
    assert (run / "checkpoints" / f"step-{last:08d}" / "manifest.json").exists()
    capsys.readouterr()
    caplog.set_level(logging.INFO)  # the same command, in this process: its log captured
    code = main(train(config, run)[3:])
    err = capsys.readouterr().err + caplog.text
    assert code == 0, err
    assert f"resumed from step {last}" in err


def test_a_stream_restored_without_torchdata_rejects_in_one_line(tmp_path, monkeypatch):
    # No StatefulDataLoader: the stream's own state, restored by thrifty as the pass begins.
    monkeypatch.setattr(sources, "stateful_loader_class", lambda: None)
    run_in_process(tmp_path, "run", Picky, 3)
    monkeypatch.setenv("STREAM_REJECTS", "TypeError")
    message = one_line(tmp_path, Picky, name="run", steps=6)
    assert message == rejected("train_data (Picky)", "TypeError: 'int' object is not subscriptable")


def test_your_stateful_loader_over_a_stream_that_rejects_its_state_says_so(tmp_path, monkeypatch):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(Picky(), batch_size=4)

    run_in_process(tmp_path, "run", loader, 3)
    monkeypatch.setenv("STREAM_REJECTS", "KeyError")
    message = one_line(tmp_path, loader, name="run", steps=6)
    assert message == rejected("train_data (StatefulDataLoader over Picky)", "KeyError: 'offset'")
    monkeypatch.delenv("STREAM_REJECTS")
    assert run_in_process(tmp_path, "run", loader, 6).state.step == 6  # and it resumes
