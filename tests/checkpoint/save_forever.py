"""Child process for the SIGKILL tests: resume from the latest checkpoint, then save forever.

    python save_forever.py LOCATION [LOCAL_DIR]

Prints "ready" once it has resumed and published one more checkpoint; every tensor of step N is
filled with N.
"""

from __future__ import annotations

import sys

import torch

from thrifty.checkpointing.store import CheckpointManager


def main() -> None:
    location = sys.argv[1]
    local_dir = sys.argv[2] if len(sys.argv) > 2 else None
    manager = CheckpointManager(location, local_dir=local_dir, keep_last=2, retry_backoff=0.01)
    info = manager.latest()
    step = info.step + 1 if info is not None else 1
    first = step
    while True:
        value = float(step)
        state = {
            "step": step,
            "model": {"w": torch.full((1_000_000,), value), "b": torch.full((3,), value)},
            "optimizer": {"state": {0: {"exp_avg": torch.full((1_000_000,), value)}}, "lr": 0.1},
            "rng": torch.tensor([step], dtype=torch.int64),
            "extra": [step, "text", None, (True, 2.5)],
        }
        manager.save(step, state)
        if step == first:  # one new checkpoint is published: the parent may start its timer
            manager.wait()
            print("ready", flush=True)
        step += 1


if __name__ == "__main__":
    main()
