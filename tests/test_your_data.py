"""Your own data pipeline: a stream (IterableDataset), your DataLoader, your sampler or batch
sampler. Each resumes where it was after a SIGKILL, with the weights of a run never killed."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, Dataset, SequentialSampler, WeightedRandomSampler

from helpers import tiny_gpt, train_batches
from streams import Stream, window
from thrifty import TrainConfig, Trainer
from thrifty.cli import main
from thrifty.data import sources
from thrifty.errors import ThriftyError
from thrifty.records.state import TrainState

TESTS = Path(__file__).parent
MODEL = "{ n_layer = 1, n_head = 2, n_embd = 32, block_size = 32, dropout = 0.0 }"


def job(tmp_path: Path, train_data: str, *, steps: int = 10, workers: int = 0, **args) -> Path:
    config = tmp_path / "job.toml"
    data_args = ", ".join(f"{k} = {json.dumps(v)}" for k, v in args.items())
    config.write_text(
        f'[run]\nmax_steps = {steps}\nprogress = "off"\nseed = 3\n'
        "[batch]\nmicro = 4\neffective = 8\n"
        f"[data]\nnum_workers = {workers}\n"
        '[schedule]\ndecay = "constant"\n'
        '[checkpoint]\nevery = 2\n[spot]\nprovider = "none"\n[measure]\nbreakdown = false\n'
        f'[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "{train_data}"\n'
        f"model_args = {MODEL}\ndata_args = {{ {data_args} }}\n"
    )
    return config


def env() -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }


def train(config: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(out), *extra]


def kill_after_checkpoint(command: list[str], run: Path, step: int, timeout: float = 120) -> int:
    """SIGKILL the job's whole process group (workers too) once checkpoint `step` is
    published: nothing runs to save anything. Returns the last step published by then, which
    on a busy machine may be past `step`."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env(),
        text=True,
        start_new_session=True,
    )
    manifest = run / "checkpoints" / f"step-{step:08d}" / "manifest.json"
    try:
        deadline = time.monotonic() + timeout
        while not manifest.exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    published = (run / "checkpoints").glob("step-*/manifest.json")
    return max(int(manifest.parent.name.removeprefix("step-")) for manifest in published)


def final_model(run: Path) -> dict[str, torch.Tensor]:
    last = sorted((run / "checkpoints").glob("step-*/manifest.json"))[-1].parent
    return torch.load(last / "state.pt", weights_only=True, map_location="cpu")["model"]


def write_jsonl(folder: Path, files: int = 2, rows: int = 200) -> Path:
    """Local JSON lines for Hugging Face `datasets` to stream (no download)."""
    folder.mkdir()
    for f in range(files):
        with open(folder / f"part-{f}.jsonl", "w") as out:
            for r in range(rows):
                sample = window(f * rows + r)
                out.write(json.dumps({k: v.tolist() for k, v in sample.items()}) + "\n")
    return folder


@pytest.mark.parametrize(
    "train_data, workers, what",
    [
        ("streams:stream", 2, "a stream with state, 2 workers (StatefulDataLoader)"),
        ("streams:hf_stream", 0, "Hugging Face datasets, streaming"),
        ("streams:stateful_loader", 0, "your StatefulDataLoader, 2 workers"),
    ],
    ids=["stream", "hf", "loader"],
)
def test_a_pipeline_killed_mid_pass_resumes_to_the_same_weights(
    tmp_path, train_data, workers, what, capsys, caplog, monkeypatch
):
    # The kill is a real process's; the resume and the run never killed are the same command
    # run in this process, which already holds torch: what the kill left is what they meet.
    args = {"path": str(write_jsonl(tmp_path / "jsonl"))} if "hf" in train_data else {}
    config = job(tmp_path, train_data, workers=workers, **args)
    kill_after_checkpoint(train(config, tmp_path / "cut"), tmp_path / "cut", 4)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    caplog.set_level(logging.INFO)  # the log capture takes thrifty's lines
    assert main(train(config, tmp_path / "cut")[3:]) == 0, capsys.readouterr().err
    again = capsys.readouterr().err + caplog.text
    assert "resumed from step" in again
    assert "restarts" not in again  # the position was saved: nothing restarts
    assert main(train(config, tmp_path / "whole")[3:]) == 0, capsys.readouterr().err
    cut, ref = final_model(tmp_path / "cut"), final_model(tmp_path / "whole")
    assert all(torch.equal(cut[k], ref[k]) for k in ref), what


