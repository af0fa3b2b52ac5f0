"""Data-loading costs, measured side by side in one process (rounds alternate, medians printed):

1. Reseeding (exact resume with random augmentation in workers): an epoch of the demo's byte
   windows — a cheap item, so the reseed is as large a share as it gets — through `build_loader`
   (each batch fetched with the generators seeded from seed, epoch, position; with 0 workers the
   training's generators put back after) against a plain DataLoader over the same sampler.
2. `num_workers = auto` on a CPU-heavy item: the fetch time per batch of each worker count.
3. Pinned memory with 0 workers (CUDA only): pinning each batch in the training loop, then a
   non-blocking copy, against a plain copy.

    python benchmarks/loading.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset

from thrifty.data.loading import LoaderSettings, build_loader, choose_num_workers
from thrifty.data.sampling import EpochSampler, sample_seed, seed_generators
from thrifty.demo import train_dataset

MICRO = 16


def epoch_seconds(loader: DataLoader, sampler: EpochSampler) -> float:
    sampler.set_epoch(1)
    start = time.perf_counter()
    batches = sum(1 for _ in loader)
    return (time.perf_counter() - start) / batches


def reseed_overhead(rounds: int, workers: int) -> None:
    data = train_dataset(block_size=128, max_bytes=400_000)
    sampler = EpochSampler(len(data), seed=0)
    settings = LoaderSettings(MICRO, workers, persistent_workers=workers > 0)
    seeded = build_loader(data, sampler, settings)
    plain = DataLoader(
        data,
        batch_size=MICRO,
        sampler=sampler,
        num_workers=workers,
        drop_last=True,
        persistent_workers=workers > 0,
    )
    times: dict[str, list[float]] = {"seeded": [], "plain": []}
    for _ in range(rounds):
        times["seeded"].append(epoch_seconds(seeded, sampler))
        times["plain"].append(epoch_seconds(plain, sampler))
    s, p = statistics.median(times["seeded"]), statistics.median(times["plain"])
    print(
        f"reseed per batch of {MICRO}, {workers} workers: {s * 1e3:.3f} ms/batch seeded vs "
        f"{p * 1e3:.3f} ms/batch plain — ratio {s / p:.3f}"
    )


def seeding_cost(calls: int = 20_000) -> None:
    start = time.perf_counter()
    for position in range(calls):
        seed_generators(sample_seed(0, 1, position))
    per_call = (time.perf_counter() - start) / calls
    print(f"seed_generators(sample_seed(...)): {per_call * 1e6:.1f} µs per batch")


class Burn(Dataset):
    """Each item costs about `ms` milliseconds of CPU (think decoding and augmenting)."""

    def __init__(self, ms: float = 4.0) -> None:
        self.ms = ms

    def __len__(self) -> int:
        return 256

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.perf_counter() + self.ms / 1e3
        while time.perf_counter() < end:
            pass
        return torch.full((8,), float(i))


def worker_speedup() -> None:
    choice = choose_num_workers(Burn(), LoaderSettings(batch_size=4))
    zero = choice.seconds_per_batch[0]
    chosen = choice.seconds_per_batch[choice.num_workers]
    print(f"auto workers on a 4 ms item: {choice.describe()}; speed-up {zero / chosen:.2f}x")


def pinning_in_the_loop(rounds: int) -> None:
    if not torch.cuda.is_available():
        print("pinned memory with 0 workers: skipped (no CUDA device)")
        return
    batch = torch.randn(MICRO, 3, 224, 224)
    times: dict[str, list[float]] = {"pin": [], "plain": []}
    for _ in range(rounds * 10):
        torch.cuda.synchronize()
        start = time.perf_counter()
        batch.pin_memory().to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        times["pin"].append(time.perf_counter() - start)
        start = time.perf_counter()
        batch.to("cuda")
        torch.cuda.synchronize()
        times["plain"].append(time.perf_counter() - start)
    pin, plain = statistics.median(times["pin"]), statistics.median(times["plain"])
    print(
        f"0 workers, a {batch.nbytes / 2**20:.0f} MiB batch: pin in the loop + copy "
        f"{pin * 1e3:.2f} ms vs plain copy {plain * 1e3:.2f} ms — ratio {pin / plain:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeding_cost()
    for workers in (0, 2):
        reseed_overhead(args.rounds, workers)
    worker_speedup()
    pinning_in_the_loop(args.rounds)


if __name__ == "__main__":
    main()
