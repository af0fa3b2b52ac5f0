"""The ranks of one job started by hand, as torchrun starts them on separate machines: a process
each, meeting by env:// rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), with no
launcher process above them (one process, and one torch import, fewer than `--nprocs`)."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path


def rank_envs(env: Mapping[str, str], world: int) -> list[dict[str, str]]:
    """The environment of each of `world` ranks, rank 0's first: `env`, the rank, and the
    rendezvous on a free local port, each rank as on a machine of its own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rendezvous = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world)}
    return [{**env, **rendezvous, "RANK": str(r), "LOCAL_RANK": "0"} for r in range(world)]


def run_ranks(
    command: list[str], env: Mapping[str, str], world: int, cwd: Path, timeout: float
) -> subprocess.CompletedProcess:
    """Run the job's `world` ranks to their end, bounded by `timeout` (a rank still running
    then is killed and the test fails). Returns the job's result: the first exit code that is
    not 0 (else 0), rank 0's stdout, and every rank's stderr, rank 0's first."""
    with contextlib.ExitStack() as stack:
        # Files, not pipes: a rank blocked on a full pipe would hold the others in a collective.
        outputs = [
            (
                stack.enter_context(tempfile.TemporaryFile("w+")),
                stack.enter_context(tempfile.TemporaryFile("w+")),
            )
            for _ in range(world)
        ]
        ranks = [
            subprocess.Popen(command, cwd=cwd, env=rank_env, stdout=out, stderr=err)
            for rank_env, (out, err) in zip(rank_envs(env, world), outputs, strict=True)
        ]
        deadline = time.monotonic() + timeout
        try:
            codes = [rank.wait(timeout=max(deadline - time.monotonic(), 0)) for rank in ranks]
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
                rank.wait()
        texts = []
        for out, err in outputs:
            out.seek(0)
            err.seek(0)
            texts.append((out.read(), err.read()))
    code = next((c for c in codes if c), 0)
    return subprocess.CompletedProcess(command, code, texts[0][0], "".join(e for _, e in texts))