def run_in_process(tmp_path: Path, name: str, data: Any, steps: int, **kw) -> Trainer:
    config = TrainConfig.from_dict(
        {
            "run": {
                "max_steps": steps,
                "device": "cpu",
                "out": str(tmp_path / name),
                "progress": "off",
            },
            "batch": {"micro": 4, "effective": 8},
            "data": {"num_workers": kw.pop("workers", 0)},
            "schedule": {"decay": "constant"},
            "measure": {"breakdown": False},
        }
    )
    # Samplers come as factories: each run gets its own, seeded alike.
    kw = {k: v() if k.endswith("sampler") else v for k, v in kw.items()}
    trainer = Trainer(tiny_gpt(n_layer=1), data() if callable(data) else data, config, **kw)
    trainer.fit()
    return trainer


def resumed_equals_whole(tmp_path: Path, data: Any, **kw) -> bool:
    """Train 3 steps, continue the finished run to 6; against 6 steps in one go."""
    run_in_process(tmp_path, "cut", data, 3, **kw)
    cut = run_in_process(tmp_path, "cut", data, 6, **kw).model.state_dict()
    whole = run_in_process(tmp_path, "whole", data, 6, **kw).model.state_dict()
    return all(torch.equal(cut[k], whole[k]) for k in whole)


def test_a_stream_resumes_from_its_own_state_without_torchdata(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "stateful_loader_class", lambda: None)
    assert resumed_equals_whole(tmp_path, Stream)


class Windows(Dataset):
    """The streams' samples, indexable: for your sampler."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return window(i)


def test_your_weighted_sampler_replaces_the_shuffle_and_resumes_exactly(tmp_path):
    def sampler() -> WeightedRandomSampler:
        weights = torch.linspace(0.1, 1.0, 64)
        # 16 draws an epoch: the cut at step 3 falls in the second of three epochs.
        return WeightedRandomSampler(weights, 16, generator=torch.Generator().manual_seed(5))

    # The generator's state as the epoch began travels in the checkpoint; the resume skips
    # the indices already consumed.
    assert resumed_equals_whole(tmp_path, Windows, sampler=sampler)


class Recorded(nn.Module):
    """A model that records the first token of every sample it is fed (= the sample's id
    where `ids` built the data)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.seen: list[int] = []

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.seen += input_ids[:, 0].tolist()
        return (self.w * input_ids.float().mean()).sum()


class Ids(Dataset):
    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": torch.full((4,), i), "targets": torch.zeros(4, dtype=torch.long)}


def test_your_batch_sampler_is_the_order_trained_in(tmp_path):
    # Length bucketing, in spirit: batches the sampler composes, not thrifty's shuffle.
    batches = [[i, 63 - i, 2 * i % 64, 7] for i in range(16)]
    config = TrainConfig.from_dict(
        {
            "run": {"max_steps": 8, "device": "cpu", "out": str(tmp_path), "progress": "off"},
            "batch": {"micro": 4, "effective": 8},
            "data": {"num_workers": 0},
            "measure": {"breakdown": False},
        }
    )
    model = Recorded()
    Trainer(model, Ids(), config, batch_sampler=batches).fit()
    assert model.seen == [i for batch in batches for i in batch]


