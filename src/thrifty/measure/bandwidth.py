"""All-reduce bus bandwidth of local processes, measured the nccl-tests way.

`measure_bus_bandwidth` starts one child process per rank (`bus_worker`), each all-reducing the
same float32 buffer; the figure is the slowest rank's time turned into nccl-tests' bus bandwidth,
what a ring moves over each link, so it plugs straight into `thrifty.plan.scaling`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from thrifty.errors import ThriftyError

MAX_BUS_BYTES = 128 * 2**20  # bandwidth is flat long before this; bounds time and memory
BUS_TIMEOUT = 120.0  # seconds for one bandwidth measurement, process start-up included
_WORKER = "from thrifty.measure.bandwidth import bus_worker; bus_worker()"


def bus_gbs(nbytes: float, seconds: float, processes: int) -> float:
    """nccl-tests bus bandwidth of one all-reduce, GB/s per direction:
    bytes / seconds × 2(n-1)/n, what a ring moves over each link."""
    from thrifty.plan.scaling import ring_factor  # not at the top: every worker imports this

    return nbytes / seconds * ring_factor(processes) / 1e9


def measure_bus_bandwidth(
    processes: int, nbytes: int, backend: str = "gloo", timeout: float = BUS_TIMEOUT
) -> float:
    """All-reduce bus bandwidth of `processes` local processes in GB/s per direction, for a
    float32 buffer of `nbytes` bytes (capped at 128 MiB): the slowest rank's time, median of 3
    rounds of back-to-back all-reduces after a warm-up. gloo uses CPU tensors, nccl one GPU
    per process. Small buffers measure latency as much as bandwidth, as the real step does.
    Gives up after `timeout` seconds."""
    from thrifty.strategies.launcher import threads_per_process

    if processes < 2:
        raise ValueError("a bus bandwidth needs at least 2 processes")
    nbytes = max(4, min(int(nbytes), MAX_BUS_BYTES))
    iters = max(2, min(50, (32 * 2**20) // nbytes))
    env = dict(os.environ)
    if backend == "gloo" and "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = str(threads_per_process(processes))
    what = f"measuring the all-reduce bandwidth of {processes} {backend} processes"
    with tempfile.TemporaryDirectory(prefix="thrifty-bus-") as tmp:
        argv = [sys.executable, "-c", _WORKER, "RANK", str(processes), f"{tmp}/store", str(nbytes)]
        argv += [str(iters), backend]
        logs = [Path(tmp) / f"rank-{rank}.log" for rank in range(processes)]
        procs: list[subprocess.Popen[bytes]] = []
        killed = set()
        try:
            for rank, log in enumerate(logs):
                argv[3] = str(rank)
                with open(log, "w") as f:
                    procs.append(subprocess.Popen(argv, stdout=f, stderr=f, env=env))
            deadline = time.monotonic() + timeout
            # One rank that fails leaves the others waiting for it: stop at the first failure.
            while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
                if time.monotonic() > deadline:
                    raise ThriftyError(f"{what} took over {timeout:g} s: give --bus-gbs instead")
                time.sleep(0.05)
        finally:
            for rank, proc in enumerate(procs):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                    killed.add(rank)
        outputs = [log.read_text(errors="replace") for log in logs]
    for rank in sorted(range(processes), key=lambda r: r in killed):  # a real failure first
        proc, output = procs[rank], outputs[rank]
        if proc.returncode:
            tail = next((ln for ln in reversed(output.splitlines()) if ln.strip()), "(no output)")
            raise ThriftyError(
                f"{what} failed (exit {proc.returncode}): {tail.strip()}; give --bus-gbs instead"
            )
    result = [ln for ln in outputs[0].splitlines() if ln.startswith('{"seconds"')]
    return bus_gbs(nbytes, json.loads(result[-1])["seconds"], processes)


def bus_worker() -> None:
    """One rank of `measure_bus_bandwidth` (argv: rank world store bytes iters backend)."""
    rank, world, store, nbytes, iters, backend = sys.argv[1:7]
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    if cuda:
        torch.cuda.set_device(int(rank))
    dist.init_process_group(
        backend, init_method=f"file://{store}", rank=int(rank), world_size=int(world)
    )
    device = torch.device("cuda", int(rank)) if cuda else torch.device("cpu")
    buffer = torch.zeros(int(nbytes) // 4, dtype=torch.float32, device=device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    dist.all_reduce(buffer)  # warm-up: connections, buffers
    rounds = []
    for _ in range(3):
        dist.barrier()
        sync()
        start = time.perf_counter()
        for _ in range(int(iters)):
            dist.all_reduce(buffer)
        sync()
        rounds.append((time.perf_counter() - start) / int(iters))
    # The collective takes as long as its slowest rank.
    slowest = torch.tensor(rounds, dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == "0":
        print(json.dumps({"seconds": statistics.median(slowest.tolist())}), flush=True)
    dist.destroy_process_group()
