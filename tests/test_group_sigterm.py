"""A stop signal to the whole process group, DataLoader workers included: the run saves, exits 75
and resumes bit for bit."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from helpers import AugmentedTokens, TokenDataset, stop_group_after, tiny_gpt, train_batches
from thrifty.data.loading import IgnoreStopSignals, LoaderSettings, _blocked, build_loader
from thrifty.data.sampling import EpochSampler
from thrifty.errors import ConfigError
from thrifty.records.stop_signals import EXIT_PREEMPTED
from thrifty.rundir.files import read_metrics

TESTS = Path(__file__).parent


def job(tmp_path: Path, steps: int) -> Path:
    """`thrifty train` on a tiny GPT with dropout, fed by 2 workers that augment at random."""
    config = tmp_path / "job.toml"
    config.write_text(
        f'[run]\nmax_steps = {steps}\nlog_every = 1\nprogress = "off"\ndeterministic = true\n'
        '[batch]\nmicro = 4\n[data]\nnum_workers = 2\n[schedule]\ndecay = "constant"\n'
        '[checkpoint]\nevery = "off"\n[spot]\nprovider = "none"\n[measure]\nbreakdown = false\n'
        '[task]\nmodel = "thrifty.demo:build_model"\ntrain_data = "helpers:augmented_tokens"\n'
        "model_args = { n_layer = 2, n_head = 2, n_embd = 32, block_size = 32, dropout = 0.1 }\n"
    )
    return config


def final_state(run: Path) -> tuple[dict[str, torch.Tensor], dict[int, float]]:
    """The model in the run's last checkpoint, and the loss of every step logged."""
    last = sorted((run / "checkpoints").glob("step-*/manifest.json"))[-1].parent
    state = torch.load(last / "state.pt", weights_only=True, map_location="cpu")
    losses = {r["step"]: r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r}
    return state["model"], losses


def test_sigterm_to_the_process_group_saves_exits_75_and_resumes_bit_for_bit(
    tmp_path, capsys, caplog
):
    config = job(tmp_path, steps=40)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }

    def command(out: str) -> list[str]:
        return [sys.executable, "-m", "thrifty", "train", str(config), "--out", str(tmp_path / out)]

    cut = stop_group_after(command("cut"), tmp_path / "cut" / "metrics.jsonl", 3, env)
    assert cut.returncode == EXIT_PREEMPTED, cut.stderr
    assert "received SIGTERM: saving an emergency checkpoint" in cut.stderr
    assert "Traceback" not in cut.stderr and "DataLoader worker" not in cut.stderr
    saved = list((tmp_path / "cut" / "checkpoints").glob("step-*/manifest.json"))
    assert len(saved) == 1
    step = int(saved[0].parent.name.split("-")[1])
    assert 3 <= step < 40

    # The same command resumes, and the reference trains in one go: both in this process
    # (one thread, as the children), as what the stop left is what they meet.
    from thrifty.cli import main

    capsys.readouterr()
    caplog.set_level(logging.INFO)  # the log capture takes thrifty's lines
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    try:  # run.deterministic turns torch's switch on: the next tests find it as it was
        code = main(command("cut")[3:])
        again = capsys.readouterr().err + caplog.text
        assert code == 0, again
        assert f"resumed from step {step}" in again
        code = main(command("ref")[3:])
        assert code == 0, capsys.readouterr().err
    finally:
        torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)

    resumed, resumed_losses = final_state(tmp_path / "cut")
    reference, reference_losses = final_state(tmp_path / "ref")
    for name, tensor in reference.items():
        assert torch.equal(tensor, resumed[name]), name
    assert resumed_losses == reference_losses and len(reference_losses) == 40


