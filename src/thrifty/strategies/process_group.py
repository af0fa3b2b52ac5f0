"""Running on PyTorch's own distributed engine: `torch.distributed`, launched by torchrun.

`init_distributed` reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK and the
rendezvous variables) and joins the process group; without that environment the run is one
process and nothing here costs anything. `Distributed` is what the Trainer asks of the other
ranks: the sums and agreements of each step boundary, work done on rank 0 only with its
outcome (or its error) shared, and a barrier before exit.

Two process groups: the data plane (NCCL on CUDA, gloo on CPU) carries gradients and losses;
a gloo control group carries the host-side decisions taken at every step boundary (token
counts, the preemption flag, budgets), so agreeing on them never waits on the GPU.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from thrifty.config import DistributedConfig, flatten_keys
from thrifty.errors import ConfigError, ThriftyError
from thrifty.strategies.timeouts import CollectiveTimeouts

log = logging.getLogger("thrifty")

T = TypeVar("T")

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class RankError(ThriftyError):
    """An error rank 0 reported and shared; the other ranks raise it too but do not print it."""

    reported_by_rank0 = True
    exit_code = 2  # as any ThriftyError; 0 when rank 0 found nothing to do (a finished run)


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def env_rank() -> int:
    """This process's rank from torchrun's environment (0 when not launched by it)."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


