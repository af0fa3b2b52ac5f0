"""This process's device: `run.device` resolved, and a CUDA device made the current one; the
CPUs it may use and the processes beside it on its node."""

from __future__ import annotations

import os

import torch

from thrifty.errors import ConfigError


def resolve_device(name: str) -> torch.device:
    """`run.device` as a torch.device; a CUDA device becomes the current one, so streams,
    events, memory figures and NVML sampling all follow it (not cuda:0)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(
            f"run.device = {name!r} is invalid: not a device name; use auto, cpu, cuda or cuda:N"
        ) from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"run.device = {name!r} is invalid: use auto, cpu, cuda or cuda:N")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"run.device = {name!r} is invalid: no CUDA device is available; use cpu or auto"
            )
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"run.device = {name!r} is invalid: this process sees {count} CUDA device(s), "
                f"cuda:0 to cuda:{count - 1} (CUDA_VISIBLE_DEVICES renumbers them)"
            )
        device = torch.device(
            "cuda", torch.cuda.current_device() if device.index is None else device.index
        )
        torch.cuda.set_device(device)
    return device


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_world_size() -> int:
    """The processes of this job on this node: torchrun's LOCAL_WORLD_SIZE, 1 without it."""
    text = os.environ.get("LOCAL_WORLD_SIZE", "1")
    if not text.strip().isdigit() or int(text) < 1:
        raise ConfigError(
            f"LOCAL_WORLD_SIZE must be a positive integer (the processes on this node), "
            f"got {text!r}: unset it or launch with torchrun, which sets it"
        )
    return int(text)
