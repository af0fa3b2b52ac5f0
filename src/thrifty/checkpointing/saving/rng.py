"""Every random number generator's state, as tensors and plain values a checkpoint can hold
(loaded with `weights_only=True`, so no numpy objects).

A process trains on one CUDA device, and only that device's generator decides its dropout
masks and random draws, so the state records which device it trained on ("cuda_device")
beside every visible device's generator. A resume on a machine of another shape (8 GPUs saved,
1 visible now: a smaller spot replacement, or a scheduler exposing one GPU per task) restores
the training device's generator onto the device used now, and stays bit-exact.
"""

from __future__ import annotations

import logging
import random
from typing import Any, cast

import numpy as np
import torch

log = logging.getLogger("thrifty")


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and every CUDA device's generator state, and the index of the
    CUDA device this process trains on (its current device; None without CUDA)."""
    # The global generator is MT19937, whose legacy state is this tuple (the stub also allows
    # the dict other bit generators give).
    legacy = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state())
    kind, keys, pos, has_gauss, cached = legacy
    version, internal, gauss = random.getstate()
    cuda = torch.cuda.is_available()
    return {
        "python": {
            "version": version,
            "state": torch.tensor(internal, dtype=torch.int64),
            "gauss": gauss,
        },
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if cuda else [],
        "cuda_device": torch.cuda.current_device() if cuda else None,
    }


def set_rng_state(state: dict[str, Any]) -> str | None:
    """Restore what `rng_state` captured, on this machine's devices.

    Returns None when the run continues bit for bit, or one line saying which CUDA generator
    states could not be restored and that the run is no longer bit-exact (also logged as a
    warning). Never raises for a different number of CUDA devices.
    """
    py = state["python"]
    random.setstate((py["version"], tuple(int(x) for x in py["state"].tolist()), py["gauss"]))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached"])
    )
    torch.set_rng_state(state["torch"])
    note = _set_cuda_rng_state(list(state.get("cuda") or []), state.get("cuda_device"))
    if note is not None:
        log.warning("%s", note)
    return note


def _set_cuda_rng_state(saved: list[torch.Tensor], saved_device: int | None) -> str | None:
    """Restore the CUDA generators; a line when what is restored is not all that mattered."""
    if not saved:
        return None  # trained without CUDA: nothing was drawn on a device
    here = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if here == 0:
        return _not_exact(len(saved), 0, "no CUDA device is visible here")
    common = min(here, len(saved))
    for index in range(common):  # the devices both machines have, as they were
        torch.cuda.set_rng_state(saved[index], index)
    if saved_device is not None and 0 <= saved_device < len(saved):
        # The only generator this process draws from is its training device's: put that one
        # on the device it trains on now, and the run stays bit-exact whatever the shape.
        current = torch.cuda.current_device()
        if current != saved_device or here != len(saved):
            torch.cuda.set_rng_state(saved[saved_device], current)
            log.info(
                "RNG: restored the CUDA generator of the training device (cuda:%d when saved, "
                "cuda:%d now); %d saved and %d visible devices otherwise",
                saved_device,
                current,
                len(saved),
                here,
            )
        return None
    if here == len(saved):
        return None
    # An older checkpoint, which does not say which device trained: by index only.
    return _not_exact(len(saved), common, f"{here} CUDA device(s) are visible here")


def _not_exact(saved: int, restored: int, why: str) -> str:
    return (
        f"RNG: the checkpoint holds {saved} CUDA generator state(s), {restored} restored "
        f"({why}); training goes on, but the run is no longer bit-exact"
    )


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's generators (every device's)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
