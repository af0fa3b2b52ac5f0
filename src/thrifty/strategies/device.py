"""This process's device: `run.device` resolved, and a CUDA device made the current one."""

from __future__ import annotations

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
