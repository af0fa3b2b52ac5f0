"""What agreeing at every step boundary costs a job of several processes.

With more than one process, the Trainer agrees twice per optimizer step, on its gloo control
group: before the window, whether every rank has one (two integers: its pass ended, its data
raised); after backward, one all-reduce of six integers (whether any rank ran out of memory,
the window's samples and tokens, and whether any rank is preempted, out of time or due a
checkpoint). Token-normalized windows add one more, of two integers, before backward. This
times them, as the Trainer calls them, in N local processes, and prints microseconds per step.

    python benchmarks/control_plane.py [--nprocs 2] [--steps 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank: int, world: int, port: int, steps: int, out: dict) -> None:
    from thrifty.strategies.process_group import Distributed

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    d = Distributed(
        strategy="ddp", rank=rank, world_size=world, backend="gloo", control=dist.group.WORLD
    )
    for _ in range(100):  # warm-up
        d.sum_ints([0, 64, 4096, 0, 0, 0])
    for name, calls in (("one", 1), ("tokens", 2)):
        rounds = []
        for _ in range(5):
            d.barrier()
            start = time.perf_counter()
            for _ in range(steps):
                d.sum_ints([0, 0])  # the window: every rank has one
                if calls == 2:
                    d.sum_ints([64, 4096])  # the window's tokens, before backward
                d.sum_ints([0, 64, 4096, 0, 0, 0])  # after backward
            rounds.append((time.perf_counter() - start) / steps)
        if rank == 0:
            out[name] = statistics.median(rounds) * 1e6
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(worker, args=(args.nprocs, port, args.steps, out), nprocs=args.nprocs)
    print(
        f"control plane, {args.nprocs} processes (gloo, loopback), median of 5 × {args.steps}: "
        f"{out['one']:.0f} µs per optimizer step; {out['tokens']:.0f} µs with token weights"
    )


if __name__ == "__main__":
    main()