class Ints(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(1000))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_is_split_so_no_sample_is_seen_twice_in_a_pass(workers):
    config = TrainConfig.from_dict(
        {
            "run": {"max_steps": 10**6, "device": "cpu"},
            "batch": {"micro": 5, "effective": 10},
            "data": {"num_workers": workers},
        }
    )
    seen: list[int] = []
    for rank in (0, 1):  # what each of two ranks is fed
        batches = train_batches(Ints(), config, micro=5, world=2, rank=rank)
        progress = TrainState()
        for batch in batches.windows(progress):
            if progress.epoch > 0:
                break
            seen += batch[0].tolist()
            progress.batch_in_epoch += 1
        batches.close()
    assert sorted(seen) == list(range(1000))  # each sample once, over ranks and workers


def test_a_stream_that_cannot_say_where_it_is_says_so_as_the_run_starts(tmp_path, caplog):
    caplog.set_level("WARNING")
    run_in_process(tmp_path, "plain", lambda: Stream(stateful=False), 1)
    assert (
        "train_data is a stream whose position cannot be saved (it has no "
        "state_dict/load_state_dict (a Hugging Face IterableDataset has them)): a resumed run "
        "restarts the stream from its start"
    ) in caplog.text


def test_a_dataloader_without_state_says_so_and_is_used_as_is(tmp_path, caplog):
    caplog.set_level("WARNING")
    loader = torch.utils.data.DataLoader(Ids(), batch_size=4, shuffle=False)
    config = TrainConfig.from_dict(
        {
            "run": {"max_steps": 3, "device": "cpu", "out": str(tmp_path), "progress": "off"},
            "batch": {"micro": 4, "effective": 4},
            "measure": {"breakdown": False},
        }
    )
    model = Recorded()
    Trainer(model, loader, config).fit()
    assert model.seen == list(range(12))  # its order, its batches
    assert "train_data is a DataLoader without state_dict: a resumed run restarts" in caplog.text


# --- bad input: one line each ---------------------------------------------------------------


def one_line(tmp_path: Path, data: Any, name: str = "bad", steps: int = 2, **kw) -> str:
    with pytest.raises(ThriftyError) as error:
        run_in_process(tmp_path, name, data, steps, **kw)
    message = str(error.value)
    assert "\n" not in message
    return message


def test_a_stream_without_length_cannot_count_epochs(tmp_path):
    config = TrainConfig.from_dict(
        {
            "run": {"max_epochs": 2, "device": "cpu", "out": str(tmp_path)},
            "batch": {"micro": 4, "effective": 8},
        }
    )
    with pytest.raises(ThriftyError) as error:
        Trainer(tiny_gpt(n_layer=1), Stream(), config)
    assert str(error.value) == (
        "run.max_epochs = 2 needs the data's length and train_data has none (a stream without "
        "__len__): set run.max_steps, run.max_tokens or run.max_time instead"
    )


def test_a_sampler_needs_a_dataset_it_can_index(tmp_path):
    message = one_line(tmp_path, Stream, sampler=lambda: SequentialSampler(range(8)))
    assert message == (
        "a sampler needs a dataset it can index, and train_data is a stream (Stream): give the "
        "sampler a map-style Dataset (with __getitem__ and __len__)"
    )
    loader = torch.utils.data.DataLoader(Ids(), batch_size=4)
    message = one_line(tmp_path, loader, batch_sampler=lambda: BatchSampler(range(8), 4, True))
    assert message.startswith("a batch_sampler needs a dataset it can index, and train_data is")
    assert message.endswith("or build the DataLoader with it")