class Pids(torch.utils.data.Dataset):
    """Each sample is (its index, the pid of the process that fetched it)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        time.sleep(0.002)
        return torch.tensor([i, os.getpid()])


def loader(data, workers: int = 2, **kw):
    sampler = EpochSampler(len(data), shuffle=False)
    return build_loader(data, sampler, LoaderSettings(4, workers, persistent_workers=False), **kw)


def test_workers_ignore_a_sigterm_sent_to_them_and_keep_serving():
    batches = iter(loader(Pids()))
    first = next(batches)
    for pid in set(first[:, 1].tolist()) - {os.getpid()}:
        os.kill(pid, signal.SIGTERM)
    rest = list(batches)
    indices = torch.cat([first, *rest])[:, 0].tolist()
    assert indices == list(range(64))  # every batch arrived: no worker died


def _record(worker_id: int) -> None:
    # The user's worker_init_fn, run after thrifty's: SIGTERM is ignored by then.
    ignored = signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    os.environ["THRIFTY_TEST_INIT"] = f"{worker_id}:{ignored}"


class InitSeen(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> str:
        return os.environ.get("THRIFTY_TEST_INIT", "")


def test_a_users_worker_init_fn_still_runs_after_the_signals_are_ignored():
    seen = {s for batch in loader(InitSeen(), worker_init_fn=_record) for s in batch}
    assert seen == {"0:True", "1:True"}


def _signal_self_then_ignore() -> None:
    os.kill(os.getpid(), signal.SIGTERM)  # arrives before the worker could ignore it
    IgnoreStopSignals()(0)


def test_a_stop_signal_before_the_worker_ignores_it_waits_and_is_discarded():
    fork = multiprocessing.get_context("fork")
    with _blocked((signal.SIGTERM,)):  # what the loader does while it starts workers
        held = fork.Process(target=_signal_self_then_ignore)
        held.start()
    held.join(30)
    unheld = fork.Process(target=_signal_self_then_ignore)
    unheld.start()
    unheld.join(30)
    assert held.exitcode == 0
    assert unheld.exitcode == -signal.SIGTERM  # without the block the worker would die


class DiesOf(torch.utils.data.Dataset):
    """A worker that dies of `sig` at sample 9 (SIGTERM: as one reached before it could ignore
    it; SIGKILL: as one the kernel's out-of-memory killer picked)."""

    def __init__(self, sig: int = signal.SIGTERM) -> None:
        self.sig = sig

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> int:
        if i == 9:
            if self.sig != signal.SIGKILL:
                signal.signal(self.sig, signal.SIG_DFL)
            os.kill(os.getpid(), self.sig)
            time.sleep(5)
        return i


def windows_of(data) -> tuple[list[list[int]], Any]:
    """The windows (one micro-batch of 4 each) thrifty hands the loop, with 2 workers, in order."""
    from thrifty.config import TrainConfig
    from thrifty.records.state import TrainState

    config = TrainConfig.from_dict(
        {
            "run": {"max_epochs": 1, "device": "cpu"},
            "batch": {"micro": 4, "effective": 4},
            "data": {"num_workers": 2, "shuffle": False, "persistent_workers": False},
        }
    )
    batches = train_batches(data, config)
    fetched = [w[0].tolist() for w in batches.windows(TrainState())]
    batches.close()
    return fetched, batches


def test_a_worker_killed_by_the_stop_signal_ends_the_windows_cleanly(caplog):
    caplog.set_level(logging.WARNING)
    fetched, batches = windows_of(DiesOf(signal.SIGTERM))  # neither handler nor loader raises
    # The batches before the lost one, in order (the dead worker may not have sent its last).
    assert fetched == [list(range(4 * b, 4 * b + 4)) for b in range(len(fetched))]
    assert len(fetched) <= 2
    # What the loss looks like depends on timing: "exited unexpectedly", or the worker's
    # socket reset while the main process read from it. The loop saves and stops on it.
    assert batches.error is not None
    assert "killed by signal: Terminated. The run goes on to save its checkpoint" in caplog.text


def test_a_worker_lost_without_a_stop_ends_the_windows_naming_the_loss():
    fetched, batches = windows_of(DiesOf(signal.SIGKILL))
    assert len(fetched) <= 2
    assert batches.error is not None and "DataLoader worker" in batches.error


def test_a_worker_lost_mid_read_is_named_a_lost_worker_not_an_error_of_the_data():
    """Where the worker dies while its batch is being read, the main process meets a reset
    connection on the worker's queue, not the loader's "DataLoader worker ... killed" message:
    which one comes first is timing. Both must name the lost worker."""
    from thrifty.config import TrainConfig
    from thrifty.records.state import TrainState

    config = TrainConfig.from_dict(
        {
            "run": {"max_epochs": 1, "device": "cpu"},
            "batch": {"micro": 4, "effective": 4},
            "data": {"num_workers": 2, "shuffle": False, "persistent_workers": False},
        }
    )
    batches = train_batches(list(range(32)), config)

    def reset(epoch, start):
        raise ConnectionResetError(104, "Connection reset by peer")
        yield  # a generator, as the source's begin is

    batches.source.begin = reset
    assert list(batches.windows(TrainState())) == []
    batches.close()
    assert "DataLoader worker was lost" in batches.error
    assert "ConnectionResetError" in batches.error and "data.num_workers" in batches.error


def test_a_signal_workers_cannot_ignore_is_refused_with_the_fix():
    with pytest.raises(ConfigError, match=r"stop signal SIGKILL \(9\) cannot be ignored by data-"):
        loader(TokenDataset(), stop_signals=(signal.SIGTERM, signal.SIGKILL))
    with pytest.raises(ConfigError, match="stop signal 'TERM' cannot be ignored"):
        loader(TokenDataset(), stop_signals=("TERM",))


class LostWithTheSignal(AugmentedTokens):
    """Once `metrics` has `after` losses, both workers stop serving, and a second later one
    sends SIGTERM to the main process — by then waiting for a batch — and both die of SIGTERM:
    workers the group's signal reached before they could ignore it."""

    def __init__(self, metrics: Path, after: int) -> None:
        super().__init__(n=40)
        self.metrics, self.after = metrics, after

    def __getitem__(self, i: int):
        late = self.metrics.exists() and self.metrics.read_text().count('"loss"') >= self.after
        if late and torch.utils.data.get_worker_info() is not None:
            time.sleep(1.0)  # the main process uses up the batches it has, then waits
            try:
                os.close(os.open(self.metrics.with_name("signalled"), os.O_CREAT | os.O_EXCL))
                os.kill(os.getppid(), signal.SIGTERM)  # one signal to the main process
            except FileExistsError:
                pass
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        return super().__getitem__(i)


def test_a_worker_lost_with_the_stop_signal_still_gets_the_run_saved_and_resumed_exactly(tmp_path):
    from test_resume import SigtermAt, config
    from thrifty import Trainer

    def train(out: Path, data):
        torch.manual_seed(0)
        model = SigtermAt(tiny_gpt(dropout=0.1), None)
        return model, Trainer(model, data, config(out, workers=2, steps=16)).fit()

    reference, _ = train(tmp_path / "ref", AugmentedTokens(n=40))
    _, first = train(tmp_path / "cut", LostWithTheSignal(tmp_path / "cut" / "metrics.jsonl", 4))
    assert first.stop_reason == "preempted" and 4 <= first.steps < 16
    resumed, second = train(tmp_path / "cut", AugmentedTokens(n=40))
    assert second.steps == 16
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, resumed.state_dict()[name]), name


