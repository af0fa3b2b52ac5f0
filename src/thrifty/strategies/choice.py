"""The strategy a job's config and process group call for."""

from __future__ import annotations

from thrifty.strategies.base import Strategy
from thrifty.strategies.ddp import DDP
from thrifty.strategies.fsdp import FSDP
from thrifty.strategies.process_group import Distributed
from thrifty.strategies.single import SingleProcess


def make_strategy(dist: Distributed) -> Strategy:
    """The strategy `distributed.strategy` names, for this process's place in the job."""
    kinds: dict[str, type[Strategy]] = {"single": SingleProcess, "ddp": DDP, "fsdp": FSDP}
    return kinds[dist.strategy](dist)
