"""How a model is spread over processes: one strategy per variant, behind one interface
(`base.Strategy`): `single.py` (one process), `ddp.py` (a replica per rank), `fsdp.py`
(parameters, gradients and optimizer state sharded). `process_group.py` is the job's process
group and the host-side agreement the loop needs; `device.py` picks this process's device.
"""

from __future__ import annotations

from thrifty.strategies.base import Strategy
from thrifty.strategies.process_group import Distributed


def make_strategy(dist: Distributed) -> Strategy:
    """The strategy `distributed.strategy` names, for this process's place in the job."""
    from thrifty.strategies.ddp import DDP
    from thrifty.strategies.fsdp import FSDP
    from thrifty.strategies.single import SingleProcess

    kinds: dict[str, type[Strategy]] = {"single": SingleProcess, "ddp": DDP, "fsdp": FSDP}
    return kinds[dist.strategy](dist)


__all__ = ["Strategy", "make_strategy"]