LIVE_WORKERS_AT_EXIT = """
import sys
sys.path.insert(0, {tests!r})
from helpers import TokenDataset
from thrifty.data.loading import (LoaderSettings, build_loader)
from thrifty.data.sampling import (EpochSampler)

loader = build_loader(TokenDataset(n=64), EpochSampler(64, shuffle=False), LoaderSettings(4, 2))
batches = iter(loader)
next(batches)
print("live workers:", len(batches._workers), flush=True)
"""


def test_the_interpreter_exits_with_workers_that_ignore_sigterm_still_alive(tmp_path):
    # multiprocessing's exit hook stops daemon workers with SIGTERM, then waits for them: a
    # worker that ignores SIGTERM would hold the process forever (a notebook, a script that
    # keeps an iterator, a test that failed mid-run). thrifty stops them first.
    script = tmp_path / "exit.py"
    script.write_text(LIVE_WORKERS_AT_EXIT.format(tests=str(Path(__file__).parent)))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "live workers: 2" in proc.stdout


class Stuck(torch.utils.data.Dataset):
    """Item 4 onwards never comes: a worker busy with it cannot stop when asked."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        if i >= 4:
            time.sleep(600)
        return torch.tensor([i])


def test_a_worker_that_cannot_stop_is_killed_when_its_iterator_goes(tmp_path, monkeypatch):
    import gc

    # torch's waits for a worker at shutdown, 5 s each by default: the same steps, sooner.
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.5)
    loader = build_loader(Stuck(), EpochSampler(64, shuffle=False), LoaderSettings(4, 1))
    batches = iter(loader)
    next(batches)
    (worker,) = batches._workers
    del batches, loader  # the loader keeps a persistent iterator
    gc.collect()  # torch asks it to stop, then sends the SIGTERM it ignores; thrifty kills it
    worker.join(timeout=30)
    assert not worker.is_alive()