def test_a_source_that_raises_mid_run_stops_with_its_steps_saved_and_resumes(
    tmp_path, capsys, caplog
):
    # The stream's source goes away at sample 40: steps 1-5 (8 samples each) trained, 6 not.
    config = job(tmp_path, "streams:failing_stream")
    run = tmp_path / "run"
    failing = {**env(), "STREAM_FAIL_AT": "40"}
    failed = subprocess.run(train(config, run), capture_output=True, text=True, env=failing)
    assert failed.returncode == 1, failed.stderr
    last = failed.stderr.strip().splitlines()[-1]
    assert last == (
        "thrifty: error: the training data raised OSError: the bucket went away (503 Slow Down) "
        "after step 5, which is saved: fix the source and run the same command to resume there"
    )
    assert "Traceback" not in failed.stderr
    assert (run / "checkpoints" / "step-00000005" / "manifest.json").exists()
    # The source is back: the same command (run in this process) goes on from step 5.
    capsys.readouterr()
    caplog.set_level(logging.INFO)  # the log capture takes thrifty's lines
    code = main(train(config, run)[3:])
    err = capsys.readouterr().err + caplog.text
    assert code == 0, err
    assert "resumed from step 5" in err


def fed_to_ranks(data: Dataset, world: int, **order: Any) -> list[list[int]]:
    """The sample ids each of `world` ranks is fed in one pass, read through TrainBatches."""
    config = TrainConfig.from_dict(
        {
            "run": {"max_epochs": 1, "device": "cpu"},
            "batch": {"micro": 4, "effective": 4 * world},
            "data": {"num_workers": 0},
        }
    )
    fed = []
    for rank in range(world):
        batches = train_batches(
            data, config, world=world, rank=rank, **{k: v(rank) for k, v in order.items()}
        )
        fed.append(
            [i for w in batches.windows(TrainState()) for i in w[0]["input_ids"][:, 0].tolist()]
        )
    return fed


def test_your_sampler_is_shared_out_among_the_ranks():
    order = [(7 * i) % 64 for i in range(64)]  # a permutation of its own
    fed = fed_to_ranks(Ids(), 2, sampler=lambda rank: order)
    assert fed[0] == order[0::2] and fed[1] == order[1::2]


def test_a_sampler_that_shards_itself_is_taken_whole():
    from torch.utils.data import DistributedSampler

    def sampler(rank: int) -> DistributedSampler:
        return DistributedSampler(Ids(), num_replicas=2, rank=rank, shuffle=True, seed=1)

    fed = fed_to_ranks(Ids(), 2, sampler=sampler)
    assert fed[0] == list(sampler(0)) and fed[1] == list(sampler(1))
    config = TrainConfig.from_dict({"run": {"max_steps": 1, "device": "cpu"}})
    batches = train_batches(Ids(), config, world=2, sampler=sampler(0))
    assert batches.source.exact  # its order follows from (seed, epoch): nothing to warn of
    assert sorted(fed[0] + fed[1]) == list(range(64))


class Bucketed(torch.utils.data.Sampler[int]):
    """A sampler with state of its own (no torch generator to be found): it shuffles with
    Python's `random` seeded by (seed, epoch, draws so far), and says so in `state_dict`."""

    def __init__(self, n: int = 16, seed: int = 9) -> None:
        self.n, self.seed, self.draws = n, seed, 0

    def __iter__(self):
        import random

        order = list(range(self.n))
        random.Random(self.seed * 1000 + self.draws).shuffle(order)
        self.draws += 1
        return iter(order)

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"draws": self.draws}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.draws = state["draws"]


def test_a_sampler_with_state_dict_resumes_exactly(tmp_path):
    assert resumed_equals_whole(tmp_path, Windows, sampler=Bucketed)


def test_a_stream_saved_by_other_workers_is_refused_in_one_line(tmp_path):
    # Each worker held part of the stream's position: another split cannot continue it.
    run_in_process(tmp_path, "run", Stream, 3, workers=2)
    message = one_line(tmp_path, Stream, workers=0, name="run", steps=6)
    assert message == (
        "the checkpoint's data position was saved by a loader with 2 worker(s) and this one has "
        "0: each worker holds part of the stream's position; resume with data.num_workers = 2"
    )
