"""Small models and datasets shared by the tests."""

from __future__ import annotations

import torch

from thrifty.demo.model import GPT, GPTConfig


def tiny_gpt(dropout: float = 0.0, n_layer: int = 4, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(GPTConfig(n_layer=n_layer, n_head=2, n_embd=32, block_size=32, dropout=dropout))


class TokenDataset(torch.utils.data.Dataset):
    """Random byte windows; `pad` gives each sample a different number of real tokens."""

    def __init__(self, n: int = 64, block: int = 32, pad: bool = False, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randint(0, 256, (n, block + 1), generator=g)
        self.lengths = torch.randint(1, block + 1, (n,), generator=g) if pad else None

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"input_ids": self.x[i, :-1], "targets": self.x[i, 1:]}
        if self.lengths is not None:
            mask = torch.zeros(self.x.shape[1] - 1, dtype=torch.bool)
            mask[: self.lengths[i]] = True
            item["loss_mask"] = mask
        return item


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it was asked to apply."""

    def step(self, closure=None):  # type: ignore[override]
        self.seen = [p.grad.detach().clone() for g in self.param_groups for p in g["params"]]
        return super().step(closure)


class BurnDataset(torch.utils.data.Dataset):
    """Each item costs `ms` milliseconds of pure CPU work (think decoding and augmenting)."""

    def __init__(self, n: int = 256, ms: float = 4.0) -> None:
        self.n = n
        self.ms = ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        import time

        end = time.perf_counter() + self.ms / 1e3
        x = 0
        while time.perf_counter() < end:
            x += 1
        return torch.full((8,), float(i))


class VirtualClock:
    """Time that passes only when a workload says so, so a test can assert timings exactly.

    `now` is the wall clock, `cpu` the CPU time this process held: a neighbour that holds the
    core makes the wall clock run ahead of it (`advance(held, wall=...)`)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = 0.0

    def __call__(self) -> float:
        return self.now

    def cpu_time(self) -> float:
        return self.cpu

    def advance(self, held: float, wall: float | None = None) -> None:
        self.cpu += held
        self.now += held if wall is None else wall


def time_trainer_with(monkeypatch, clock: VirtualClock) -> None:
    """Make every Trainer in the test time its phases and intervals on `clock`."""
    from thrifty.measure import instruments
    from thrifty.measure.timing import CpuTimer

    monkeypatch.setattr(
        instruments,
        "make_timer",
        lambda *args, **kwargs: CpuTimer(clock, clock.cpu_time, threads=1),
    )


class _Cost(torch.autograd.Function):
    """Identity on the loss whose forward and backward advance a VirtualClock."""

    @staticmethod
    def forward(ctx, loss, clock, forward, backward, slowdown):  # type: ignore[override]
        clock.advance(forward, forward * slowdown)
        ctx.clock, ctx.backward, ctx.slowdown = clock, backward, slowdown
        return loss.view_as(loss)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        ctx.clock.advance(ctx.backward, ctx.backward * ctx.slowdown)
        return grad, None, None, None, None


class Costed(torch.nn.Module):
    """`model` (which returns its loss) costing `forward` and `backward` seconds of `clock`'s
    CPU time per call; `slowdown`: how much longer those take on the wall clock (a neighbour
    holding the core)."""

    def __init__(
        self,
        model: torch.nn.Module,
        clock: VirtualClock,
        forward: float,
        backward: float,
        slowdown: float = 1.0,
    ) -> None:
        super().__init__()
        self.model = model
        self.cost = (clock, forward, backward, slowdown)

    def forward(self, *args, **kwargs):
        return _Cost.apply(self.model(*args, **kwargs), *self.cost)


def wire_monitor(monkeypatch) -> list:
    """Drive every Trainer's monitor sync to sync, as the Trainer's loop is meant to: start it
    before training, pause it for each evaluation. Returns the monitors made."""
    from thrifty.measure import instruments
    from thrifty.measure.monitor import RunMonitor
    from thrifty.run import trainer

    monitors: list[RunMonitor] = []

    class Started(RunMonitor):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            monitors.append(self)
            self.start()

    evaluate = trainer.Trainer.evaluate

    def paused_evaluate(self):
        if monitors:
            monitors[-1].pause()
        try:
            return evaluate(self)
        finally:
            if monitors:
                monitors[-1].resume()

    monkeypatch.setattr(instruments, "RunMonitor", Started)
    monkeypatch.setattr(trainer.Trainer, "evaluate", paused_evaluate)
    return monitors


class AugmentedTokens(TokenDataset):
    """TokenDataset with random augmentation drawn in `__getitem__` from torch, `random` and
    NumPy: a roll, a reversal and one replaced token, different on every fetch."""

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        import random

        import numpy as np

        x = torch.roll(self.x[i], int(torch.randint(0, self.x.shape[1], ())))
        if random.random() < 0.5:
            x = x.flip(0)
        x[int(np.random.randint(0, len(x)))] = int(np.random.randint(0, 256))
        return {"input_ids": x[:-1], "targets": x[1:]}


def augmented_tokens(n: int = 40, block: int = 32) -> AugmentedTokens:
    """AugmentedTokens, as a `[task] train_data` factory for `thrifty train`."""
    return AugmentedTokens(n=n, block=block)


def stop_group_after(command: list[str], metrics, losses: int, env: dict, timeout: float = 120):
    """Run `command` in its own process group and SIGTERM the whole group (workers included, as
    Slurm, systemd and Kubernetes do) once `metrics` has logged `losses` steps. Returns the
    CompletedProcess (text stdout and stderr)."""
    import os
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not (metrics.exists() and metrics.read_text().count('"loss"') >= losses):
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.poll() is not None else "timeout"
            )
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def train_batches(data, config, *, micro: int = 4, world: int = 1, rank: int = 0, **order):
    """`TrainBatches` over `data` as a run of `config` builds them: `micro` samples a batch,
    no accumulation, `world` ranks of which this is `rank`; `order`: a sampler or batch_sampler."""
    from thrifty.data.batching import TrainBatches
    from thrifty.data.geometry import BatchGeometry
    from thrifty.records.stop_signals import parse_signals

    return TrainBatches(
        data,
        BatchGeometry(micro=micro, accumulation=1, effective=micro * world, world_size=world),
        torch.device("cpu"),
        None,
        loading=config.data,
        run=config.run,
        stop_signals=parse_signals(config.spot.signals),
        rank=rank,
        **order,
    )
