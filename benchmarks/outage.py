"""Training speed while the checkpoint bucket is gone: a 15 s outage against a healthy endpoint.

One training loop (an MLP with AdamW, checkpointing every few steps to S3) runs through three
windows of equal length, side by side in one run:
  * healthy: the S3 endpoint answers;
  * outage: every connection to it is dropped and new ones are refused;
  * healthy again (averaged with the first, so slow drift on a shared machine cancels out).
It prints the step rate of each window and the ratio outage / healthy, which should be at least
0.9: saves never wait for an upload, so an outage costs training nothing. After the outage it
waits for the newest checkpoint to reach the bucket and says whether it did.

The S3 API server (moto) and the relay that cuts it run in a child process on 127.0.0.1, so
that serving uploads does not compete with training for this process's interpreter.
Not a test: the figures depend on the machine.

    python benchmarks/outage.py [--window 15] [--every 2] [--size-mb 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from thrifty.checkpointing.store import CheckpointManager

RATIO_TARGET = 0.9
HELPERS = Path(__file__).resolve().parent.parent / "tests" / "checkpoint" / "s3_server.py"


def _s3_helpers():
    """tests/checkpoint/s3_server.py, loaded by path (a `checkpoint` module sits beside us)."""
    spec = importlib.util.spec_from_file_location("s3_server", HELPERS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def serve() -> None:
    """Child process: run the S3 server, print its endpoint, obey `cut`/`restore` on stdin."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    helpers = _s3_helpers()
    server = helpers.S3Server()
    server.create_bucket(helpers.BUCKET)
    print(server.endpoint, flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "cut":
            server.stop()
        elif command == "restore":
            server.start()
        print("ok", flush=True)
    server.close()


class Endpoint:
    """The child process serving S3, seen from the training process."""

    def __init__(self) -> None:
        self.child = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.child.stdout is not None
        self.url = self.child.stdout.readline().strip()

    def send(self, command: str) -> None:
        assert self.child.stdin is not None and self.child.stdout is not None
        self.child.stdin.write(command + "\n")
        self.child.stdin.flush()
        self.child.stdout.readline()

    def close(self) -> None:
        if self.child.stdin is not None:
            self.child.stdin.close()
        self.child.wait(timeout=30)


def model_of(size_mb: float) -> nn.Module:
    """An MLP whose weights plus AdamW's two moments take about `size_mb` MB."""
    width = int((size_mb * 1e6 / 12 / 4) ** 0.5)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(4)))


def train_window(
    seconds: float,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    manager: CheckpointManager,
    every: int,
) -> tuple[int, float]:
    """Train for `seconds`, saving every `every` steps; the last step and steps per second."""
    width = model[0].in_features
    x = torch.randn(256, width)
    start = time.perf_counter()
    done = 0
    while time.perf_counter() - start < seconds:
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        done += 1
        if step % every == 0:
            manager.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    return step, done / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=float, default=15.0, help="seconds per window")
    parser.add_argument("--every", type=int, default=2, help="checkpoint every N steps")
    parser.add_argument("--size-mb", type=float, default=20.0, help="checkpoint size")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    helpers = _s3_helpers()
    endpoint = Endpoint()
    model = model_of(args.size_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    # botocore's own retries stay on, as for a user: thrifty's deadline bounds them all.
    storage_options = {
        "key": "testing",
        "secret": helpers.FAKE_SECRET,
        "client_kwargs": {"endpoint_url": endpoint.url, "region_name": "us-east-1"},
    }
    rates: dict[str, float] = {}
    try:
        with tempfile.TemporaryDirectory() as staging:
            manager = CheckpointManager(
                f"s3://{helpers.BUCKET}/outage-benchmark",
                local_dir=staging,
                storage_options=storage_options,
                upload_deadline=60.0,
            )
            step, _ = train_window(3.0, 0, model, optimizer, manager, args.every)  # warm up
            step, rates["healthy"] = train_window(
                args.window, step, model, optimizer, manager, args.every
            )
            endpoint.send("cut")
            step, rates["outage"] = train_window(
                args.window, step, model, optimizer, manager, args.every
            )
            endpoint.send("restore")
            step, rates["healthy again"] = train_window(
                args.window, step, model, optimizer, manager, args.every
            )
            waited = time.perf_counter()
            uploaded = manager.close(timeout=90.0)
            waited = time.perf_counter() - waited
            status = manager.upload_status()
    finally:
        endpoint.close()
    healthy = (rates["healthy"] + rates["healthy again"]) / 2
    ratio = rates["outage"] / healthy
    print(
        f"checkpoint {args.size_mb:g} MB every {args.every} steps to S3 on loopback; "
        f"{args.window:g} s windows"
    )
    for name, rate in rates.items():
        print(f"  {name:<14} {rate:6.2f} steps/s")
    print(f"outage / healthy step rate: {ratio:.2f} (target >= {RATIO_TARGET})")
    print(
        f"newest checkpoint (step {status['newest_step']}) uploaded: {uploaded and status['uploaded']}"
        f" ({waited:.1f} s waited at the end)"
    )
    return 0 if ratio >= RATIO_TARGET and status["uploaded"] else 1


if __name__ == "__main__":
    sys.exit(main())
