"""Plan a job's cost before paying for it: catalog, estimate, memory, spot, Chinchilla, scaling.

Importing this package is cheap: it needs neither torch nor rich (tables are drawn by the
command line only).

    >>> from thrifty.plan import estimate, chinchilla, memory, checkpoint_interval
    >>> estimate(7e9, 140e9, instance="p4d.24xlarge").cost["on-demand"]  # USD
"""

from thrifty.plan.catalog import GPU, Catalog, Instance, load_catalog
from thrifty.plan.chinchilla import Allocation, budget_flops, chinchilla
from thrifty.plan.estimate import Estimate, ModelShape, estimate, training_flops
from thrifty.plan.levers import LeverInputs, LeverPlan, apply_levers
from thrifty.plan.memory import MemoryPlan, bytes_per_param, memory
from thrifty.plan.scaling import Scaling, allreduce_seconds, scaling
from thrifty.plan.spot import (
    CheckpointInterval,
    SpotPlan,
    checkpoint_interval,
    daly_interval,
    interruption_rate,
    spot_economics,
    young_interval,
)

__all__ = [
    "GPU",
    "Allocation",
    "Catalog",
    "CheckpointInterval",
    "Estimate",
    "Instance",
    "LeverInputs",
    "LeverPlan",
    "MemoryPlan",
    "ModelShape",
    "Scaling",
    "SpotPlan",
    "allreduce_seconds",
    "apply_levers",
    "budget_flops",
    "bytes_per_param",
    "checkpoint_interval",
    "chinchilla",
    "daly_interval",
    "estimate",
    "interruption_rate",
    "load_catalog",
    "memory",
    "scaling",
    "spot_economics",
    "training_flops",
    "young_interval",
]
