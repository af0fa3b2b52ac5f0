"""Training stall per checkpoint: thrifty's asynchronous save vs a plain synchronous torch.save.

For two training states of at least 200 MB (weights plus AdamW's two moments), side by side in
one run, each round times:
  * a plain `torch.save(state, path)`: training is stalled for all of it;
  * `CheckpointManager.save()`: training is stalled only for the copy to host memory; the write
    (fsync, sha256, manifest) runs in the background and is timed separately.
The two states differ in their tensor sizes, which decide how fast the host copy runs:
  * "lm": a GPT-style model (vocab 32000, width 768): most bytes sit in the embedding and its
    moments (98 MB each), as in language models;
  * "uniform": tensors of 8 MB only, as in a deep stack of narrow layers. Copies this small run
    below the C library's non-temporal-store threshold and are the slower case.
It also measures the disk's raw sequential write speed (fsync'd), the background save throughput
and the resume throughput (find and sha256-check the newest checkpoint, then torch.load).
Not a test: the figures depend on the machine.

    python benchmarks/checkpoint.py [--size-mb 300] [--rounds 7] [--device auto|cpu|cuda]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import torch

from thrifty.checkpointing.store import CheckpointManager

MB = 1_000_000
STALL_RATIO_LIMIT = 0.25
BYTES_PER_PARAM = 12  # fp32 weight + exp_avg + exp_avg_sq


def adamw_state(params: dict[str, torch.Tensor]) -> dict[str, Any]:
    moments = {
        i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(p), "exp_avg_sq": p.abs()}
        for i, p in enumerate(params.values())
    }
    groups = [{"lr": 3e-4, "betas": (0.9, 0.95), "params": list(range(len(params)))}]
    return {"model": params, "optimizer": {"state": moments, "param_groups": groups}}


def lm_state(size_mb: int, device: str, vocab: int = 32000, width: int = 768) -> dict[str, Any]:
    """A GPT-style model with enough blocks for the state to reach `size_mb` MB."""
    per_block = 12 * width * width
    layers = max(1, math.ceil((size_mb * MB / BYTES_PER_PARAM - vocab * width) / per_block))
    shapes: dict[str, tuple[int, ...]] = {"wte": (vocab, width)}
    for i in range(layers):
        shapes |= {
            f"h.{i}.ln_1": (width,),
            f"h.{i}.attn.qkv": (3 * width, width),
            f"h.{i}.attn.proj": (width, width),
            f"h.{i}.ln_2": (width,),
            f"h.{i}.mlp.fc": (4 * width, width),
            f"h.{i}.mlp.proj": (width, 4 * width),
        }
    return adamw_state({name: torch.randn(s, device=device) for name, s in shapes.items()})


def uniform_state(size_mb: int, device: str) -> dict[str, Any]:
    """Weights of 8 MB each (and their moments): at least `size_mb` MB in total."""
    n = max(1, math.ceil(size_mb / 24))
    return adamw_state(
        {f"layer{i}.weight": torch.randn(2_000_000, device=device) for i in range(n)}
    )


def state_bytes(state: object) -> int:
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 0


def touch(state: dict[str, Any]) -> None:
    """An in-place update of every tensor: the optimizer step between two checkpoints."""
    with torch.no_grad():
        for i, p in enumerate(state["model"].values()):
            moments = state["optimizer"]["state"][i]
            moments["exp_avg"].mul_(0.9).add_(p, alpha=0.1)
            moments["exp_avg_sq"].mul_(0.95)
            p.add_(moments["exp_avg"], alpha=-1e-3)
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def raw_write_mb_s(folder: str, size: int) -> float:
    """Sequential write of `size` bytes in 16 MB blocks, fsync'd: the disk's speed in MB/s."""
    block = os.urandom(16 * MB)
    path = os.path.join(folder, "raw.bin")
    start = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(max(1, size // len(block))):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    elapsed = time.perf_counter() - start
    os.remove(path)
    return size / MB / elapsed


@dataclass
class Figures:
    """Seconds, except `nbytes`."""

    nbytes: int
    sync_stalls: list[float]
    async_stalls: list[float]
    first_stall: float
    save_seconds: float
    resume_seconds: float

    @property
    def ratio(self) -> float:
        # Best of N, as timeit does: the least disturbed round of each kind on a shared machine.
        return min(self.async_stalls) / min(self.sync_stalls)

    @property
    def median_ratio(self) -> float:
        return statistics.median(self.async_stalls) / statistics.median(self.sync_stalls)


def run(state: dict[str, Any], rounds: int, folder: str) -> Figures:
    sync_path = os.path.join(folder, "sync.pt")
    manager = CheckpointManager(os.path.join(folder, "ckpt"), keep_last=2)

    def sync_round() -> float:
        touch(state)
        start = time.perf_counter()
        torch.save(state, sync_path)
        stall = time.perf_counter() - start
        os.remove(sync_path)
        return stall

    def async_round(step: int) -> tuple[float, float]:
        touch(state)
        manager.save(step, state)
        stall = manager.last_stall_seconds
        manager.wait()
        return stall, manager.last_save_seconds

    # Round 0 allocates the host buffers that later rounds reuse; it is reported on its own.
    first_stall, _ = async_round(0)
    sync_stalls, async_stalls, async_saves = [], [], []
    for step in range(1, rounds + 1):
        # Side by side, one of each per round: each kind runs right after the other one.
        sync_stalls.append(sync_round())
        stall, save = async_round(step)
        async_stalls.append(stall)
        async_saves.append(save)
    start = time.perf_counter()
    info = manager.latest()  # finds and verifies (sha256) the newest checkpoint
    assert info is not None
    manager.load(info)
    resume_seconds = time.perf_counter() - start
    manager.close()
    return Figures(
        state_bytes(state),
        sync_stalls,
        async_stalls,
        first_stall,
        statistics.median(async_saves),
        resume_seconds,
    )


def _ms(values: list[float]) -> str:
    return f"{min(values) * 1e3:.0f} ms ({statistics.median(values) * 1e3:.0f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=300, help="least state size in MB (>= 200)")
    parser.add_argument("--rounds", type=int, default=7, help="timed saves of each kind")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--dir", default=None, help="folder on the disk to measure (default: tmp)")
    args = parser.parse_args(argv)
    if args.size_mb < 200:
        parser.error("--size-mb must be at least 200")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    results: dict[str, Figures] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        raw = raw_write_mb_s(folder, args.size_mb * MB)
        for name, make in (("lm", lm_state), ("uniform", uniform_state)):
            results[name] = run(make(args.size_mb, device), args.rounds, folder)

    def row(label: str, cell: Any) -> tuple[str, ...]:
        return (label, *(cell(f) for f in results.values()))

    rows = [
        ("", *results),
        row("state size (MB)", lambda f: f"{f.nbytes / MB:.0f} on {device}"),
        row("stall, plain torch.save", lambda f: _ms(f.sync_stalls)),
        row("stall, thrifty async save", lambda f: _ms(f.async_stalls)),
        row("stall ratio async / sync", lambda f: f"{f.ratio:.3f} ({f.median_ratio:.3f})"),
        row("stall, first async save (allocates)", lambda f: f"{f.first_stall * 1e3:.0f} ms"),
        row("background save (write+fsync+sha256)", lambda f: f"{f.save_seconds:.2f} s"),
        row("save throughput (MB/s)", lambda f: f"{f.nbytes / MB / f.save_seconds:.0f}"),
        row("resume throughput (MB/s)", lambda f: f"{f.nbytes / MB / f.resume_seconds:.0f}"),
        ("disk raw sequential write (MB/s)", f"{raw:.0f}", ""),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"{args.rounds} rounds of each kind; times are best of the rounds (median)")
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip())
    # The verdict is on the language-model state; the uniform one is printed as the slow case.
    ok = results["lm"].ratio <= STALL_RATIO_LIMIT
    print(
        f"stall ratio of the lm state {'within' if ok else 'ABOVE'} the limit of "
        f"{STALL_RATIO_LIMIT} (uniform 8 MB tensors: {results['uniform'].ratio:.3f})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