@dataclass
class Distributed:
    """This process's place in the job and the collectives the Trainer needs."""

    strategy: str = "single"  # single | ddp | fsdp
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    control: Any = None  # the gloo process group for host-side agreement
    owns_group: bool = False  # this process group was created by thrifty (and is ours to close)
    # How long a collective waits for a missing rank: long at start-up, short once steady.
    timeouts: CollectiveTimeouts = field(default_factory=CollectiveTimeouts)
    # Seconds blocked in host-side agreements so far: time spent waiting for the other ranks,
    # which a rank's own fetch time must not count (measure/stragglers.py).
    agreed_seconds: float = 0.0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> str:
        if not self.enabled:
            return "distributed: one process"
        return (
            f"distributed: {self.strategy} over {self.world_size} processes "
            f"({self.backend}; this is rank {self.rank})"
        )

    # --- host-side agreement (gloo control group; no GPU sync) ---------------------------------

    def sum_ints(self, values: list[int]) -> list[int]:
        """Each value summed over the ranks; the seconds it blocks add up in `agreed_seconds`."""
        if not self.enabled:
            return values
        t = torch.tensor(values, dtype=torch.int64)
        start = time.perf_counter()
        dist.all_reduce(t, group=self.control)
        self.agreed_seconds += time.perf_counter() - start
        return t.tolist()

    def any_of(self, *flags: bool) -> list[bool]:
        """For each flag: whether any rank raised it."""
        if not self.enabled:
            return list(flags)
        return [n > 0 for n in self.sum_ints([int(bool(f)) for f in flags])]

    def gather(self, value: T) -> list[T] | None:
        """Every rank's `value`, in rank order, on rank 0 (None elsewhere). Plain values only."""
        if not self.enabled:
            return [value]
        out: list[Any] | None = [None] * self.world_size if self.is_main else None
        dist.gather_object(value, out, dst=0, group=self.control)
        return out

    def all_gather(self, value: T) -> list[T]:
        if not self.enabled:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value, group=self.control)
        return out

    def on_main(self, fn: Callable[[], T]) -> T:
        """Run `fn` on rank 0 and give every rank its result; its error is raised everywhere.

        The error is raised on rank 0 as it was and on the other ranks as a `RankError` with
        the same words, so every rank exits and none waits in a collective that never comes.
        """
        if not self.enabled:
            return fn()
        payload: list[Any] = [None]
        error: BaseException | None = None
        if self.is_main:
            try:
                payload[0] = ("ok", fn())
            except ThriftyError as exc:
                error = exc
                # exit code 0 (a finished run: nothing to do) is shared too, not made an error
                payload[0] = ("error", str(exc), getattr(exc, "exit_code", None))
            except BaseException as exc:
                error = exc
                payload[0] = ("error", f"rank 0 failed: {type(exc).__name__}: {exc}")
        dist.broadcast_object_list(payload, src=0, group=self.control)
        if error is not None:
            raise error
        kind, value, *code = payload[0]
        if kind == "error":
            shared = RankError(value)
            if code and code[0] == 0:
                shared.exit_code = 0
            raise shared
        return value

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier(group=self.control)

    # --- data plane ----------------------------------------------------------------------------

    def mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average `tensor` over the ranks in place (asynchronous on the GPU stream)."""
        if self.enabled:
            dist.all_reduce(tensor)
            tensor /= self.world_size
        return tensor

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(tensor)
        return tensor

    def close(self) -> None:
        """Leave the process group if thrifty joined it."""
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False


# The process groups this process joined through init_distributed, each meeting under keys
# of its own (`_group_store`).
_groups_joined = 0


def init_distributed(config: DistributedConfig, device: str) -> tuple[Distributed, str]:
    """Join torchrun's process group (if launched by it); returns it and the device to use.

    `device` is `run.device`; under torchrun `auto` and `cuda` become this process's GPU,
    cuda:LOCAL_RANK. Raises ConfigError (on every rank alike) for a backend the device cannot
    run.
    """
    if dist.is_available() and dist.is_initialized():
        return _joined(config, device, owns=False)
    if not launched_by_torchrun() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        if config.strategy in ("ddp", "fsdp") and not launched_by_torchrun():
            log.info(
                "distributed.strategy = %s, but this process was not launched by torchrun: "
                "running as one process",
                config.strategy,
            )
        return Distributed(), device
    if not dist.is_available():
        raise ConfigError(
            "this torch build has no torch.distributed: install a build with it, or run one process"
        )
    local_rank = int(os.environ["LOCAL_RANK"])
    device = _device_for(device, local_rank)
    backend = _backend(config.backend, device)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    timeout = datetime.timedelta(seconds=config.timeout_seconds)
    store = _group_store(timeout)
    if store is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    return _joined(config, device, owns=True)


def _group_store(timeout: datetime.timedelta) -> Any:
    """The store this process group meets in, with keys of its own; None for the first group
    of a first attempt (torch's own). torchrun's workers share the agent's rendezvous store,
    and torch assumes each group gets a fresh one: its ranks publish their addresses under the
    same keys every time. A rank that reads a peer's address before the peer rewrote it
    connects to the peer's old group. A dead one, a worker group torchrun restarted
    (`--max-restarts`), times the join out. A live one, a group an earlier Trainer in this
    process left while something still holds it (an out-of-memory error's frames), takes the
    connection and never answers. A prefix per attempt (TORCHELASTIC_RESTART_COUNT) and per
    group this process joined keeps them apart: every rank of a job joins the same sequence."""
    global _groups_joined
    attempt, group = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"), _groups_joined
    _groups_joined += 1
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or (attempt, group) == ("0", 0):
        return None
    agent = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout
    )
    return dist.PrefixStore(
        f"thrifty/attempt_{attempt}" + (f"/group_{group}" if group else ""), agent
    )


def _joined(config: DistributedConfig, device: str, *, owns: bool) -> tuple[Distributed, str]:
    world = dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if world > 1:
        device = _device_for(device, local_rank)
    backend = dist.get_backend()
    if backend == "nccl" and not device.startswith("cuda"):
        raise ConfigError(
            f"the process group uses NCCL but run.device = {device!r}: NCCL needs CUDA devices; "
            "use gloo on CPU"
        )
    wait = datetime.timedelta(seconds=config.timeout_seconds)  # else gloo's default, 30 min
    control = (
        dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo", timeout=wait)
    )
    strategy = config.strategy
    if strategy == "auto":
        strategy = "ddp" if world > 1 else "single"
    if world == 1:
        strategy = "single"
    # A process group the caller made keeps the timeout the caller gave it.
    groups = [dist.group.WORLD] if control is dist.group.WORLD else [dist.group.WORLD, control]
    d = Distributed(
        strategy=strategy,
        rank=dist.get_rank(),
        world_size=world,
        local_rank=local_rank,
        backend=backend,
        control=control,
        owns_group=owns,
        timeouts=CollectiveTimeouts(config, groups if owns and world > 1 else []),
    )
    return d, device


def _device_for(device: str, local_rank: int) -> str:
    if device == "auto":
        return f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return f"cuda:{local_rank}"
    return device


def _backend(wanted: str, device: str) -> str:
    on_cuda = device.startswith("cuda")
    if wanted == "auto":
        return "nccl" if on_cuda else "gloo"
    if wanted == "nccl" and not on_cuda:
        raise ConfigError(
            f"distributed.backend = 'nccl' is invalid for run.device = {device!r}: NCCL runs only "
            "on CUDA devices; use distributed.backend = gloo (or auto) on CPU"
        )
    return wanted


def check_same_config(d: Distributed, config: Mapping[str, Any]) -> None:
    """Raise the same ConfigError on every rank when the ranks were given different configs."""
    if not d.enabled:
        return
    configs = d.all_gather(flatten_keys(config))
    reference = configs[0]
    for rank, other in enumerate(configs[1:], start=1):
        for key in sorted(set(reference) | set(other)):
            if reference.get(key) != other.get(key):
                raise ConfigError(
                    f"rank {rank} was started with another config than rank 0: {key} is "
                    f"{other.get(key)!r} there and {reference.get(key)!r} on rank 0; start every "
                    "rank with the same config file and --set options"
                )
