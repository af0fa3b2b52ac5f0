"""One process, the whole model: the base behaviour, nothing to wrap or synchronize."""

from __future__ import annotations

from thrifty.strategies.base import Strategy


class SingleProcess(Strategy):
    name = "single"
