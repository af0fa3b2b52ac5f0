"""torch.compile as a lever: off, or one of its modes."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    """`model` compiled with `mode` ("default" is torch's own), or as it is with "off"."""
    if mode == "off":
        return model
    # torch.compile returns a callable wrapper typed as such; for a module it is an nn.Module.
    return cast(nn.Module, torch.compile(model, mode=None if mode == "default" else mode))
